"""AReaL sections and keys whose meaning here takes more than a rename: the ``critic`` section
(AReaL builds a critic whenever it exists), the flat LoRA keys of ``actor``, the ``teacher``
section, the micro-batch and retry knobs of AReaL's own engines, and the leftover knobs of the
SGLang/vLLM servers an AReaL file configures but this trainer does not start that way.

:mod:`areal_m2po.api.areal.config` merges :data:`IGNORED_MORE` into its ignored keys and
:data:`MAPPED_MORE` into its mapped ones, and calls :func:`map_sections` (after the ignored keys
are dropped) and :func:`drop_server_leftovers` (after the server keys it maps are read). Plain
dicts in and out; imports only :mod:`areal_m2po.api.errors`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from areal_m2po.api.areal.tree import LORA_DEFAULTS, MISSING, leaf_items, lora_section, pop
from areal_m2po.api.errors import ConfigError

__all__ = [
    "LORA_DEFAULTS",
    "AREAL_TOP_KEYS",
    "IGNORED_MORE",
    "MAPPED_MORE",
    "SERVER_LEFTOVERS",
    "check_script_keys",
    "drop_idle_rejection_sampling",
    "drop_server_leftovers",
    "map_sections",
]

IGNORED_MORE: dict[str, str] = {
    "*.mb_spec.packing_algorithm": "AReaL's choice of bin-packing (ffd, kk) of sequences into "
    "micro-batches; here micro-batches are filled in order up to max_tokens_per_mb (the "
    "gradient does not depend on the split)",
    "*.mb_spec.granularity": "AReaL keeps this many adjacent sequences in one micro-batch "
    "when it splits; here a group is split only by max_tokens_per_mb (the gradient does not "
    "depend on the split)",
    "*.mb_spec.n_mbs_divisor": "rounds AReaL's micro-batch count to a multiple (for pipeline "
    "parallelism, which this trainer does not have)",
    "*.pad_to_maximum": "AReaL pads each micro-batch to its token budget against memory "
    "fragmentation; the values are the same, only memory and time differ",
    "recover.retries": "AReaL's launcher restarts a failed run this many times; here a "
    "restarted command resumes from the last recover checkpoint (recover.mode=auto)",
    "rollout.request_retries": "AReaL resends a failed request to its inference server; here "
    "a failed server is dropped, its requests continue on the others with "
    "rollout.tolerate_server_failures",
    "rollout.pause_grace_period": "AReaL's wait after pausing its servers for a weight update",
    "rollout.workers_ready_timeout": "AReaL's wait for its rollout workers to start",
    "rollout.check_trajectory_format": "AReaL's debug check of a custom workflow's output "
    "format (a debugging aid; it changes no result)",
    "*.grad_reduce_dtype": "the gradient-reduce dtype of AReaL's engines; here "
    "actor.fsdp.reduce_dtype (backend fsdp2) sets it",
    "*.fsdp.memory_efficient_load": "AReaL's rank-0 weight load for large models; the weights "
    "are the same",
    "gconfig.lora_name": "the adapter's name in AReaL's inference servers; the engine names it",
    "teacher.rollout": "where AReaL's teacher runs (its own inference servers); here it is "
    "placed like the reference model and scores the same log-probs",
    "teacher.engine_type": "rollout and train are two places AReaL's teacher runs; here it is "
    "placed like the reference model",
    "teacher.offload": "AReaL's offload of its teacher servers between steps",
    "teacher.optimizer": "the teacher is never trained",
    "teacher.disable_dropout": "the teacher always runs in eval mode (no dropout)",
    "teacher.mb_spec": "the teacher scores with the actor's micro-batch split here",
    "*.log_agent_stats": "AReaL's logging of extra per-trajectory fields an agent returns",
    "*.log_agent_stats_keys": "AReaL's logging of extra per-trajectory fields an agent returns",
    "*.admin_api_key": "the admin key of AReaL's proxy and agent service; the agent endpoint "
    "here makes its own key per run",
    "rollout.agent.session_timeout_seconds": "garbage collection of idle sessions in AReaL's "
    "proxy; here an episode's session closes with the episode (rollout.episode_timeout_s)",
    "rollout.agent.drop_retry_orphans": "AReaL's proxy keeps a retried request's first "
    "completion unless this is set; the endpoint here answers a retried request once",
    "rollout.agent.set_reward_finish_timeout": "AReaL's proxy's wait for late reward updates",
    "memory_profiler": "AReaL's CUDA memory profiler",
    "post_exit_hook": "a command AReaL's launcher runs after the experiment exits",
}
"""AReaL keys dropped and listed in the warning line (same form as ``areal_config.IGNORED``)."""

SERVER_LEFTOVERS: dict[str, str] = {
    "sglang": "a knob of the SGLang server AReaL starts (kernels, caches, memory, logging, "
    "limits); our SGLang-protocol servers have none of these, SGLang servers you start "
    "yourself take them on their command line",
    "vllm": "a knob of the vLLM server AReaL starts that rollout.vllm does not have "
    "(rollout.vllm.server_args passes any vLLM flag)",
}
"""The ``sglang``/``vllm`` keys left after the ones this trainer maps (model, seed, dtype,
context length, memory share, ...): ignored."""

MAPPED_MORE: dict[str, str] = {
    "critic.is_critic": "true: the critic section builds a critic (critic.enabled), as AReaL "
    "builds one whenever the section exists (also without this key); false is refused",
    "critic.eps_clip": "renamed: critic.value_eps_clip (clip of the value loss around the old "
    "values, AReaL's meaning)",
    "actor.use_lora": "true: actor.lora {r: lora_rank, alpha: lora_alpha, target_modules} "
    "(AReaL's defaults 32 and 16; [all-linear] or [] is every linear layer); false: no LoRA",
    "actor.lora_rank": "actor.lora.r",
    "actor.lora_alpha": "actor.lora.alpha",
    "actor.target_modules": "actor.lora.target_modules",
    "actor.peft_type": "must be lora (AReaL supports only lora), then dropped",
    "rollout.use_lora": "must equal actor.use_lora (one setting here), then dropped",
    "teacher.backend": "'fsdp:dN' (the actor's data parallelism) checked, then dropped: the "
    "teacher is placed like the reference model",
    "teacher.distill_loss_weight": "same key; AReaL's default 0.005 when the file leaves it out",
    "teacher.center_reverse_kl": "AReaL's raw log-ratio (false) when the file leaves it out",
    "dynamic_bs": "true: a step trains on the groups rollout.dynamic_filtering keeps, without "
    "refilling the batch, as here always; false with dynamic filtering (AReaL refills the "
    "batch) is refused; false without it changes nothing, then dropped",
    "rollout.agent.engine_max_tokens": "rollout.max_episode_tokens (prompt + completion of an "
    "episode's last request; the smaller where both are set)",
    "rollout.agent.message_preprocessors": "[] dropped; hooks of AReaL's proxy are refused",
    "rollout.agent.prefix_matcher": "null dropped; hooks of AReaL's proxy are refused",
    "rollout.agent.agent_cls_path": "'' dropped; AReaL's agent service is refused",
    "actor.prox_logp_method": "metrics (AReaL: recompute, and log how far its "
    "approximations are from it): recompute, without those extra metrics",
    "workflow": "the agent class of AReaL's agent example script: rollout.workflow agent, "
    "rollout.workflow_kwargs.agent 'module:Class' (docs/agents.md)",
    "eval_workflow": "must equal workflow (evaluation runs the training workflow), then dropped",
    "export_style": "of AReaL's multi-turn math example script: concat runs it as rollout.workflow "
    "multi_turn, environment retry, turn_discount 1 (concat exports the last turn, whose reward "
    "is its own); individual (a row per turn) is refused",
    "agent_run_args.max_turns": "of the multi-turn math example: "
    "rollout.workflow_kwargs.max_turns (the example's default 2)",
    "*._version": "v1 (AReaL's default controller) dropped; v2 (AReaL's inference and agent "
    "service) is refused",
}

AREAL_TOP_KEYS = frozenset(
    {
        "actor", "allocation_mode", "cluster", "critic", "dynamic_bs", "enable_offload",
        "eval_gconfig", "evaluator", "experiment_name", "gconfig", "memory_profiler",
        "perf_tracer", "post_exit_hook", "recover", "ref", "rollout", "saver", "scheduler",
        "seed", "sglang", "stats_logger", "teacher", "tokenizer_path", "total_train_epochs",
        "total_train_n_seqs", "total_train_steps", "train_dataset", "trial_name",
        "valid_dataset", "vllm",
    }
)  # fmt: skip
"""Top-level keys of AReaL's ``PPOConfig`` (``areal/api/cli_args.py`` at cbff54d6); an AReaL
file's other top-level keys belong to the config class of the example script it is for."""
"""AReaL keys rewritten onto this trainer's (same form as ``areal_config.MAPPED``)."""


