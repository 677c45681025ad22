"""Reading AReaL's config files: their keys translated to this trainer's, AReaL's own cluster,
scheduler, name-resolution and tracing keys listed and dropped.

A file is read this way when it looks like AReaL's (a top-level key only AReaL has:
:data:`AREAL_MARKERS`), when it says ``areal_compat: true``, or with ``--areal-compat``
(:func:`areal_m2po.api.config_loader.load_config`). Then, before the file is merged:

* keys the file does not set take AReaL's defaults where AReaL's differ from this trainer's
  and change what a run computes (:data:`AREAL_DEFAULTS`: no M2PO, no decoupled loss, no
  advantage normalisation, ...);

and after it is merged and its ``${...}`` interpolations resolved (:func:`translate`):

* keys with AReaL's name and meaning here stay as they are (honoured);
* keys that say the same thing another way are rewritten (mapped, :func:`areal_key_status`):
  renamed keys, AReaL's backend strings (``rollout.backend: "vllm:d1p1t1"`` -> the vLLM engine,
  asynchronous rollout, one server; ``actor.backend: "fsdp:d4p1t1"`` -> FSDP2 over exactly 4
  processes), ``optimizer.type: adam`` (AdamW), the removed ``behave_imp_weight_cap``
  (-> ``rejection_sampling``), rollout counts in prompt groups, keys that must repeat another
  (``vllm.model`` = ``actor.path``: checked, then dropped);
* keys about AReaL's own machinery (:data:`IGNORED`) are dropped and returned, so the loader
  prints one warning line listing them;
* the sections and keys that take more than a rename (the critic section, the flat LoRA keys,
  the teacher section, the agent example's keys, the leftover SGLang/vLLM server knobs) are
  :mod:`areal_m2po.api.areal.sections`' (merged into :data:`IGNORED` and :data:`MAPPED`);
* a top-level key that AReaL's ``PPOConfig`` does not have either is refused as the key of an
  AReaL example script; anything else stays, so an unknown key is still a one-line error.

A value this trainer cannot honour (a tensor-parallel rollout engine it would start itself,
``init_from_scratch: true``, Megatron, a hybrid MoE allocation, a VLM) is a one-line
:class:`ConfigError` naming the key. The module works on plain dicts; it imports only
:mod:`areal_m2po.api.errors` and :mod:`areal_m2po.api.areal.sections`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from areal_m2po.api.areal import sections as areal_sections
from areal_m2po.api.areal.tree import (
    FROM_SCRATCH,
    MISSING,
    check_equal,
    drop_ignored,
    get,
    leaf_items,
    map_optimizer_type,
    map_recover_mode,
    map_train_backend,
    parse_allocation,
    pop,
    pop_leaf,
    put,
    rule,
)
from areal_m2po.api.errors import ConfigError

__all__ = [
    "AREAL_DEFAULTS",
    "AREAL_MARKERS",
    "AREAL_NORM_DEFAULTS",
    "IGNORED",
    "MAPPED",
    "SWITCH",
    "apply_areal_defaults",
    "areal_key_status",
    "leaf_items",
    "looks_like_areal",
    "pop_leaf",
    "translate",
    "with_section_switches",
]

SWITCH = "areal_compat"
"""Top-level key of a file (``areal_compat: true``) that asks for AReaL's reading."""

AREAL_MARKERS = frozenset(
    {
        "cluster",
        "scheduler",
        "allocation_mode",
        "enable_offload",
        "perf_tracer",
        "launcher",
        "sglang",
        "vllm",
        "async_training",
    }
)
"""Top-level keys only AReaL's files have: one of them makes a file AReaL's."""

AREAL_DEFAULTS: dict[str, Any] = {
    "total_train_steps": None,
    "actor.m2_threshold": None,
    "actor.use_decoupled_loss": False,
    "actor.recompute_logprob": False,
    "actor.use_behave_imp_weight": False,
    "actor.adv_norm": None,
    "actor.adv_norm_weighting": "token",
    "actor.m2_scope": "microbatch",
    "actor.kl_ctl": 0.1,
    "actor.ppo_n_minibatches": 4,
    "rollout.staleness": 0,
    "evaluator.freq_steps": None,
    "evaluator.eval_at_start": False,
    "evaluator.eval_at_end": False,
    "saver.save_at_end": False,
    "recover.freq_steps": None,
    "valid_dataset.max_samples": None,
}
"""AReaL's defaults where this trainer's differ in what a run computes or when it evaluates,
saves or checkpoints; an AReaL file gets them for the keys it does not set (documented in
docs/areal_parity.md). Model, data, memory and kernel defaults stay this trainer's."""

