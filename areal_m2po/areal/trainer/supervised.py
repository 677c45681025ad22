"""What AReaL's ``SFTTrainer``, ``RWTrainer`` and ``DPOTrainer`` share here: built as
``Trainer(config, train_dataset=, valid_dataset=)`` with AReaL's tokenized rows, used as a
context manager, run by ``train()`` on this package's trainer of the same kind, whose
``_load_items`` (its data hook) returns the rows converted rather than reading
``train_dataset.path``. The models load in ``train()``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["ArealSupervisedTrainer", "given_items"]


def given_items(base: type) -> type:
    """A subclass of the package trainer ``base`` that trains on items given to it."""

    class _Given(base):  # type: ignore[misc, valid-type]
        def __init__(self, config: Any, train: list[Any], valid: list[Any]) -> None:
            self._given = (train, valid)
            super().__init__(config)

        def _load_items(self, dataset: Any) -> list[Any]:
            items = self._given[0] if dataset is self.config.train_dataset else self._given[1]
            limit = self.config.max_length
            for item in items:
                longest = max(len(ids) for ids in _id_lists(item))
                if longest > limit:
                    raise ValueError(f"{item['where']}: {longest} tokens, over max_length={limit}")
            return items

    _Given.__name__ = _Given.__qualname__ = f"Areal{base.__name__}"
    return _Given


def _id_lists(item: dict[str, Any]) -> list[list[int]]:
    if "input_ids" in item:
        return [item["input_ids"]]
    if "chosen_ids" in item:
        return [item["chosen_ids"], item["rejected_ids"]]
    return [item["chosen"]["input_ids"], item["rejected"]["input_ids"]]


class ArealSupervisedTrainer:
    """The AReaL-side trainer: a subclass sets ``config_cls`` (the package's config),
    ``package_trainer`` (the package's trainer class, made by :func:`given_items`) and
    ``convert`` (AReaL rows -> the package trainer's items, named for errors)."""

    config_cls: type
    package_trainer: type
    convert: Callable[[Iterable[dict[str, Any]] | None, str], list[Any]]

    def __init__(self, config: Any, train_dataset: Any, valid_dataset: Any = None) -> None:
        name = type(self).__name__
        if not isinstance(config, self.config_cls):
            raise TypeError(
                f"{name}: config is a {type(config).__name__}; load it with "
                f"load_expr_config(argv, {self.config_cls.__name__})"
            )
        self.config = config
        convert = type(self).convert
        self.train_items = convert(train_dataset, "train_dataset")
        self.valid_items = convert(valid_dataset, "valid_dataset")
        self.status: int | None = None

    def train(self) -> None:
        """Train as the config says.

        Raises:
            SystemExit: the run stopped with the trainer's non-zero exit status.
        """
        from areal_m2po.trainer.step_loop import run_trainer

        train, valid, build = self.train_items, self.valid_items, self.package_trainer
        self.status = run_trainer(lambda c: build(c, train, valid), self.config)
        if self.status != 0:
            raise SystemExit(self.status)

    def close(self) -> None:
        """Nothing to release: the run closed its models when :meth:`train` returned."""

    def __enter__(self) -> ArealSupervisedTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