def map_sections(tree: dict[str, Any]) -> None:
    """The critic, LoRA, teacher, agent-service and ``dynamic_bs`` rewrites of
    :data:`MAPPED_MORE`, in place.

    Raises:
        ConfigError: a value this trainer cannot honour (``critic.is_critic: false``, a
            ``peft_type`` other than lora, ``rollout.use_lora`` unlike ``actor.use_lora``).
    """
    for server in SERVER_LEFTOVERS:
        if (tree.get(server) or {}).get("enable_multimodal") is True:
            raise ConfigError(
                f"{server}.enable_multimodal",
                "true (a vision-language model with image inputs) is not supported; this "
                "trainer trains text-only causal LMs",
            )
    _map_critic(tree)
    _map_lora(tree)
    _map_teacher(tree)
    _map_service_keys(tree)
    _map_dynamic_bs(tree)
    _map_agent_workflow(tree)
    _map_multi_turn_math(tree)
    actor = tree.get("actor")
    if isinstance(actor, dict) and actor.get("prox_logp_method") == "metrics":
        actor["prox_logp_method"] = "recompute"


def _map_agent_workflow(tree: dict[str, Any]) -> None:
    """AReaL's agent example (``examples/agent_workflow``): a top-level ``workflow`` naming the
    agent class its script runs in agent mode, ``eval_workflow`` the same one."""
    agent = tree.pop("workflow", MISSING)
    if agent is MISSING:
        return
    if not isinstance(agent, str) or "." not in agent:
        raise ConfigError("workflow", f"must be the dotted path of an agent, got {agent!r}")
    evaluated = tree.pop("eval_workflow", agent)
    if evaluated != agent:
        raise ConfigError(
            "eval_workflow",
            f"must equal workflow ({agent!r}): evaluation runs the training workflow here",
        )
    module, _, name = agent.rpartition(".")
    rollout = tree.setdefault("rollout", {})
    rollout["workflow"] = "agent"
    rollout["workflow_kwargs"] = {
        **(rollout.get("workflow_kwargs") or {}),
        "agent": f"{module}:{name}",
    }