AREAL_NORM_DEFAULTS: dict[str, Any] = {"mean_level": "batch", "std_level": "batch", "group_size": 1}
"""AReaL's ``NormConfig`` defaults where this trainer's ``NormConfig`` has others (group
statistics over ``gconfig.n_samples``): the keys an AReaL file's ``actor.reward_norm`` or
``actor.adv_norm`` leaves out, and the defaults of ``areal_m2po.areal.api.cli_args.NormConfig``.
The other keys' defaults are the same in both."""

_NAMED_SECTIONS = [
    "rollout",
    "actor",
    "ref",
    "critic",
    "saver",
    "recover",
    "evaluator",
    "stats_logger",
    "teacher",
]

IGNORED: dict[str, str] = {
    "cluster": "AReaL's cluster (nodes, GPUs per node, file root, name resolution); here "
    "`accelerate launch` starts the processes and output_dir holds the files",
    "scheduler": "AReaL's single-controller scheduler; no scheduler here",
    "perf_tracer": "AReaL's performance tracer; timing/* metrics and docs/performance.md here",
    "launcher": "AReaL's launcher resources (CPUs, memory per GPU)",
    "enable_offload": "AReaL's torch_memory_saver offload of colocated engines (GPU memory only)",
    "async_training": "asynchronous rollout follows rollout.backend here (rollout.mode)",
    "name_resolve": "AReaL's name resolution (NFS/etcd); the servers' addresses are in-process",
    **{
        f"{section}.{key}": "AReaL's per-section run names and file root; here the top-level "
        "experiment_name, trial_name and output_dir"
        for section in [*_NAMED_SECTIONS, "perf_tracer"]
        for key in ("experiment_name", "trial_name", "fileroot")
    },
    "*.scheduling_spec": "AReaL's worker resources (GPUs, CPUs, memory, command, environment)",
    "*.scheduling_strategy": "AReaL's placement (colocation); the reference always sits with "
    "the actor here",
    "rollout.enable_rollout_tracing": "AReaL's per-request trace log; our servers log to "
    "output_dir/logs",
    "rollout.dump_to_file": "AReaL's trajectory dump under fileroot",
    "*.weight_update_mode": "how AReaL sends weights (NCCL/disk); the engine decides here "
    "(in memory, or disk for servers)",
    "*.pin_memory": "DataLoader pinned memory (AReaL's loader); prompts are tokenized up front",
    "*.num_workers": "DataLoader worker processes (AReaL's loader)",
    "train_dataset.type": "AReaL's dataset kind; a prompt dataset here is always rl",
    "valid_dataset.type": "AReaL's dataset kind; a prompt dataset here is always rl",
    "ref.optimizer": "the reference is never trained",
    "ref.disable_dropout": "the reference always runs in eval mode (no dropout)",
    "*.init_from_scratch": FROM_SCRATCH,
    "sglang.skip_tokenizer_init": "the rollout always sends token ids",
    "sglang.max_running_requests": "SGLang's own batching limit (rollout.max_concurrent_rollouts "
    "bounds requests here)",
    "sglang.context_length": "SGLang's context window; our servers take any prompt + "
    "max_new_tokens",
    "sglang.mem_fraction_static": "SGLang's GPU memory share",
    "vllm.skip_tokenizer_init": "the rollout always sends token ids",
    **areal_sections.IGNORED_MORE,
}
"""AReaL keys with no meaning here (dotted, ``*`` any section; a section name covers all
its keys) and why: dropped and listed in one warning line."""

