"""AReaL's own example configs (tests/data/areal/examples/math at cbff54d6, vendored unchanged:
gsm8k_grpo.yaml, gsm8k_m2po.yaml, gsm8k_grpo_cpu.yaml) load here with
``--print-config``, their keys translated; elsewhere unknown keys stay one-line errors.

Expected values are read off the files (e.g. AReaL's ``max_concurrent_rollouts: 256`` prompt
groups x ``n_samples: 4`` = 1024 samples here) and AReaL's documented migrations.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from procs import REPO, subprocess_env

from areal_m2po.api.areal.config import IGNORED, areal_key_status, leaf_items
from areal_m2po.api.cli_args import ConfigError, PPOConfig
from areal_m2po.api.config_loader import config_to_yaml, leaf_keys, load_config
from areal_m2po.api.yaml_format import parse_yaml

AREAL = REPO / "tests" / "data" / "areal" / "examples" / "math"
GPU_FILES = ["gsm8k_grpo.yaml", "gsm8k_m2po.yaml"]
CPU_FILE = AREAL / "gsm8k_grpo_cpu.yaml"
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _print_config(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "areal_m2po.train", *args, "--print-config"],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _load(path: Path, *extra: str, warnings: list[str] | None = None) -> PPOConfig:
    sink = warnings if warnings is not None else []
    return load_config(["--config", str(path), *extra], warn=sink.append)


def _file_keys(path: Path) -> list[str]:
    return [k for k, _ in leaf_items(parse_yaml(path.read_text()))]


@pytest.mark.parametrize("name", GPU_FILES)
def test_gpu_files_print_config_with_one_warning_line(name):
    proc = _print_config("--config", str(AREAL / name))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: AReaL config: "), proc.stderr
    # the warning lists exactly the file's keys that have no meaning here
    ignored = [k for k in _file_keys(AREAL / name) if areal_key_status(k) == "ignored"]
    listed = lines[0].split("(docs/areal_parity.md): ", 1)[1].split(", ")
    assert listed == sorted(ignored)
    assert "cluster.n_nodes" in listed and "scheduler.type" in listed
    # the printed config is this trainer's (no AReaL key left)
    assert "cluster" not in parse_yaml(proc.stdout)


@pytest.mark.parametrize("name", GPU_FILES)
def test_gpu_files_translate_with_areals_meaning(name, tmp_path):
    warnings: list[str] = []
    cfg = _load(AREAL / name, warnings=warnings)
    assert len(warnings) == 1
    a, r = cfg.actor, cfg.rollout
    # rollout.backend "sglang:d4p1t1": our SGLang-protocol servers, asynchronous, 4 of them
    assert (r.backend, r.mode, r.n_servers, r.staleness) == ("hf", "async", 4, 0)
    assert r.max_head_offpolicyness == 2 and r.max_concurrent_rollouts == 256 * 4
    assert r.consumer_batch_size == 256 and r.queue_size is None
    # actor.backend "fsdp:d4p1t1": FSDP2 over exactly 4 processes
    assert (a.backend, a.data_parallel_size) == ("fsdp2", 4)
    # rejection_sampling {metric: ratio, upper: 5.0}: AReaL's defaults for the rest
    rs = a.rejection_sampling
    assert (rs.level, rs.action, rs.metric, rs.upper, rs.lower) == (
        "token", "mask", "ratio", 5.0, None,
    )  # fmt: skip
    assert a.use_behave_imp_weight and a.use_decoupled_loss and a.recompute_logprob
    assert a.m2_threshold == (0.04 if "m2po" in name else None)
    assert a.eps_clip == (0.0 if "m2po" in name else 0.4)
    assert a.optimizer.type == "adamw" and a.optimizer.lr == pytest.approx(1.7e-5)
    assert a.optimizer.weight_decay == pytest.approx(0.017)
    assert (a.dtype, a.gradient_checkpointing, a.disable_dropout) == ("bfloat16", True, True)
    assert a.mb_spec.max_tokens_per_mb == 10240 and a.ppo_n_minibatches == 1
    assert (a.reward_scaling, a.reward_bias, a.kl_ctl) == (10.0, -0.5, 0.0)
    assert (a.reward_norm.mean_level, a.reward_norm.group_size) == ("group", 4)
    assert (a.adv_norm.mean_level, a.adv_norm.std_level) == ("batch", "batch")
    assert cfg.ref.path == a.path and cfg.ref.mb_spec.max_tokens_per_mb == 10240
    assert cfg.tokenizer_path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert (cfg.gconfig.n_samples, cfg.gconfig.max_new_tokens) == (4, 1024)
    assert cfg.train_dataset.max_prompt_length == 1024 and cfg.train_dataset.batch_size == 256
    assert (cfg.total_train_epochs, cfg.total_train_steps, cfg.seed) == (10, None, 1)
    assert (cfg.saver.freq_epochs, cfg.saver.freq_steps, cfg.saver.save_at_end) == (1, None, False)
    assert (cfg.recover.mode, cfg.recover.freq_epochs, cfg.recover.freq_secs) == (
        "disabled", 1, 3600,
    )  # fmt: skip
    assert (cfg.evaluator.freq_epochs, cfg.evaluator.eval_at_start) == (1, False)
    assert (r.vllm.max_model_len, r.vllm.dtype) == (32768, "bfloat16")
    # the printed YAML is this trainer's config: loading it gives the same config, silently
    saved = tmp_path / "printed.yaml"
    saved.write_text(config_to_yaml(cfg))
    again: list[str] = []
    assert _load(saved, warnings=again) == cfg and again == []


def test_cpu_file_translates_with_areals_meaning():
    # vLLM servers may run from another interpreter (rollout.vllm.python): then this
    # environment needs no vLLM to load the file
    cfg = _load(CPU_FILE, f"rollout.vllm.python={sys.executable}")
    r, a = cfg.rollout, cfg.actor
    assert (r.backend, r.mode, r.n_servers, r.vllm_placement) == ("vllm", "async", 1, "servers")
    assert r.max_concurrent_rollouts == 16 * 2
    assert (a.backend, a.data_parallel_size, a.attn_implementation) == ("ddp", 1, "sdpa")
    rs = a.rejection_sampling
    assert (rs.level, rs.action, rs.metric, rs.upper) == ("token", "mask", "ratio", 5.0)
    assert (r.vllm.max_model_len, r.vllm.gpu_memory_utilization) == (2048, 0.8)
    assert cfg.ref.attn_implementation == "sdpa"
    assert cfg.train_dataset.max_prompt_length == 512 and cfg.valid_dataset.batch_size == 32


def test_cpu_file_print_config_here():
    """The file loads and prints whether or not vLLM is here (building a config looks up no
    package); without vLLM, a run of it stops at start-up in one line saying vLLM is missing,
    before any model loads."""
    proc = _print_config("--config", str(CPU_FILE))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("\n") == 1 and "warning: AReaL config" in proc.stderr
    assert parse_yaml(proc.stdout)["rollout"]["backend"] == "vllm"
    if HAS_VLLM:
        return
    run = subprocess.run(
        [sys.executable, "-m", "areal_m2po.train", "--config", str(CPU_FILE)],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2
    lines = [line for line in run.stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: rollout.backend: vllm: vLLM is not")
    assert "Traceback" not in run.stderr


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM (run in the vLLM venv)")
def test_cpu_file_print_config_with_vllm():
    proc = _print_config("--config", str(CPU_FILE))
    assert proc.returncode == 0, proc.stderr
    assert parse_yaml(proc.stdout)["rollout"]["backend"] == "vllm"


# ---------------------------------------------------------------------------------------------
# the switch, and unknown keys elsewhere
# ---------------------------------------------------------------------------------------------


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_an_areal_key_in_our_file_stays_an_error_with_a_suggestion(tmp_path):
    path = _write(tmp_path, "actor:\n  attn_impl: eager\n")
    with pytest.raises(ConfigError, match=r"^actor.attn_impl: unknown key .*attn_implementation"):
        _load(path)
    proc = _print_config("--config", str(path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


@pytest.mark.parametrize("how", ["flag", "key"], ids=["--areal-compat", "areal_compat: true"])
def test_the_switch_reads_a_file_as_areals(tmp_path, how):
    text = "actor:\n  attn_impl: eager\n  optimizer:\n    type: adam\n"
    if how == "key":
        text = "areal_compat: true\n" + text
    args = ["--areal-compat"] if how == "flag" else []
    warnings: list[str] = []
    cfg = load_config(["--config", str(_write(tmp_path, text)), *args], warn=warnings.append)
    assert cfg.actor.attn_implementation == "eager" and cfg.actor.optimizer.type == "adamw"
    assert warnings == []  # nothing ignored, nothing to say
    # AReaL's defaults for what the file leaves out: no M2PO, no decoupled loss, ...
    assert cfg.actor.m2_threshold is None and not cfg.actor.use_decoupled_loss
    assert cfg.actor.adv_norm is None and cfg.total_train_steps is None


def test_areal_compat_false_is_a_plain_file_and_other_values_are_refused(tmp_path):
    cfg = load_config(["--config", str(_write(tmp_path, "areal_compat: false\nseed: 3\n"))])
    assert cfg.seed == 3 and cfg.actor.m2_threshold == 0.04  # this trainer's defaults
    with pytest.raises(ConfigError, match="^areal_compat: must be true or false"):
        load_config(["--config", str(_write(tmp_path, "areal_compat: 1\n"))])


def test_an_unknown_key_in_an_areal_file_is_still_an_error(tmp_path):
    path = _write(tmp_path, "cluster:\n  n_nodes: 1\nactor:\n  eps_clp: 0.2\n")
    with pytest.raises(ConfigError, match=r"^actor.eps_clp: unknown key .*actor.eps_clip"):
        _load(path)


def test_overrides_in_areal_mode_use_areals_keys_too(tmp_path):
    path = _write(tmp_path, "cluster:\n  n_nodes: 1\n")
    warnings: list[str] = []
    cfg = _load(path, "actor.attn_impl=eager", "scheduler.type=local", "seed=4", warnings=warnings)
    assert cfg.actor.attn_implementation == "eager" and cfg.seed == 4
    assert warnings and warnings[0].endswith("cluster.n_nodes, scheduler.type")


# ---------------------------------------------------------------------------------------------
# values this trainer maps, and those it cannot honour
# ---------------------------------------------------------------------------------------------

BAD = [
    ("actor:\n  backend: megatron:d4p1t2\n", "actor.backend", "megatron backend is not supported"),
    ("actor:\n  backend: fsdp:d2p1t2\n", "actor.backend", "pipeline/tensor parallelism"),
    ("rollout:\n  backend: sglang:d2p1t2\n", "rollout.backend", "rollout.server_addrs"),
    ("rollout:\n  backend: lmdeploy:d1\n", "rollout.backend", "must be sglang"),
    ("rollout:\n  backend: vllm:d1c2\n", "rollout.backend", "c2 \\(context/expert"),
    ("rollout:\n  backend: d4p1t1\n", "rollout.backend", "must be sglang"),
    ("actor:\n  init_from_scratch: true\n", "actor.init_from_scratch", "not supported"),
    ("actor:\n  optimizer:\n    type: adam_bf16\n", "actor.optimizer.type", "adam_bf16"),
    ("vllm:\n  model: other\n", "vllm.model", "must equal actor.path"),
    ("rollout:\n  tokenizer_path: other\n", "rollout.tokenizer_path", "must equal"),
    ("actor:\n  backend: fsdp:d2\nref:\n  backend: fsdp:d4\n", "ref.backend", "must equal"),
    (
        "actor:\n  behave_imp_weight_cap: 2.0\n  rejection_sampling:\n    upper: 3.0\n",
        "actor.behave_imp_weight_cap",
        "not both",
    ),
    ("train_dataset:\n  batch_size: 4\nrollout:\n  consumer_batch_size: 8\n",
     "rollout.consumer_batch_size", "set it to 4 or null"),
    ("rollout:\n  backend: sglang:d1\n  queue_size: 1\n  max_head_offpolicyness: 1\n"
     "train_dataset:\n  batch_size: 4\n", "rollout.queue_size", "lower rollout.max_head"),
]  # fmt: skip


@pytest.mark.parametrize("text, key, message", BAD)
def test_what_cannot_be_honoured_is_one_line_naming_the_key(tmp_path, text, key, message):
    path = _write(tmp_path, "cluster:\n  n_nodes: 1\n" + text)
    with pytest.raises(ConfigError, match=message) as err:
        _load(path)
    assert err.value.key == key and "\n" not in str(err.value)


def test_mapped_values(tmp_path):
    text = (
        "cluster:\n  n_nodes: 1\nallocation_mode: sglang.d2p1t1+d2p1t1\n"
        "actor:\n  behav_imp_weight_cap: 3.0\n  behav_imp_weight_mode: sequence_truncate\n"
        "  use_decoupled_loss: true\n"
        "recover:\n  mode: 'on'\nevaluator:\n  eval_before_train: true\n"
    )
    cfg = _load(_write(tmp_path, text))
    assert (cfg.rollout.backend, cfg.rollout.n_servers, cfg.rollout.mode) == ("hf", 2, "async")
    assert (cfg.actor.backend, cfg.actor.data_parallel_size) == ("fsdp2", 2)
    rs = cfg.actor.rejection_sampling
    assert (rs.level, rs.action, rs.upper) == ("sequence", "clamp", 3.0)
    assert cfg.recover.mode == "auto" and cfg.evaluator.eval_at_start
    text = "cluster: {}\nrollout:\n  backend: vllm:d2p1t2\n"
    cfg = _load(_write(tmp_path, text), "rollout.vllm.python=/bin/false")
    assert cfg.rollout.vllm.server_args == ["--tensor-parallel-size", "2"]
    assert (cfg.rollout.backend, cfg.rollout.n_servers) == ("vllm", 2)


def _doc_table() -> dict[str, str]:
    """``key -> status`` of the key table in docs/areal_parity.md."""
    rows = {}
    for line in (REPO / "docs" / "areal_parity.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`") and cells[1] in STATUSES:
            rows[cells[0].strip("`")] = cells[1]
    return rows


STATUSES = ("honoured", "mapped", "ignored")


def test_the_docs_table_lists_every_key_of_the_three_files_with_its_status():
    table = _doc_table()
    three = [AREAL / name for name in (*GPU_FILES, CPU_FILE.name)]
    keys = sorted({k for path in three for k in _file_keys(path)})
    assert len(keys) > 100
    missing = [k for k in keys if k not in table]
    assert not missing, f"not in docs/areal_parity.md: {missing}"
    wrong = {k: (table[k], areal_key_status(k)) for k in keys if table[k] != areal_key_status(k)}
    assert not wrong, wrong
    assert all(why for why in IGNORED.values())
    # an honoured key is this trainer's own key, with AReaL's name
    ours = set(leaf_keys())
    assert [k for k in keys if table[k] == "honoured" and k not in ours] == []
