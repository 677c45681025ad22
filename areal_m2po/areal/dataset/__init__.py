"""AReaL's ``get_custom_dataset`` (``areal.dataset`` at areal-project/AReaL cbff54d6) for the
data sets this trainer runs AReaL's scripts on, read from local copies.

``dataset_config.path`` names the data set as AReaL dispatches on it (``gsm8k`` in the path)
and where it is: a local folder laid out as the Hub repository has it (what downloading
``openai/gsm8k`` gives: ``main/train-00000-of-00001.parquet``, ``main/test-...``), a folder
written by ``save_to_disk``, or one ``.jsonl``/``.json``/``.parquet`` file of the Hub's rows.
A Hub id is fetched only online; offline (``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``) it is
refused in one line. The rows become AReaL's: for ``type: rl`` gsm8k, ``messages`` (the
question and AReaL's instruction to box the answer) and ``answer``.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from areal_m2po.dataset.loader import read_rows

__all__ = ["get_custom_dataset", "read_hub_layout"]

_BOX = "\nPlease put your final answer within \\boxed{}."
_FILES = (".jsonl", ".json", ".parquet")


def _offline() -> bool:
    return any(
        os.environ.get(v, "0") not in ("", "0") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def _read_jsonl_gz(path: str) -> list[dict[str, Any]]:
    import gzip
    import json

    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
    return rows


def read_hub_layout(path: str, split: str, config_name: str = "main") -> list[dict[str, Any]]:
    """The rows of ``split`` at ``path`` (see the module doc for the layouts).

    Raises:
        ValueError: one line: nothing of ``split`` at a local ``path``, or a Hub id offline.
    """
    path = os.path.expanduser(path)
    if os.path.isfile(path):
        return [row for _, row in read_rows(path, split)]
    if os.path.isdir(path):
        for sub in (config_name, "data", ""):
            base = os.path.join(path, sub) if sub else path
            files = sorted(glob.glob(os.path.join(base, f"{split}-*.parquet")))
            files += [os.path.join(base, split + s) for s in _FILES]
            found = [f for f in files if os.path.isfile(f)]
            if found:
                return [row for f in found for _, row in read_rows(f, split)]
        gz = sorted(glob.glob(os.path.join(path, "**", f"{split}.jsonl.gz"), recursive=True))
        if gz:  # Anthropic/hh-rlhf's layout: <subset>/<split>.jsonl.gz
            return [row for f in gz for row in _read_jsonl_gz(f)]
        return [row for _, row in read_rows(path, split)]
    if path.startswith(("/", "./", "../")):
        raise ValueError(f"dataset path {path!r} does not exist")
    if _offline():
        raise ValueError(
            f"dataset {path!r} is a Hub id and this machine is offline (HF_HUB_OFFLINE); pass "
            f"a local copy: a folder laid out as the Hub repository ({config_name}/{split}-*.parquet)"
            " or a .jsonl file"
        )
    return [row for _, row in read_rows(path, split, config_name)]


def _gsm8k_rl(
    rows: list[dict[str, Any]], tokenizer: Any, max_length: int | None
) -> list[dict[str, Any]]:
    out = []
    for i, row in enumerate(rows):
        if "question" not in row or "answer" not in row:
            raise ValueError(f"gsm8k row {i}: needs 'question' and 'answer', has {sorted(row)}")
        content = str(row["question"]) + _BOX
        limit = max_length if tokenizer is not None else None
        if limit is not None and len(tokenizer.encode(content)) > limit:
            continue
        rest = {k: v for k, v in row.items() if k != "question"}
        out.append({**rest, "messages": [{"role": "user", "content": content}]})
    return out


def _gsm8k_sft(
    rows: list[dict[str, Any]], tokenizer: Any, max_length: int | None
) -> list[dict[str, Any]]:
    """AReaL's gsm8k SFT rows: ``question + answer + EOS`` tokenized, ``loss_mask`` 1 after the
    question's tokens; longer than ``max_length`` dropped."""
    if tokenizer is None:
        raise ValueError("get_custom_dataset: gsm8k with type sft needs tokenizer=")
    out = []
    for i, row in enumerate(rows):
        if "question" not in row or "answer" not in row:
            raise ValueError(f"gsm8k row {i}: needs 'question' and 'answer', has {sorted(row)}")
        ids = tokenizer.encode(str(row["question"]) + str(row["answer"]) + tokenizer.eos_token)
        n_prompt = len(tokenizer.encode(str(row["question"])))
        if max_length is not None and len(ids) > max_length:
            continue
        out.append({"input_ids": ids, "loss_mask": [0] * n_prompt + [1] * (len(ids) - n_prompt)})
    return out