_RENAMED: dict[str, str] = {
    "actor.attn_impl": "actor.attn_implementation",
    "critic.attn_impl": "critic.attn_implementation",
    "ref.attn_impl": "ref.attn_implementation",
    "train_dataset.max_length": "train_dataset.max_prompt_length",
    "valid_dataset.max_length": "valid_dataset.max_prompt_length",
    "vllm.dtype": "rollout.vllm.dtype",
    "vllm.max_model_len": "rollout.vllm.max_model_len",
    "vllm.gpu_memory_utilization": "rollout.vllm.gpu_memory_utilization",
    "vllm.enable_sleep_mode": "rollout.vllm.enable_sleep_mode",
    "evaluator.eval_before_train": "evaluator.eval_at_start",
    "actor.dynamic_sampling": "rollout.dynamic_filtering",
}

_EQUAL: dict[str, str] = {
    "actor.max_new_tokens": "gconfig.max_new_tokens",
    "actor.group_size": "gconfig.n_samples",
    "rollout.tokenizer_path": "tokenizer_path",
    "vllm.model": "actor.path",
    "sglang.model_path": "actor.path",
    "vllm.seed": "seed",
    "sglang.random_seed": "seed",
    "sglang.dtype": "actor.dtype",
    "ref.backend": "actor.backend",
}
"""AReaL keys that repeat another key here: checked equal, then dropped."""

MAPPED: dict[str, str] = {
    **{k: f"renamed: {v}" for k, v in _RENAMED.items()},
    **{k: f"must equal {v} (one setting here), then dropped" for k, v in _EQUAL.items()},
    "actor.backend": "'fsdp:dN...': backend fsdp2 (ddp for d1) and data_parallel_size N",
    "critic.backend": "as actor.backend",
    "rollout.backend": "'vllm:dN...'/'sglang:dN...': rollout.backend vllm/hf, rollout.mode "
    "async, rollout.staleness 0, rollout.n_servers N (vLLM tN/pN: server_args)",
    "allocation_mode": "'<rollout>+<train>': as rollout.backend and actor.backend",
    "*.optimizer.type": "adam: adamw (AReaL's 'adam' is torch.optim.AdamW)",
    "recover.mode": "on: auto, off: disabled",
    "rollout.max_concurrent_rollouts": "AReaL counts prompt groups: multiplied by "
    "gconfig.n_samples",
    "actor.behave_imp_weight_cap": "rejection_sampling {level token, action mask, metric "
    "ratio, upper: the cap} (AReaL's documented migration)",
    "actor.behav_imp_weight_cap": "as actor.behave_imp_weight_cap",
    "actor.behave_imp_weight_mode": "rejection_sampling level/action (token_mask, "
    "token_truncate, sequence_mask, sequence_truncate)",
    "actor.behav_imp_weight_mode": "as actor.behave_imp_weight_mode",
    "actor.rejection_sampling": "its behaviour weight is applied (actor.use_behave_imp_weight); without the decoupled "
    "loss and the recompute (the weight is 1, AReaL's SAPO does not read it) dropped and "
    "listed in the warning line",
    "actor.use_decoupled_loss": "true also sets recompute_logprob, as in AReaL",
    **areal_sections.MAPPED_MORE,
}
"""AReaL keys rewritten onto this trainer's and how (for the docs and
:func:`areal_key_status`)."""


# ---------------------------------------------------------------------------------------------
# detection, defaults, classification
# ---------------------------------------------------------------------------------------------


def looks_like_areal(data: Mapping[str, Any]) -> bool:
    """Whether a file's top-level mapping is AReaL's: ``areal_compat: true`` or a key only
    AReaL's files have."""
    return data.get(SWITCH) is True or any(key in data for key in AREAL_MARKERS)


def with_section_switches(data: Mapping[str, Any]) -> dict[str, Any]:
    """One AReaL file's mapping, with ``critic.enabled: true`` where it has a ``critic``
    section (AReaL builds a critic whenever the section exists; this trainer's default tree
    always has one, switched off), and without a ``critic: null`` or ``ref: null`` (AReaL's
    "none"; here the default sections, the critic off). The file itself is not changed."""
    out = {k: v for k, v in data.items() if not (k in ("critic", "ref") and v is None)}
    critic = out.get("critic")
    if isinstance(critic, Mapping) and "enabled" not in critic:
        out["critic"] = {**critic, "enabled": True}
    return out


