"""AReaL keys whose meaning takes more than a rename (areal_m2po/api/areal/sections.py): each
case is a small AReaL file (``cluster:`` makes it AReaL's) with the values read off AReaL's
cli_args at cbff54d6."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_m2po.api.cli_args import ConfigError, PPOConfig
from areal_m2po.api.config_loader import load_config


def _load(tmp_path: Path, text: str, *extra: str) -> tuple[PPOConfig, list[str]]:
    path = tmp_path / "areal.yaml"
    path.write_text("cluster:\n  n_nodes: 1\n" + text)
    warnings: list[str] = []
    cfg = load_config(["--config", str(path), *extra], warn=warnings.append)
    return cfg, warnings


def _ignored(warnings: list[str]) -> list[str]:
    assert len(warnings) == 1
    return warnings[0].split("(docs/areal_parity.md): ", 1)[1].split(", ")


def _refused(tmp_path: Path, text: str, *extra: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text, *extra)
    assert "\n" not in str(err.value) and "did you mean" not in str(err.value)
    return err.value


def test_server_knobs_left_over_go_into_the_one_warning_line(tmp_path):
    text = (
        "sglang:\n  attention_backend: fa3\n  disable_radix_cache: true\n  random_seed: 1\n"
        "vllm:\n  enforce_eager: true\n  max_model_len: 2048\n"
        "seed: 1\n"
    )
    cfg, warnings = _load(tmp_path, text)
    listed = _ignored(warnings)
    for key in ("sglang.attention_backend", "sglang.disable_radix_cache", "vllm.enforce_eager"):
        assert key in listed
    # the keys mapped before are not among them, and still mean what they meant
    assert "sglang.random_seed" not in listed and "vllm.max_model_len" not in listed
    assert cfg.rollout.vllm.max_model_len == 2048


def test_engine_knobs_without_meaning_here_are_listed(tmp_path):
    text = (
        "actor:\n  pad_to_maximum: true\n  mb_spec:\n    packing_algorithm: kk\n"
        "    granularity: 4\n    n_mbs_divisor: 2\n    max_tokens_per_mb: 512\n"
        "recover:\n  retries: 5\nrollout:\n  request_retries: 7\n"
    )
    cfg, warnings = _load(tmp_path, text)
    assert set(_ignored(warnings)) == {
        "cluster.n_nodes",
        "actor.pad_to_maximum",
        "actor.mb_spec.packing_algorithm",
        "actor.mb_spec.granularity",
        "actor.mb_spec.n_mbs_divisor",
        "recover.retries",
        "rollout.request_retries",
    }
    assert cfg.actor.mb_spec.max_tokens_per_mb == 512  # the rest of the section stays


def test_a_critic_section_builds_a_critic_as_in_areal(tmp_path):
    text = "critic:\n  is_critic: true\n  eps_clip: 0.5\n  ppo_n_minibatches: 2\n"
    cfg, _ = _load(tmp_path, text)
    assert cfg.critic.enabled and cfg.critic.value_eps_clip == 0.5
    assert cfg.critic.ppo_n_minibatches == 2
    # AReaL builds one whenever the section exists, is_critic or not
    cfg, _ = _load(tmp_path, "critic:\n  path: builtin:tiny\n")
    assert cfg.critic.enabled and cfg.critic.path == "builtin:tiny"
    # no section (or a null one): no critic, as in AReaL
    assert not _load(tmp_path, "seed: 1\n")[0].critic.enabled
    assert not _load(tmp_path, "critic: null\n")[0].critic.enabled
    err = _refused(tmp_path, "critic:\n  is_critic: false\n")
    assert err.key == "critic.is_critic"


def test_areal_flat_lora_keys_become_the_lora_section(tmp_path):
    text = (
        "rollout:\n  use_lora: true\n"
        "actor:\n  use_lora: ${rollout.use_lora}\n  peft_type: lora\n  lora_rank: 8\n"
        "  lora_alpha: 24\n  target_modules: [q_proj, v_proj]\n"
        "gconfig:\n  lora_name: lora-gsm8k\n"
    )
    cfg, warnings = _load(tmp_path, text)
    lora = cfg.actor.lora
    assert (lora.r, lora.alpha, lora.target_modules) == (8, 24.0, ["q_proj", "v_proj"])
    assert "gconfig.lora_name" in _ignored(warnings)
    # AReaL's defaults (rank 32, alpha 16); all-linear is every linear layer
    cfg, _ = _load(tmp_path, "actor:\n  use_lora: true\n  target_modules: [all-linear]\n")
    assert (cfg.actor.lora.r, cfg.actor.lora.alpha, cfg.actor.lora.target_modules) == (
        32,
        16.0,
        None,
    )
    cfg, _ = _load(tmp_path, "actor:\n  use_lora: false\n  lora_rank: 8\n")
    assert cfg.actor.lora is None
    assert _refused(tmp_path, "actor:\n  use_lora: true\n  peft_type: ia3\n").key == (
        "actor.peft_type"
    )
    err = _refused(tmp_path, "rollout:\n  use_lora: true\nactor:\n  use_lora: false\n")
    assert err.key == "rollout.use_lora"


def test_the_teacher_section_maps_with_areals_defaults(tmp_path):
    text = (
        "teacher:\n  engine_type: rollout\n  path: builtin:tiny\n  rl_loss_weight: 0.5\n"
        "  rollout:\n    backend: 'vllm:d1p1t2'\n"
    )
    cfg, warnings = _load(tmp_path, text)
    t = cfg.teacher
    assert (t.path, t.rl_loss_weight, t.distill_loss_weight) == ("builtin:tiny", 0.5, 0.005)
    assert t.center_reverse_kl is False  # AReaL's raw log-ratio
    assert {"teacher.engine_type", "teacher.rollout.backend"} <= set(_ignored(warnings))
    cfg, _ = _load(tmp_path, "teacher:\n  path: builtin:tiny\n  backend: 'fsdp:d1'\n")
    assert cfg.teacher.distill_loss_weight == 0.005
    err = _refused(tmp_path, "teacher:\n  path: builtin:tiny\n  backend: 'fsdp:d1p1t4'\n")
    assert err.key == "teacher.backend" and "tensor" in str(err)


def test_min_lr_ratio_reaches_the_optimizer_config(tmp_path):
    text = "actor:\n  optimizer:\n    lr_scheduler_type: cosine\n    min_lr_ratio: 0.1\n"
    cfg, _ = _load(tmp_path, text)
    assert cfg.actor.optimizer.min_lr_ratio == 0.1


def test_dynamic_bs(tmp_path):
    cfg, _ = _load(tmp_path, "dynamic_bs: true\nactor:\n  dynamic_sampling: true\n")
    assert cfg.rollout.dynamic_filtering
    assert _load(tmp_path, "dynamic_bs: false\n")[0]  # nothing filtered: the same
    err = _refused(tmp_path, "dynamic_bs: false\nactor:\n  dynamic_sampling: true\n")
    assert err.key == "dynamic_bs"


def test_rejection_sampling_that_weighs_nothing_is_dropped_and_listed(tmp_path):
    # AReaL's SAPO example: no decoupled loss, no recompute, so pi_prox/pi_behave = 1
    text = (
        "actor:\n  use_decoupled_loss: false\n  recompute_logprob: false\n"
        "  rejection_sampling:\n    metric: ratio\n    upper: 5.0\n"
    )
    cfg, warnings = _load(tmp_path, text)
    assert cfg.actor.rejection_sampling is None and not cfg.actor.use_behave_imp_weight
    listed = _ignored(warnings)
    assert {"actor.rejection_sampling.metric", "actor.rejection_sampling.upper"} <= set(listed)
    # with the decoupled loss it applies, as before
    cfg, _ = _load(tmp_path, text.replace("use_decoupled_loss: false", "use_decoupled_loss: true"))
    assert cfg.actor.rejection_sampling.upper == 5.0 and cfg.actor.use_behave_imp_weight


def test_agent_example_keys(tmp_path):
    text = (
        "workflow: my_agents.math.MathAgent\neval_workflow: ${workflow}\n"
        "rollout:\n  agent:\n    export_style: concat\n    engine_max_tokens: 300\n"
        "    admin_api_key: secret\n    session_timeout_seconds: 60\n"
    )
    cfg, warnings = _load(tmp_path, text)
    assert cfg.rollout.workflow == "agent"
    assert cfg.rollout.workflow_kwargs == {"agent": "my_agents.math:MathAgent"}
    assert cfg.rollout.max_episode_tokens == 300
    listed = _ignored(warnings)
    assert {"rollout.agent.admin_api_key", "rollout.agent.session_timeout_seconds"} <= set(listed)
    err = _refused(tmp_path, "workflow: a.B\neval_workflow: a.C\n")
    assert err.key == "eval_workflow"
    err = _refused(tmp_path, "rollout:\n  agent:\n    prefix_matcher: my.matcher\n")
    assert err.key == "rollout.agent.prefix_matcher"


def test_prox_logp_method_metrics_is_the_recompute(tmp_path):
    text = "actor:\n  use_decoupled_loss: true\n  prox_logp_method: metrics\n"
    assert _load(tmp_path, text)[0].actor.prox_logp_method == "recompute"


@pytest.mark.parametrize(
    "text, key, words",
    [
        ("sglang:\n  enable_multimodal: true\n", "sglang.enable_multimodal", "vision-language"),
        (
            "actor:\n  backend: 'megatron:(attn:d2p1t4|ffn:d1p1e8)'\n",
            "actor.backend",
            "hybrid MoE",
        ),
        ("rollout:\n  _version: v2\n", "rollout._version", "agent service"),
        ("tir:\n  max_turns: 2\n", "tir", "example script"),
        ("econfig:\n  domain: airline\n", "econfig", "example script"),
    ],
)
def test_what_cannot_be_done_is_one_line_naming_the_feature(tmp_path, text, key, words):
    err = _refused(tmp_path, text)
    assert err.key == key and words in str(err)


def test_the_multi_turn_math_example_runs_as_the_retry_workflow(tmp_path):
    """examples/multi_turn_math: AReaL trains the concat leaf (the last turn) on its own reward,
    so the discount is 1; max_turns comes from agent_run_args (the example's default 2)."""
    cfg, _ = _load(tmp_path, "export_style: concat\nagent_run_args:\n  max_turns: 3\n")
    assert cfg.rollout.workflow == "multi_turn"
    kwargs = cfg.rollout.workflow_kwargs
    assert kwargs == {"environment": "retry", "max_turns": 3, "turn_discount": 1.0}
    cfg, _ = _load(tmp_path, "export_style: concat\n")
    assert cfg.rollout.workflow_kwargs["max_turns"] == 2
    assert _refused(tmp_path, "export_style: individual\n").key == "export_style"
    assert _refused(tmp_path, "agent_run_args:\n  temperature: 1\n").key == "agent_run_args"