def _map_multi_turn_math(tree: dict[str, Any]) -> None:
    """AReaL's multi-turn math example (``examples/multi_turn_math``, its config class adds
    ``export_style`` and ``agent_run_args``): the policy answers, a wrong answer is told to try
    again, up to ``max_turns``; here the built-in ``multi_turn`` workflow with the ``retry``
    environment. With ``concat`` AReaL trains the whole conversation on its last turn's own
    reward (the discount reaches only earlier turns, which concat does not export), so the
    discount is 1."""
    style = tree.pop("export_style", MISSING)
    run_args = tree.pop("agent_run_args", MISSING)
    if style is MISSING and run_args is MISSING:
        return
    if style not in (MISSING, "concat"):
        raise ConfigError(
            "export_style",
            f"{style!r} is not supported for the multi-turn math example: a group here is one "
            "row per episode; use concat",
        )
    run_args = {} if run_args in (MISSING, None) else run_args
    if not isinstance(run_args, dict) or set(run_args) - {"max_turns"}:
        raise ConfigError("agent_run_args", f"only max_turns is known here, got {run_args!r}")
    rollout = tree.setdefault("rollout", {})
    rollout["workflow"] = "multi_turn"
    rollout["workflow_kwargs"] = {
        **(rollout.get("workflow_kwargs") or {}),
        "environment": "retry",
        "max_turns": run_args.get("max_turns", 2),
        "turn_discount": 1.0,
    }


def drop_idle_rejection_sampling(tree: dict[str, Any]) -> list[str]:
    """AReaL's ``rejection_sampling`` without the decoupled loss and without a recompute: its
    weight pi_prox/pi_behave is 1 on every token (the proximal policy is the behaviour one),
    and AReaL's SAPO loss does not read it at all; dropped (refused here otherwise). Returns
    the dropped keys (for the warning line)."""
    actor = tree.get("actor")
    if not isinstance(actor, dict) or not isinstance(actor.get("rejection_sampling"), dict):
        return []
    if actor.get("use_decoupled_loss") is not False or actor.get("recompute_logprob") is True:
        return []
    if actor.get("use_cispo_loss") is True:  # CISPO reads it with its own proximal
        return []
    section = actor.pop("rejection_sampling")
    actor["rejection_sampling"] = None
    return [f"actor.rejection_sampling.{k}" for k in section]


def check_script_keys(tree: Mapping[str, Any], known: frozenset[str] | set[str]) -> None:
    """Refuse a top-level key that neither AReaL's ``PPOConfig`` nor this trainer has: it
    configures the AReaL example script the file is for (its own config class), whose code
    does not run here. ``known``: this trainer's top-level keys.

    Raises:
        ConfigError: naming the first such key, without a "did you mean".
    """
    for key in tree:
        if key not in known and key not in AREAL_TOP_KEYS:
            raise ConfigError(
                key,
                "not a key of AReaL's PPOConfig: it belongs to the config class of the AReaL "
                "example script this file is for, whose workflow code does not run here (this "
                "trainer's workflows: rollout.workflow, docs/rollout.md)",
            )


