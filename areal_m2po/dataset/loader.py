"""Load prompt/answer records, turn them into prompt token ids, and batch them resumably.

Records are plain dicts with at least ``question`` (the prompt text) and ``answer``
(the reference the reward checks; GSM8K answers keep their ``#### N`` text).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from areal_m2po.api.cli_args import DatasetConfig
from areal_m2po.dataset.arithmetic import make_arithmetic_split
from areal_m2po.dataset.multiplication import make_multiplication_split

__all__ = ["PromptLoader", "build_prompts", "load_prompt_dataset", "load_records", "read_rows"]

logger = logging.getLogger("areal_m2po.dataset")

_BUILTIN_PREFIX = "builtin:"
_BUILTINS = {"arithmetic": make_arithmetic_split, "multiplication": make_multiplication_split}
_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
_SAVED_DATASET_FILES = ("state.json", "dataset_dict.json")  # Dataset(Dict).save_to_disk


# ---------------------------------------------------------------------------- loading
def _check_object(raw: Any, where: str) -> None:
    """Raise a one-line ``ValueError`` naming ``where`` unless ``raw`` is a JSON object."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(raw).__name__}")


def _required_field(
    raw: Mapping[str, Any], name: str, where: str, string: bool = False, missing_hint: str = ""
) -> Any:
    """``raw[name]``; a one-line ``ValueError`` naming ``where`` and the field when it is missing
    (``missing_hint`` appended to the message) or, with ``string``, not a ``str``."""
    if name not in raw:
        raise ValueError(f"{where}: missing field {name!r}{missing_hint}")
    value = raw[name]
    if string and not isinstance(value, str):
        raise ValueError(f"{where}: field {name!r} must be a string, got {type(value).__name__}")
    return value


