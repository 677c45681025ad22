"""AReaL's ``SFTTrainer`` (``areal.trainer.sft_trainer`` at areal-project/AReaL cbff54d6) over
this package's SFT trainer (:class:`areal_m2po.trainer.sft_trainer.SFTTrainer`)::

    with SFTTrainer(config, train_dataset=train, valid_dataset=valid) as trainer:
        trainer.train()

``config`` comes from ``load_expr_config(argv, SFTConfig)`` (this package's SFT config, AReaL's
YAML read with AReaL's meaning); the data sets hold AReaL's tokenized rows, ``input_ids`` and
``loss_mask`` (1 on the tokens learnt), as ``get_custom_dataset`` makes them for ``type: sft``.
Training and evaluation are this package's, with the models loaded in :meth:`SFTTrainer.train`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from areal_m2po.api.cli_args import SFTConfig
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


class _GivenExamples(_PackageSFTTrainer):
    """The package's SFT trainer on examples given rather than read from the config's paths."""

    def __init__(self, config: SFTConfig, train: list[Any], valid: list[Any]) -> None:
        self._given = (train, valid)
        super().__init__(config)

    def _load_items(self, dataset: Any) -> list[dict[str, Any]]:
        items = self._given[0] if dataset is self.config.train_dataset else self._given[1]
        too_long = [e["where"] for e in items if len(e["input_ids"]) > self.config.max_length]
        if too_long:
            raise ValueError(f"{too_long[0]}: longer than max_length={self.config.max_length}")
        return items


class SFTTrainer:
    """AReaL's SFT trainer (see the module doc)."""

    def __init__(self, config: Any, train_dataset: Any, valid_dataset: Any = None) -> None:
        if not isinstance(config, SFTConfig):
            raise TypeError(
                f"SFTTrainer: config is a {type(config).__name__}; load it with "
                "load_expr_config(argv, SFTConfig)"
            )
        self.config = config
        self.train_examples = to_examples(train_dataset, "train_dataset")
        self.valid_examples = to_examples(valid_dataset, "valid_dataset")
        self.status: int | None = None

    def train(self) -> None:
        """Train as the config says.

        Raises:
            SystemExit: the run stopped with the trainer's non-zero exit status.
        """
        from areal_m2po.trainer.step_loop import run_trainer

        train, valid = self.train_examples, self.valid_examples
        self.status = run_trainer(lambda c: _GivenExamples(c, train, valid), self.config)
        if self.status != 0:
            raise SystemExit(self.status)

    def close(self) -> None:
        """Nothing to release: the run closed its model when :meth:`train` returned."""

    def __enter__(self) -> SFTTrainer:
        return self

    def __exit__(self, *exc: object) -> bool:
        self.close()
        return False
