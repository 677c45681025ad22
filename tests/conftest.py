"""Shared test set-up: an offline, quiet environment; torch threads fixed only on request;
the fixtures several test files use (``restore_threads``, ``tok``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

import pytest

OFFLINE_ENV = MappingProxyType(
    {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
    }
)


def pytest_configure(config: pytest.Config) -> None:
    """Set the offline variables before collection, so modules imported by test files
    (``datasets`` reads its offline flag at import) already see them."""
    os.environ.update(OFFLINE_ENV)


@pytest.fixture(autouse=True, scope="session")
def offline_env() -> Iterator[None]:
    """Keep the offline variables set for the whole session (and restore them afterwards)."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in OFFLINE_ENV.items():
            mp.setenv(name, value)
        yield


@pytest.fixture
def torch_threads() -> Iterator[int]:
    """Fix torch's intra-op threads to 2 for one test (timing ratios, determinism)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield 2
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def restore_threads() -> Iterator[None]:
    """Give the session its torch threads back after a test whose runs fix them
    (``num_threads=1`` in a run's config sets them process-wide); use it with
    ``pytestmark = pytest.mark.usefixtures("restore_threads")``."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tok():  # noqa: ANN201 - a transformers tokenizer
    """The tokenizer of ``builtin:tiny`` (loaded once per session)."""
    from transformers import AutoTokenizer

    from areal_m2po.engine.builtin_models import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("builtin:tiny"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``vllm`` run real vLLM: skipped (with the reason) where vLLM is not
    installed, the project's main environment, unless ``AREAL_M2PO_REQUIRE_VLLM=1`` (the vLLM
    environment of ``.ci/run``), where a missing vLLM fails the run instead."""
    import importlib.util

    marked = [item for item in items if "vllm" in item.keywords]
    if not marked or importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("AREAL_M2PO_REQUIRE_VLLM") == "1":
        raise pytest.UsageError("AREAL_M2PO_REQUIRE_VLLM=1 but vLLM is not importable here")
    skip = pytest.mark.skip(
        reason="vLLM is not installed here (bash scripts/install.sh --vllm; .ci/run runs "
        "these tests in .venv-vllm)"
    )
    for item in marked:
        item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Under pytest-randomly, name the seed of this order at the end, also with ``-q`` (which
    hides the header line where the plugin names it), so that a failure can be replayed."""
    if not config.pluginmanager.hasplugin("randomly"):
        return
    seed = config.getoption("randomly_seed", None)
    if isinstance(seed, int):
        terminalreporter.write_line(
            f"Using --randomly-seed={seed} (replay: -p randomly --randomly-seed={seed})"
        )