def _answer(value: Any, name: str, where: str) -> str | int | float:
    """The answer field's value: a string, or a finite number (made a string by the caller);
    a one-line ``ValueError`` naming ``where`` and the field for anything else (null, a bool,
    a list, an object, NaN), which a reward function could only score 0 on every sample."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(value, str) or (number and math.isfinite(value)):
        return value
    what = "null" if value is None else f"{type(value).__name__} {value!r:.40}"
    raise ValueError(f"{where}: field {name!r} must be a string or a finite number, got {what}")


def _rename(
    raw: Mapping[str, Any], prompt_field: str, answer_field: str, where: str
) -> dict[str, Any]:
    """One record with ``question``/``answer`` keys taken from the configured fields."""
    for name in (prompt_field, answer_field):
        _required_field(raw, name, where)
    question = _required_field(raw, prompt_field, where, string=True)
    answer = _answer(raw[answer_field], answer_field, where)
    record = {k: v for k, v in raw.items() if k not in (prompt_field, answer_field)}
    record["question"] = question
    record["answer"] = answer if isinstance(answer, str) else str(answer)
    return record


def _read_text(path: str) -> str:
    """The UTF-8 text of ``path``, a leading byte-order mark (as Windows tools write) dropped;
    a one-line ``ValueError`` naming the file, line and byte when it is not UTF-8."""
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}, as Latin-1 or "
            "Windows-1252 files have): save the file as UTF-8"
        ) from None


def _read_jsonl(path: str) -> list[tuple[str, Any]]:
    """(location, parsed object) per non-blank line of a JSON Lines file."""
    rows: list[tuple[str, Any]] = []
    for line_no, line in enumerate(_read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{line_no}"
        try:
            rows.append((where, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: invalid JSON ({exc.msg})") from exc
    return rows


def _read_json(path: str) -> list[tuple[str, Any]]:
    """(location, object) per item of a JSON file holding a list of objects."""
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from exc
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
    return [(f"{path}: item {i}", item) for i, item in enumerate(data)]


def _read_parquet(path: str) -> list[tuple[str, Any]]:
    """(location, row) per row of a Parquet file."""
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    return [(f"{path}: row {i}", row) for i, row in enumerate(rows)]


def _read_csv(path: str) -> list[tuple[str, Any]]:
    """(location, row) per data row of a CSV file with a header line (every value a string)."""
    reader = csv.DictReader(io.StringIO(_read_text(path), newline=""))
    try:
        return [(f"{path}:{reader.line_num}", dict(row)) for row in reader]
    except csv.Error as exc:
        raise ValueError(f"{path}:{reader.line_num}: invalid CSV ({exc})") from exc


def _read_saved(path: str, split: str) -> list[tuple[str, Any]]:
    """(location, row) per row of a folder written by ``Dataset.save_to_disk`` (or a
    ``DatasetDict``'s, whose ``split`` is read)."""
    import datasets

    try:
        dataset = datasets.load_from_disk(path)
    except Exception as exc:  # noqa: BLE001 - any loading failure gets one clear line
        detail = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ValueError(
            f"dataset folder {path!r} (save_to_disk) could not be read: "
            f"{type(exc).__name__}: {detail}"
        ) from exc
    if isinstance(dataset, datasets.DatasetDict):
        if split not in dataset:
            raise ValueError(
                f"dataset folder {path!r} has no split {split!r}; it has {sorted(dataset)}"
            )
        dataset = dataset[split]
    return [(f"{path}: row {i}", row) for i, row in enumerate(dataset)]


def _looks_local(path: str) -> bool:
    """Whether ``path`` names a local path rather than a Hub dataset: it starts with ``/``,
    ``./``, ``../`` or ``~``, or its first component is an existing folder (``data/x``)."""
    if path.startswith(("/", "./", "../", "~", ".\\")):
        return True
    head = path.replace("\\", "/").split("/", 1)[0]
    return "/" in path and os.path.isdir(head)


def _read_hub(path: str, split: str, config_name: str | None) -> list[tuple[str, Any]]:
    """(location, row) per row of ``datasets.load_dataset(path, config_name, split=split)``."""
    import datasets

    try:
        dataset = datasets.load_dataset(path, config_name, split=split)
    except Exception as exc:  # noqa: BLE001 - any loading failure gets one clear line
        detail = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ValueError(
            f"dataset {path!r} (split {split!r}) could not be loaded offline "
            f"({type(exc).__name__}: {detail}); without network access only cached or "
            "local datasets load - pass a local .jsonl file (one JSON object per line) instead"
        ) from exc
    return [(f"dataset {path!r} row {i}", row) for i, row in enumerate(dataset)]


def read_rows(
    path: str, split: str = "train", config_name: str | None = None
) -> list[tuple[str, Any]]:
    """``(location, row)`` for every row of a local ``.jsonl``/``.json``/``.parquet``/``.csv``
    file, a folder written by ``save_to_disk``, or a ``datasets`` directory / Hub name
    (``~`` expanded); ``location`` names the file and line (``data.jsonl:7``), item or row for
    error messages. A path that looks local (see :func:`_looks_local`) is never sent to the Hub.

    Raises:
        ValueError: the file does not exist, or a line is not valid JSON (naming file and line).
    """
    path = os.path.expanduser(path)
    lowered = path.lower()
    if not lowered.endswith(_FILE_SUFFIXES):
        if os.path.isdir(path) and any(
            os.path.isfile(os.path.join(path, f)) for f in _SAVED_DATASET_FILES
        ):
            return _read_saved(path, split)
        if not os.path.exists(path) and _looks_local(path):
            raise ValueError(f"dataset path {path!r} does not exist")
        return _read_hub(path, split, config_name)
    if not os.path.isfile(path):
        raise ValueError(f"dataset file {path!r} does not exist")
    readers = {".jsonl": _read_jsonl, ".json": _read_json, ".csv": _read_csv}
    for suffix, reader in readers.items():
        if lowered.endswith(suffix):
            return reader(path)
    return _read_parquet(path)


def load_records(
    path: str,
    split: str = "train",
    prompt_field: str = "question",
    answer_field: str = "answer",
    max_samples: int | None = None,
    seed: int = 0,
    config_name: str | None = None,
) -> list[dict[str, Any]]:
    """Load records with ``question`` and ``answer`` keys (other fields kept as they are).

    ``path`` is ``builtin:arithmetic`` or ``builtin:multiplication`` (the calculator task); a local ``.jsonl``, ``.json`` (list of objects) or
    ``.parquet`` file; or a local directory / Hub name given to ``datasets.load_dataset``.
    ``max_samples`` keeps the first records (for the built-in task it is the split size,
    and ``seed`` shuffles its train split; files keep their order).  ``config_name`` is
    the ``datasets`` configuration (e.g. ``"main"`` for ``openai/gsm8k``).

    Raises:
        ValueError: one line saying what is wrong and where (``data.jsonl:7: ...``).
    """
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"max_samples must be >= 1 or None, got {max_samples}")
    if path.startswith(_BUILTIN_PREFIX):
        name = path[len(_BUILTIN_PREFIX) :]
        if name not in _BUILTINS:
            known = ", ".join(f"{_BUILTIN_PREFIX}{k}" for k in _BUILTINS)
            raise ValueError(f"unknown built-in dataset {path!r}; known: {known}")
        make_split = _BUILTINS[name]
        return [dict(r) for r in make_split(split, n=max_samples, seed=seed)]  # type: ignore[arg-type]

    return read_records(
        path,
        split,
        max_samples,
        lambda row, where: _rename(row, prompt_field, answer_field, where),
        "dataset",
        config_name,
    )


