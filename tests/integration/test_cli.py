"""The ``python -m areal_m2po.train`` command line: help, print-config, and bad configs."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from areal_m2po.api.cli_args import ConfigError, PPOConfig
from areal_m2po.api.config_loader import config_to_yaml, leaf_keys, load_config
from areal_m2po.train import main

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "tiny.yaml")

Argv = list[str] | Callable[[Path], list[str]]


def _file(text: str, name: str = "bad.yaml") -> Callable[[Path], list[str]]:
    """A table row whose argv points --config at a file holding ``text``."""

    def build(tmp_path: Path) -> list[str]:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return ["--config", str(path)]

    return build


# (id, argv, the key the single error line must name, another substring it must hold)
BAD_INPUTS: list[tuple[str, Argv, str, str]] = [
    # unknown keys, with the nearest valid key
    ("typo-leaf", ["actor.m2_treshold=0.05"], "actor.m2_treshold", "'actor.m2_threshold'"),
    ("typo-section", ["--actr.eps_clip=0.2"], "actr.eps_clip", "'actor.eps_clip'"),
    ("leaf-at-root", ["--m2_threshold", "0.05"], "m2_threshold", "'actor.m2_threshold'"),
    ("below-a-leaf", ["actor.eps_clip.low=1"], "actor.eps_clip.low", "unknown key"),
    ("yaml-typo", _file("actor:\n  optimizer:\n    lrr: 1\n"), "actor.optimizer.lrr", "lr'"),
    # wrong types
    ("float-text", ["--actor.eps_clip=abc"], "actor.eps_clip", "expected float, got 'abc'"),
    ("int-float", ["gconfig.n_samples=2.5"], "gconfig.n_samples", "expected int"),
    ("bool-int", ["actor.use_sapo_loss=1"], "actor.use_sapo_loss", "expected bool"),
    ("bool-yes", ["actor.use_sapo_loss=yes"], "actor.use_sapo_loss", "expected bool"),
    ("list-scalar", ["gconfig.stop=abc"], "gconfig.stop", "expected list of str"),
    ("section-scalar", ["actor=5"], "actor", "ActorConfig section"),
    ("int-null", ["seed=null"], "seed", "got null"),
    ("missing-value", ["--actor.eps_clip"], "actor.eps_clip", "missing value"),
    # out of range
    ("m2-zero", ["actor.m2_threshold=0"], "actor.m2_threshold", "> 0"),
    ("m2-negative", ["--actor.m2_threshold", "-0.1"], "actor.m2_threshold", "> 0"),
    ("eps-negative", ["actor.eps_clip=-0.1"], "actor.eps_clip", ">= 0"),
    ("c-clip-one", ["actor.c_clip=1.0"], "actor.c_clip", "> 1"),
    ("tau-pos", ["actor.sapo_tau_pos=0"], "actor.sapo_tau_pos", "> 0"),
    ("tau-neg", ["actor.sapo_tau_neg=-1"], "actor.sapo_tau_neg", "> 0"),
    ("n-samples", ["gconfig.n_samples=0"], "gconfig.n_samples", ">= 1"),
    ("lr-zero", ["actor.optimizer.lr=0"], "actor.optimizer.lr", "> 0"),
    ("top-p", ["gconfig.top_p=1.5"], "gconfig.top_p", "<= 1"),
    ("batch-zero", ["train_dataset.batch_size=0"], "train_dataset.batch_size", ">= 1"),
    ("seed-negative", ["seed=-1"], "seed", ">= 0"),
    ("choice", ["actor.optimizer.type=adam"], "actor.optimizer.type", "must be one of"),
    ("choice-deep", ["stats_logger.wandb.mode=cloud"], "stats_logger.wandb.mode", "one of"),
    ("recover-mode", ["recover.mode=sometimes"], "recover.mode", "must be one of"),
    ("rs-bounds", ["actor.rejection_sampling.lower=6"], "actor.rejection_sampling.lower", "<"),
    (
        "rs-no-bound",
        ["actor.rejection_sampling.upper=null"],
        "actor.rejection_sampling.upper",
        "at least one",
    ),
    ("min-max-tokens", ["gconfig.min_new_tokens=20"], "gconfig.min_new_tokens", "max_new"),
    (
        "offpolicy-bound",
        ["rollout.staleness=2", "rollout.max_head_offpolicyness=1"],
        "rollout.max_head_offpolicyness",
        ">= staleness",
    ),
    # contradictions and cross-section rules
    (
        "group-size",
        ["actor.adv_norm.group_size=3"],
        "actor.adv_norm.group_size",
        "not a multiple of the group size 3",
    ),
    (
        "sapo-decoupled",
        ["actor.use_sapo_loss=true", "actor.use_decoupled_loss=true"],
        "actor.use_sapo_loss",
        "decoupled",
    ),
    (
        "global-loglinear",
        ["actor.prox_logp_method=loglinear", "actor.use_decoupled_loss=true"],
        "actor.m2_scope",
        "microbatch",
    ),
    ("temperature", ["gconfig.temperature=0.7"], "actor.temperature", "gconfig.temperature"),
    ("greedy-group", ["gconfig.greedy=true"], "gconfig.greedy", "identical"),
    ("minibatches", ["actor.ppo_n_minibatches=3"], "actor.ppo_n_minibatches", "divide"),
    (
        "sapo-dual-clip",
        ["actor.use_sapo_loss=true", "actor.use_decoupled_loss=false", "actor.c_clip=3"],
        "actor.c_clip",
        "SAPO",
    ),
    (
        "leave1out-no-mean",
        ["actor.adv_norm.mean_level=null", "actor.adv_norm.mean_leave1out=true"],
        "actor.adv_norm.mean_leave1out",
        "mean_level",
    ),
    (
        "rs-ratio-negative",
        ["actor.rejection_sampling.lower=-1"],
        "actor.rejection_sampling.lower",
        ">= 0",
    ),
    (
        "overlong-window",
        [
            "actor.overlong_reward_penalty=true",
            "actor.overlong_tokens=32",
            "actor.overlong_penalty_factor=1",
        ],
        "actor.overlong_tokens",
        "max_new_tokens (16)",
    ),
    ("empty-name", ["experiment_name="], "experiment_name", "empty value (an unset shell"),
    (
        "critic-group-adv",
        ["critic.enabled=true"],
        "actor.adv_norm.mean_level",
        "critic",
    ),
    ("overlong", ["actor.overlong_reward_penalty=true"], "actor.overlong_tokens", "needs"),
    (
        "stop-no-eos",
        ["actor.mask_no_eos_with_zero=true", "gconfig.stop=[x]"],
        "actor.mask_no_eos_with_zero",
        "stop",
    ),
    # files and syntax
    ("no-file", ["--config", "/nonexistent/cfg.yaml"], "config", "no such config file"),
    ("yaml-syntax", _file("seed: 1\nactor:\n  eps_clip: [0.2\n"), "config", "bad.yaml:"),
    ("yaml-list", _file("- seed\n- 1\n"), "config", "must be a mapping"),
    ("yaml-type", _file("actor:\n  eps_clip: wide\n"), "actor.eps_clip", "expected float"),
    (
        "interpolation",
        _file("gconfig:\n  n_samples: ${gconfig.n_sample}\n"),
        "gconfig.n_samples",
        "interpolation",
    ),
    ("not-key-value", ["actor.eps_clip"], "actor.eps_clip", "KEY=VALUE"),
]


@pytest.mark.parametrize(
    ("argv", "key", "fragment"), [r[1:] for r in BAD_INPUTS], ids=[r[0] for r in BAD_INPUTS]
)
def test_bad_input_exits_2_with_one_line_naming_the_key(
    argv: Argv, key: str, fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argv(tmp_path) if callable(argv) else argv
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"error: {key}: "), err
    assert fragment in err, err
    assert "Traceback" not in err


def test_bad_input_also_fails_load_config() -> None:
    for _id, argv, key, _fragment in BAD_INPUTS:
        if callable(argv):
            continue
        with pytest.raises(ConfigError) as info:
            load_config(argv)
        assert info.value.key == key, _id


# ---------------------------------------------------------------------------------------------
# --help, --print-config, and handing over to the trainer
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([flag]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.startswith("usage: python -m areal_m2po.train")
    for key in leaf_keys(PPOConfig):
        assert f"  {key} (" in out, key


def test_help_wins_over_bad_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["actor.m2_treshold=1", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage:")


def test_print_config_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--config", TINY, "--actor.eps_clip", "0.3", "--print-config", "gconfig.stop=[a]"]
    assert main(argv) == 0
    first, err = capsys.readouterr()
    assert err == ""
    data = yaml.safe_load(first)
    assert data["actor"]["eps_clip"] == 0.3 and data["gconfig"]["stop"] == ["a"]
    saved = tmp_path / "printed.yaml"
    saved.write_text(first, encoding="utf-8")
    assert main(["--print-config", "--config", str(saved)]) == 0
    second, _ = capsys.readouterr()
    assert second == first


def test_print_config_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--print-config"]) == 0
    assert capsys.readouterr().out == config_to_yaml(PPOConfig())


def _fake_trainer(monkeypatch: pytest.MonkeyPatch, run: Callable) -> None:
    """Install a stand-in ``areal_m2po.trainer.rl_trainer``."""
    name = "areal_m2po.trainer.rl_trainer"
    module = types.ModuleType(name)
    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, name, module)


def test_valid_config_is_handed_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[PPOConfig] = []

    def run(cfg: PPOConfig) -> int:
        seen.append(cfg)
        return 0

    _fake_trainer(monkeypatch, run)
    assert main(["--config", TINY, "seed=3"]) == 0
    assert len(seen) == 1 and seen[0].seed == 3 and seen[0].actor.path == "builtin:tiny"


def test_run_status_and_config_error_from_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_trainer(monkeypatch, lambda cfg: 3)
    assert main(["--config", TINY]) == 3

    def run(cfg: PPOConfig) -> int:
        raise ConfigError("train_dataset.path", "no such file")

    _fake_trainer(monkeypatch, run)
    assert main(["--config", TINY]) == 2
    assert capsys.readouterr().err == "error: train_dataset.path: no such file\n"


# ---------------------------------------------------------------------------------------------
# the real command line, in a subprocess
# ---------------------------------------------------------------------------------------------


def _run_module(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "areal_m2po.train", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_shell_bad_config_exits_2_without_traceback() -> None:
    proc = _run_module("--config", TINY, "--actor.m2_treshold", "0.05")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        "error: actor.m2_treshold: unknown key 'actor.m2_treshold' "
        "(did you mean 'actor.m2_threshold'?)\n"
    )


def test_shell_help_and_print_config() -> None:
    proc = _run_module("--help")
    assert proc.returncode == 0 and proc.stderr == ""
    assert "actor.m2_threshold (float|null, default: 0.04)" in proc.stdout
    proc = _run_module("--config", TINY, "--print-config")
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == config_to_yaml(load_config(["--config", TINY]))


def test_bad_config_stops_before_heavy_imports() -> None:
    code = (
        "import sys\n"
        "from areal_m2po.train import main\n"
        "rc = main(['gconfig.n_samples=0'])\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'datasets', 'accelerate')"
        " if m in sys.modules)\n"
        "print(rc, heavy)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.strip() == "2 []", proc.stdout + proc.stderr
