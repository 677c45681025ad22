"""AReaL's ``RWTrainer`` (``areal.trainer.rw_trainer`` at areal-project/AReaL cbff54d6) over
this package's reward-model trainer (:class:`areal_m2po.trainer.rw_trainer.RWTrainer`), on
AReaL's tokenized preference rows ``chosen_ids`` / ``rejected_ids`` (:mod:`.supervised`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from areal_m2po.api.cli_args import RWConfig
from areal_m2po.areal.trainer.supervised import ArealSupervisedTrainer, given_items
from areal_m2po.trainer.rw_trainer import RWTrainer as _PackageRWTrainer

__all__ = ["RWTrainer", "to_pairs"]


def to_pairs(rows: Iterable[dict[str, Any]] | None, name: str) -> list[dict[str, Any]]:
    """This trainer's reward-model pairs of AReaL's rows.

    Raises:
        ValueError: one line naming the row without non-empty ``chosen_ids``/``rejected_ids``.
    """
    out = []
    for i, row in enumerate(rows or ()):
        where = f"{name} row {i}"
        chosen, rejected = row.get("chosen_ids"), row.get("rejected_ids")
        if not chosen or not rejected:
            raise ValueError(f"{where}: needs non-empty chosen_ids and rejected_ids")
        out.append(
            {
                "chosen_ids": [int(t) for t in chosen],
                "rejected_ids": [int(t) for t in rejected],
                "where": where,
            }
        )
    return out


class RWTrainer(ArealSupervisedTrainer):
    """AReaL's reward-model trainer (see the module doc)."""

    config_cls = RWConfig
    package_trainer = given_items(_PackageRWTrainer)
    convert = staticmethod(to_pairs)