def read_records(
    path: str,
    split: str,
    max_samples: int | None,
    check: Callable[[Mapping[str, Any], str], dict[str, Any]],
    kind: str,
    config_name: str | None = None,
) -> list[dict[str, Any]]:
    """``check(row, where)`` of the first ``max_samples`` rows of :func:`read_rows`, each
    first checked to be a JSON object; a one-line ``ValueError`` naming the ``kind`` of
    dataset when there are none."""
    rows = read_rows(path, split, config_name)
    if max_samples is not None:
        rows = rows[:max_samples]
    records = []
    for where, row in rows:
        _check_object(row, where)
        records.append(check(row, where))
    if not records:
        raise ValueError(f"{kind} {path!r} (split {split!r}) has no records")
    return records


# ---------------------------------------------------------------------------- prompts
def _as_id_list(encoded: Any) -> list[int]:
    """Token ids from whatever ``apply_chat_template(tokenize=True)`` returned.

    transformers 4 returns a list of ints; transformers 5 may return a BatchEncoding
    (a dict with ``input_ids``), possibly batched as ``[[...]]``.
    """
    if isinstance(encoded, Mapping):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    ids = list(encoded)
    if len(ids) == 1 and isinstance(ids[0], (list, tuple)):
        ids = list(ids[0])
    return [int(i) for i in ids]