def apply_areal_defaults(tree: dict[str, Any]) -> None:
    """Set :data:`AREAL_DEFAULTS` into a default tree (before a file is merged)."""
    for key, value in AREAL_DEFAULTS.items():
        put(tree, key, value)


def areal_key_status(key: str) -> str:
    """``"ignored"``, ``"mapped"`` or ``"honoured"`` (kept with its name and meaning) for a
    dotted key of an AReaL file."""
    if rule(key, IGNORED) is not None:
        return "ignored"
    if rule(key, MAPPED) is not None:
        return "mapped"
    if rule(key, areal_sections.SERVER_LEFTOVERS) is not None:
        return "ignored"
    return "honoured"


# ---------------------------------------------------------------------------------------------
# the translation
# ---------------------------------------------------------------------------------------------


def translate(tree: dict[str, Any], known: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """Rewrite a merged, resolved tree that holds an AReaL file's keys into this trainer's
    keys, in place. Returns the sorted AReaL keys dropped as meaningless here (:data:`IGNORED`).
    ``known``: this trainer's top-level keys; with them, a top-level key that neither AReaL's
    PPOConfig nor this trainer has is refused as the key of an AReaL example script.

    Raises:
        ConfigError: a value this trainer cannot honour, or two keys that disagree.
    """
    tree.pop(SWITCH, None)
    _check_rl_datasets(tree)
    ignored = drop_ignored(tree, IGNORED)
    areal_sections.map_sections(tree)
    for key, target in _EQUAL.items():
        want = get(tree, target)
        if target == "tokenizer_path" and want is None:
            want = get(tree, "actor.path")
        check_equal(tree, key, target, want)
    for key, target in _RENAMED.items():
        value = pop(tree, key)
        if value is not MISSING:
            put(tree, target, value)
    ignored += _map_values(tree)
    _map_backends(tree)
    if known:  # after the refusals of features, which name the real reason first
        areal_sections.check_script_keys(tree, known)
    # what the renames and checks above left of the servers' sections
    return sorted(ignored + areal_sections.drop_server_leftovers(tree))


_OTHER_TRAINERS = {"sft": "train_sft", "rw": "train_rm", "dpo": "train_dpo"}
"""AReaL's dataset types of the other trainers -> this package's entry point for them."""


def _check_rl_datasets(tree: dict[str, Any]) -> None:
    """Refuse an AReaL SFT, RW or DPO file given to the RL trainer, naming the entry point."""
    for section in ("train_dataset", "valid_dataset"):
        kind = get(tree, f"{section}.type")
        if isinstance(kind, str) and kind in _OTHER_TRAINERS:
            raise ConfigError(
                f"{section}.type",
                f"{kind!r}: this is AReaL's {kind.upper()} config; train it with "
                f"python -m areal_m2po.{_OTHER_TRAINERS[kind]}",
            )


_IMP_WEIGHT_MODES = {
    "token_mask": ("token", "mask"),
    "token_truncate": ("token", "clamp"),
    "sequence_mask": ("sequence", "mask"),
    "sequence_truncate": ("sequence", "clamp"),
}


def _map_values(tree: dict[str, Any]) -> list[str]:
    """The value rewrites of :data:`MAPPED` other than the backend strings; returns the keys
    dropped as without effect (an idle ``rejection_sampling``)."""
    for section in ("actor", "critic"):
        map_optimizer_type(tree, section)
    map_recover_mode(tree)
    concurrent = get(tree, "rollout.max_concurrent_rollouts")
    if isinstance(concurrent, int) and not isinstance(concurrent, bool):
        put(tree, "rollout.max_concurrent_rollouts", concurrent * get(tree, "gconfig.n_samples"))
    _map_imp_weight_cap(tree)
    idle = areal_sections.drop_idle_rejection_sampling(tree)
    rs = get(tree, "actor.rejection_sampling")
    for section in ("reward_norm", "adv_norm"):
        norm = get(tree, f"actor.{section}")
        if isinstance(norm, dict):  # the keys the file leaves out take AReaL's defaults
            for key, value in AREAL_NORM_DEFAULTS.items():
                norm.setdefault(key, value)
    # AReaL applies the behaviour weight through rejection sampling only
    put(tree, "actor.use_behave_imp_weight", isinstance(rs, dict))
    if get(tree, "actor.use_decoupled_loss") is True:  # AReaL: it implies the recompute
        put(tree, "actor.recompute_logprob", True)
    return idle


def _map_imp_weight_cap(tree: dict[str, Any]) -> None:
    """AReaL's removed ``behave_imp_weight_cap``/``_mode`` (and their older spelling
    ``behav_...``) as the ``rejection_sampling`` section AReaL documents for them."""
    cap, mode, cap_key = MISSING, "token_mask", "actor.behave_imp_weight_cap"
    for spelling in ("behave", "behav"):
        found = pop(tree, f"actor.{spelling}_imp_weight_cap")
        if found is not MISSING:
            cap, cap_key = found, f"actor.{spelling}_imp_weight_cap"
        found_mode = pop(tree, f"actor.{spelling}_imp_weight_mode")
        if found_mode is not MISSING:
            mode = found_mode
    if cap is MISSING or cap is None or mode == "disabled":
        return
    if mode not in _IMP_WEIGHT_MODES:
        raise ConfigError(
            cap_key.replace("_cap", "_mode"),
            f"must be one of {[*_IMP_WEIGHT_MODES, 'disabled']}, got {mode!r}",
        )
    if get(tree, "actor.rejection_sampling") not in (None, MISSING):
        raise ConfigError(cap_key, "give rejection_sampling or the cap it replaces, not both")
    level, action = _IMP_WEIGHT_MODES[mode]
    section = {"level": level, "action": action, "metric": "ratio", "upper": cap}
    put(tree, "actor.rejection_sampling", section)


# ---------------------------------------------------------------------------------------------
# AReaL's backend / allocation strings
# ---------------------------------------------------------------------------------------------


def _map_backends(tree: dict[str, Any]) -> None:
    alloc = pop(tree, "allocation_mode")
    if isinstance(alloc, str) and alloc:
        rollout, _, train = alloc.rpartition("+") if "+" in alloc else ("", "", alloc)
        if rollout:
            put(tree, "rollout.backend", rollout.replace(".", ":", 1))
        if get(tree, "actor.backend") in ("ddp", MISSING):
            put(tree, "actor.backend", train)
    for section in ("actor", "critic", "teacher"):
        value = get(tree, f"{section}.backend")
        if isinstance(value, str) and value not in ("ddp", "fsdp2"):
            map_train_backend(tree, section, value)
    pop(tree, "teacher.backend")  # checked above; the teacher is placed like the reference
    pop(tree, "teacher.data_parallel_size")
    value = get(tree, "rollout.backend")
    if isinstance(value, str) and value not in ("hf", "vllm"):
        _map_rollout_backend(tree, value)


def _map_rollout_backend(tree: dict[str, Any], text: str) -> None:
    key = "rollout.backend"
    engine, dims = parse_allocation(key, text)
    if engine not in ("sglang", "vllm"):
        raise ConfigError(
            key,
            f"{text!r}: the rollout engine must be sglang (this trainer's SGLang-protocol "
            "servers, or SGLang servers listed in rollout.server_addrs) or vllm",
        )
    parallel = dims["t"] != 1 or dims["p"] != 1
    if engine == "sglang" and parallel and not get(tree, "rollout.server_addrs"):
        raise ConfigError(
            key,
            f"{text!r}: the servers this trainer starts hold the model on one device; start "
            "tensor/pipeline-parallel SGLang servers yourself and list them in "
            "rollout.server_addrs",
        )
    if engine == "vllm" and parallel:
        if get(tree, "rollout.vllm.placement") == "in_process":
            raise ConfigError(
                key, f"{text!r}: tensor/pipeline parallel vLLM needs rollout.vllm.placement=servers"
            )
        args = list(get(tree, "rollout.vllm.server_args") or [])
        args += ["--tensor-parallel-size", str(dims["t"])] if dims["t"] != 1 else []
        args += ["--pipeline-parallel-size", str(dims["p"])] if dims["p"] != 1 else []
        put(tree, "rollout.vllm.server_args", args)
    put(tree, key, "vllm" if engine == "vllm" else "hf")
    put(tree, "rollout.mode", "async")
    put(tree, "rollout.staleness", 0)
    put(tree, "rollout.n_servers", dims["d"])
