"""AReaL's ``SFTTrainer`` (``areal.trainer.sft_trainer`` at areal-project/AReaL cbff54d6) over
this package's SFT trainer (:class:`areal_m2po.trainer.sft_trainer.SFTTrainer`)::

    with SFTTrainer(config, train_dataset=train, valid_dataset=valid) as trainer:
        trainer.train()

``config`` comes from ``load_expr_config(argv, SFTConfig)``; the data sets hold AReaL's
tokenized rows, ``input_ids`` and ``loss_mask`` (1 on the tokens learnt), as
``get_custom_dataset`` makes them for ``type: sft`` (:mod:`.supervised`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from areal_m2po.api.cli_args import SFTConfig
from areal_m2po.areal.trainer.supervised import ArealSupervisedTrainer, given_items
from areal_m2po.trainer.sft_trainer import SFTTrainer as _PackageSFTTrainer

__all__ = ["SFTTrainer", "to_examples"]


def to_examples(rows: Iterable[dict[str, Any]] | None, name: str) -> list[dict[str, Any]]:
    """This trainer's SFT examples of AReaL's tokenized rows (the first token never a target).

    Raises:
        ValueError: one line naming the row: no ``input_ids``/``loss_mask`` of one length, or
            no token to learn.
    """
    out = []
    for i, row in enumerate(rows or ()):
        where = f"{name} row {i}"
        ids, mask = row.get("input_ids"), row.get("loss_mask")
        if ids is None or mask is None or len(ids) != len(mask):
            raise ValueError(f"{where}: needs input_ids and loss_mask of one length")
        loss = [bool(m) for m in mask]
        loss[0] = False
        if not any(loss):
            raise ValueError(f"{where}: no token with loss_mask 1 after the first")
        out.append({"input_ids": [int(t) for t in ids], "loss_mask": loss, "where": where})
    return out


class SFTTrainer(ArealSupervisedTrainer):
    """AReaL's SFT trainer (see the module doc)."""

    config_cls = SFTConfig
    package_trainer = given_items(_PackageSFTTrainer)
    convert = staticmethod(to_examples)