def _map_service_keys(tree: dict[str, Any]) -> None:
    """AReaL's controller version and agent-proxy hooks: defaults dropped, the rest refused."""
    for section in ("actor", "rollout", "ref", "critic"):
        version = pop(tree.get(section), "_version")
        if version not in (MISSING, "v1"):
            raise ConfigError(
                f"{section}._version",
                f"{version!r} (AReaL's inference and agent service) is not supported; this "
                "trainer runs its own rollout and agent endpoint (docs/agents.md)",
            )
    agent = (tree.get("rollout") or {}).get("agent")
    if not isinstance(agent, dict):
        return
    for key, empty in (("message_preprocessors", []), ("prefix_matcher", None)):
        value = pop(agent, key)
        if value not in (MISSING, empty, None):
            raise ConfigError(
                f"rollout.agent.{key}",
                f"{value!r}: hooks of AReaL's agent proxy are not supported",
            )
    path = pop(agent, "agent_cls_path")
    if path not in (MISSING, "", None):
        raise ConfigError(
            "rollout.agent.agent_cls_path",
            f"{path!r}: AReaL's agent service is not supported; give the agent as "
            "rollout.workflow: agent with workflow_kwargs (docs/agents.md)",
        )
    limit = pop(agent, "engine_max_tokens")
    if isinstance(limit, int) and not isinstance(limit, bool):
        rollout = tree["rollout"]
        now = rollout.get("max_episode_tokens")
        rollout["max_episode_tokens"] = limit if now is None else min(now, limit)


def _map_dynamic_bs(tree: dict[str, Any]) -> None:
    value = tree.pop("dynamic_bs", MISSING)
    filtering = (tree.get("rollout") or {}).get("dynamic_filtering") is True or (
        tree.get("actor") or {}
    ).get("dynamic_sampling") is True  # AReaL's older name, renamed later
    if value is False and filtering:
        raise ConfigError(
            "dynamic_bs",
            "false (refill the batch with new groups when dynamic filtering drops some) is "
            "not supported: a step trains on the groups kept; set true",
        )
    if value not in (MISSING, True, False):
        raise ConfigError("dynamic_bs", f"must be true or false, got {value!r}")


def _map_critic(tree: dict[str, Any]) -> None:
    critic = tree.get("critic")
    if not isinstance(critic, dict):
        return
    is_critic = pop(critic, "is_critic")
    if is_critic is False:
        raise ConfigError(
            "critic.is_critic",
            "false (a critic section that is not a value model) is not supported; the critic "
            "section builds a value model here, as with true",
        )
    eps_clip = pop(critic, "eps_clip")
    if eps_clip is not MISSING:
        critic["value_eps_clip"] = eps_clip


def _map_lora(tree: dict[str, Any]) -> None:
    actor = tree.get("actor")
    if not isinstance(actor, dict):
        return
    use = pop(actor, "use_lora")
    rollout_use = pop(tree.get("rollout"), "use_lora")
    flat = {k: pop(actor, k) for k in ("lora_rank", "lora_alpha", "target_modules", "peft_type")}
    if rollout_use is not MISSING and rollout_use != (False if use is MISSING else use):
        raise ConfigError(
            "rollout.use_lora",
            f"must equal actor.use_lora ({use!r}): this trainer has one setting for both, "
            f"got {rollout_use!r}",
        )
    peft = flat.pop("peft_type")
    if peft not in (MISSING, "lora"):
        raise ConfigError("actor.peft_type", f"only lora is supported (as in AReaL), got {peft!r}")
    if use is not True:
        if use not in (MISSING, False, None):
            raise ConfigError("actor.use_lora", f"must be true or false, got {use!r}")
        return
    if actor.get("lora") is not None:
        raise ConfigError("actor.use_lora", "give actor.lora or AReaL's flat LoRA keys, not both")
    actor["lora"] = lora_section(flat)


def _map_teacher(tree: dict[str, Any]) -> None:
    teacher = tree.get("teacher")
    if not isinstance(teacher, dict):
        return
    teacher.setdefault("distill_loss_weight", 0.005)
    teacher.setdefault("center_reverse_kl", False)
    if teacher.get("path") in ("", None):  # AReaL's "": the shared rollout model
        raise ConfigError("teacher.path", "must name the teacher model (AReaL's '' is refused)")


def drop_server_leftovers(tree: dict[str, Any]) -> list[str]:
    """Pop every key still under ``sglang``/``vllm`` (the ones mapped were popped before) and
    the sections themselves; the dotted keys dropped, sorted."""
    dropped: list[str] = []
    for section in SERVER_LEFTOVERS:
        node = tree.pop(section, None)
        if isinstance(node, Mapping):
            dropped += [key for key, _ in leaf_items(node, section + ".")]
        elif node is not None:
            dropped.append(section)
    return sorted(dropped)
