"""Ask for ``builtin:tiny`` on empty model caches from several processes at once.

    accelerate launch --multi_gpu --num_processes 2 tests/support/cache_worker.py launch OUT CACHE_ROOT
    python tests/support/cache_worker.py together OUT CACHE GO_FILE

``launch`` (under a process group of 2 ranks): ``CACHE_ROOT/rank1_first``: rank 1 asks first,
then rank 0; ``CACHE_ROOT/together``: both ask at once. Then rank 1 saves the seeded tiny model
with ``save_pretrained`` and with ``save_model_folder`` and lists what each wrote (under a
process group, ``save_pretrained`` on rank 1 writes no config and no weights). Each rank writes
``OUT/rank<r>.json``: the folders it got, what they hold and a checksum of the loaded weights.

``together`` (no process group, one of several unrelated processes): writes ``OUT.ready``, waits
for ``GO_FILE``, asks for the model in ``CACHE`` and writes ``OUT`` (logging at INFO on stderr:
the build's ``building builtin:tiny`` line).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any


def _ask(cache: Path) -> dict[str, Any]:
    """``builtin:tiny`` resolved in ``cache``, loaded: its folder, files and weight checksum."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_m2po.engine.builtin_models import resolve_model_path

    os.environ["AREAL_M2PO_CACHE"] = str(cache)
    path = resolve_model_path("builtin:tiny")
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return {
        "path": path,
        "files": sorted(os.listdir(path)),
        "checksum": sum(float(t.double().sum()) for t in model.state_dict().values()),
        "vocab": len(tokenizer),
    }


def _launch(out: Path, root: Path) -> None:
    import torch.distributed as tdist
    from accelerate import Accelerator

    from areal_m2po.engine.builtin_models import build_tiny_llama
    from areal_m2po.engine.model_cache import save_model_folder
    from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer

    Accelerator(cpu=True)
    rank = tdist.get_rank()
    result: dict[str, Any] = {"world": tdist.get_world_size()}
    for turn in (1, 0):  # rank 1 builds while rank 0 waits, then rank 0 asks
        if rank == turn:
            result["rank1_first"] = _ask(root / "rank1_first")
        tdist.barrier()
    tdist.barrier()
    result["together"] = _ask(root / "together")
    if rank == 1:
        tokenizer = build_tiny_tokenizer()
        model = build_tiny_llama(len(tokenizer))
        model.save_pretrained(root / "save_pretrained_rank1")
        tokenizer.save_pretrained(root / "save_pretrained_rank1")
        save_model_folder(model, tokenizer, _made(root / "save_model_folder_rank1"))
        result["written"] = {
            name: sorted(os.listdir(root / name))
            for name in ("save_pretrained_rank1", "save_model_folder_rank1")
        }
    tdist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


def _made(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _together(out: Path, cache: Path, go: Path) -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
    # everything the ask imports, imported before the start line: the asks overlap
    from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: F401

    import areal_m2po.engine.builtin_models  # noqa: F401
    import areal_m2po.utils.tiny_tokenizer  # noqa: F401

    Path(f"{out}.ready").touch()
    while not go.exists():
        time.sleep(0.01)
    out.write_text(json.dumps(_ask(cache)))


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "launch":
        _launch(Path(args[0]), Path(args[1]))
    else:
        _together(Path(args[0]), Path(args[1]), Path(args[2]))