def _has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def build_prompts(
    records: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    max_prompt_length: int,
    use_chat_template: bool = True,
    system_prompt: str | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Add ``prompt_ids`` and ``prompt_text`` to copies of ``records``; drop over-long prompts.

    With a chat template (and ``use_chat_template``) the prompt is the user turn
    (after an optional system turn) plus the generation prompt.  Otherwise it is the
    question text (after ``system_prompt`` and a blank line, if given), encoded with the
    tokenizer's usual special tokens.

    Returns:
        The kept records, and how many were dropped for exceeding ``max_prompt_length``
        tokens (the caller logs it).
    """
    if max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
    chat = use_chat_template and _has_chat_template(tokenizer)
    if use_chat_template and not chat:
        logger.warning("tokenizer has no chat template; using the plain question text as prompt")
    kept: list[dict[str, Any]] = []
    n_dropped = 0
    for record in records:
        question = record["question"]
        if chat:
            messages = [{"role": "user", "content": question}]
            if system_prompt is not None:
                messages.insert(0, {"role": "system", "content": system_prompt})
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
            ids = _as_id_list(
                tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            )
        else:
            text = question if system_prompt is None else f"{system_prompt}\n\n{question}"
            ids = _as_id_list(tokenizer(text)["input_ids"])
        if len(ids) > max_prompt_length:
            n_dropped += 1
            continue
        kept.append({**record, "prompt_ids": ids, "prompt_text": text})
    return kept, n_dropped


def load_prompt_dataset(
    dcfg: DatasetConfig, tokenizer: Any, seed: int, name: str
) -> list[dict[str, Any]]:
    """The prompts of the dataset section ``<name>_dataset`` (:func:`load_records` then
    :func:`build_prompts`); over-long prompts are dropped with a warning.

    Raises:
        ValueError: naming the section when no prompt is left.
    """
    records = load_records(
        dcfg.path,
        split=dcfg.split,
        prompt_field=dcfg.prompt_field,
        answer_field=dcfg.answer_field,
        max_samples=dcfg.max_samples,
        seed=seed,
    )
    prompts, n_dropped = build_prompts(
        records, tokenizer, dcfg.max_prompt_length, dcfg.use_chat_template
    )
    if n_dropped:
        logger.warning(
            "%s_dataset: dropped %d of %d prompts longer than max_prompt_length=%d",
            name,
            n_dropped,
            len(records),
            dcfg.max_prompt_length,
        )
    if not prompts:
        raise ValueError(f"{name}_dataset: no prompts left ({dcfg.path})")
    return prompts


# ---------------------------------------------------------------------------- batching
class PromptLoader:
    """Endless, resumable batches of records, reshuffled every epoch.

    Epoch ``e`` visits the records in the order of ``random.Random(seed + e)`` (or in
    input order without ``shuffle``).  :meth:`state_dict` captures the epoch and the
    number of batches already taken from it, so a loader restored with
    :meth:`load_state_dict` yields exactly the batches the original would have.
    Batches hold shallow copies of the records.
    """

    _STATE_VERSION = 1

    def __init__(
        self,
        records: Sequence[Mapping[str, Any]],
        batch_size: int,
        shuffle: bool,
        seed: int,
        drop_last: bool = True,
    ) -> None:
        if not records:
            raise ValueError("PromptLoader needs at least one record, got none")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if drop_last and batch_size > len(records):
            raise ValueError(
                f"batch_size={batch_size} is larger than the dataset ({len(records)} records) "
                "with drop_last=True; lower the batch size or add data"
            )
        self._records = list(records)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self._epoch = 0
        self._position = 0  # batches already taken from the current epoch
        self._order_epoch = -1
        self._order: list[int] = []

    @property
    def steps_per_epoch(self) -> int:
        """Batches in one epoch."""
        n = len(self._records)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from (before rollover)."""
        return self._epoch

    def __len__(self) -> int:
        """Number of records (not batches; iteration never ends)."""
        return len(self._records)

    def _epoch_order(self, epoch: int) -> list[int]:
        if self._order_epoch != epoch:
            order = list(range(len(self._records)))
            if self.shuffle:
                random.Random(self.seed + epoch).shuffle(order)
            self._order, self._order_epoch = order, epoch
        return self._order

    def next_batch(self) -> tuple[list[dict[str, Any]], int]:
        """The next batch and the epoch it belongs to, moving to a new epoch when needed."""
        if self._position >= self.steps_per_epoch:
            self._epoch += 1
            self._position = 0
        order = self._epoch_order(self._epoch)
        start = self._position * self.batch_size
        batch = [dict(self._records[i]) for i in order[start : start + self.batch_size]]
        self._position += 1
        return batch, self._epoch

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        """Batches forever, epoch after epoch."""
        while True:
            yield self.next_batch()[0]

    def state_dict(self) -> dict[str, int | bool]:
        """Position (epoch, batches taken in it) plus what must match on resume."""
        return {
            "version": self._STATE_VERSION,
            "epoch": self._epoch,
            "position": self._position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "num_records": len(self._records),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`; raises ValueError if data or batching changed."""
        for key, current in (
            ("num_records", len(self._records)),
            ("batch_size", self.batch_size),
            ("shuffle", self.shuffle),
            ("seed", self.seed),
        ):
            if key in state and state[key] != current:
                raise ValueError(
                    f"PromptLoader state has {key}={state[key]!r} but this loader has "
                    f"{key}={current!r}; resuming would not reproduce the same batches"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.steps_per_epoch:
            raise ValueError(f"PromptLoader state has invalid epoch={epoch}, position={position}")
        self._epoch, self._position = epoch, position