def _hhrlhf(
    rows: list[dict[str, Any]], tokenizer: Any, max_length: int | None, kind: str
) -> list[dict[str, Any]]:
    """AReaL's hh-rlhf rows: ``chosen``/``rejected`` + EOS tokenized as ``chosen_ids`` /
    ``rejected_ids``; for DPO (``dpo``, or ``preference``: a section read here, whose AReaL
    ``type`` is not kept) also ``chosen_loss_mask`` / ``rejected_loss_mask``, 1 after the
    tokens both share (the prompt). Pairs with a side over ``max_length`` are dropped."""
    if tokenizer is None:
        raise ValueError(f"get_custom_dataset: hh-rlhf with type {kind} needs tokenizer=")
    out = []
    for i, row in enumerate(rows):
        if "chosen" not in row or "rejected" not in row:
            raise ValueError(f"hh-rlhf row {i}: needs 'chosen' and 'rejected', has {sorted(row)}")
        chosen = tokenizer.encode(str(row["chosen"]) + tokenizer.eos_token)
        rejected = tokenizer.encode(str(row["rejected"]) + tokenizer.eos_token)
        if max_length is not None and max(len(chosen), len(rejected)) > max_length:
            continue
        item: dict[str, Any] = {"chosen_ids": chosen, "rejected_ids": rejected}
        if kind != "rw":
            shared = next(
                (j for j, (c, r) in enumerate(zip(chosen, rejected)) if c != r),
                min(len(chosen), len(rejected)),
            )
            item["chosen_loss_mask"] = [0] * shared + [1] * (len(chosen) - shared)
            item["rejected_loss_mask"] = [0] * shared + [1] * (len(rejected) - shared)
        out.append(item)
    return out


def _kind(dataset_config: Any) -> str:
    """``type`` of a section read by this package (AReaL's ``type`` key is not kept): ``sft``
    for an SFT section, ``preference`` for a preference one, ``rl`` otherwise."""
    from areal_m2po.api.cli_args import PreferenceDatasetConfig, SFTDatasetConfig

    if isinstance(dataset_config, SFTDatasetConfig):
        return "sft"
    return "preference" if isinstance(dataset_config, PreferenceDatasetConfig) else "rl"


def get_custom_dataset(
    split: str | None = None,
    dataset_config: Any = None,
    tokenizer: Any = None,
    processor: Any = None,
    **kwargs: Any,
) -> Any:
    """A :class:`datasets.Dataset` of AReaL's rows of ``dataset_config.path``'s ``split``.

    ``type`` is ``dataset_config.type`` or the ``type`` keyword (``rl`` when neither says);
    ``max_length`` (or ``dataset_config.max_prompt_length``) drops longer prompts.

    Raises:
        ValueError: one line: no ``dataset_config``/``path``, a data set or type not supported
            here (a VLM data set is out of scope), or the reading errors above.
    """
    import datasets

    path = kwargs.pop("path", None) or getattr(dataset_config, "path", None)
    if not path:
        raise ValueError("get_custom_dataset: dataset_config.path (or path=) is required")
    kind = kwargs.pop("type", None) or getattr(dataset_config, "type", None)
    kind = kind or _kind(dataset_config)
    max_length = kwargs.pop("max_length", None)
    if max_length is None:
        max_length = getattr(dataset_config, "max_length", None)
    if max_length is None:
        max_length = getattr(dataset_config, "max_prompt_length", None)
    if processor is not None:
        raise ValueError(
            "get_custom_dataset: processor given: vision-language data is out of scope here"
        )
    split = split or getattr(dataset_config, "split", None) or "train"
    if "gsm8k" in path and kind == "rl":
        rows = _gsm8k_rl(read_hub_layout(path, split), tokenizer, max_length)
        return datasets.Dataset.from_list(rows)
    if "gsm8k" in path and kind == "sft":
        rows = _gsm8k_sft(read_hub_layout(path, split), tokenizer, max_length)
        return datasets.Dataset.from_list(rows)
    if "hh-rlhf" in path and kind in ("rw", "dpo", "preference"):
        rows = _hhrlhf(read_hub_layout(path, split), tokenizer, max_length, kind)
        return datasets.Dataset.from_list(rows)
    raise ValueError(
        f"get_custom_dataset: {path!r} with type {kind!r} is not supported here (supported: "
        "gsm8k with type rl or sft, hh-rlhf with type rw or dpo); build a datasets.Dataset of your records and pass it instead"
    )
