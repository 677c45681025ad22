"""AReaL's ``DPOTrainer`` (``areal.trainer.dpo_trainer`` at areal-project/AReaL cbff54d6) over
this package's DPO trainer (:class:`areal_m2po.trainer.dpo_trainer.DPOTrainer`), on AReaL's
tokenized preference rows: ``chosen_ids`` / ``rejected_ids`` with ``chosen_loss_mask`` /
``rejected_loss_mask`` (1 on the response tokens) (:mod:`.supervised`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from areal_m2po.api.cli_args import DPOConfig
from areal_m2po.areal.trainer.sft_trainer import to_examples
from areal_m2po.areal.trainer.supervised import ArealSupervisedTrainer, given_items
from areal_m2po.trainer.dpo_trainer import DPOTrainer as _PackageDPOTrainer

__all__ = ["DPOTrainer", "to_dpo_pairs"]


def to_dpo_pairs(rows: Iterable[dict[str, Any]] | None, name: str) -> list[dict[str, Any]]:
    """This trainer's DPO pairs of AReaL's rows.

    Raises:
        ValueError: one line naming the row: a side without ids and mask of one length, or
            with no response token.
    """
    out = []
    for i, row in enumerate(rows or ()):
        where = f"{name} row {i}"
        sides = {}
        for side in ("chosen", "rejected"):
            example = {
                "input_ids": row.get(f"{side}_ids"),
                "loss_mask": row.get(f"{side}_loss_mask"),
            }
            (sides[side],) = to_examples([example], f"{where} {side}")
            del sides[side]["where"]
        out.append({**sides, "where": where})
    return out


class DPOTrainer(ArealSupervisedTrainer):
    """AReaL's DPO trainer (see the module doc)."""

    config_cls = DPOConfig
    package_trainer = given_items(_PackageDPOTrainer)
    convert = staticmethod(to_dpo_pairs)
