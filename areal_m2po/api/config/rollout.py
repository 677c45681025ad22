"""Generation and the rollout: sampling settings, the vLLM engine and how rollouts reach the
trainer (in process or from rollout servers)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from areal_m2po.api.config.agent import AgentConfig
from areal_m2po.api.config.checks import (
    check_bool,
    check_number,
    check_str,
    config_field,
    expand_home,
    section_field,
    validate_choices,
    validate_section,
)
from areal_m2po.api.errors import ConfigError

_Options = TypeVar("_Options")

SERVER_API_KEY_ENV = "AREAL_M2PO_SERVER_API_KEY"
"""The environment variable holding the rollout servers' API key (``rollout.server_api_key``)."""


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _server_host(args: list[str]) -> str | None:
    """The last ``--host`` given in a server's arguments (``--host H`` or ``--host=H``)."""
    host = None
    for i, arg in enumerate(args):
        if arg == "--host" and i + 1 < len(args):
            host = args[i + 1]
        elif arg.startswith("--host="):
            host = arg.split("=", 1)[1]
    return host


@dataclass
class GenerationConfig:
    """Sampling settings of the rollout (behaviour) policy."""

    n_samples: int = config_field(8, "Samples per prompt (the GRPO group size).")
    max_new_tokens: int = config_field(16, "Maximum generated tokens per sample.")
    min_new_tokens: int = config_field(0, "Minimum generated tokens per sample.")
    temperature: float = config_field(1.0, "Sampling temperature.")
    top_p: float = config_field(1.0, "Nucleus sampling probability mass.")
    top_k: int = config_field(0, "Top-k sampling (0 = off).")
    greedy: bool = config_field(False, "Greedy decoding instead of sampling.")
    stop: list[str] | None = config_field(None, "Extra stop strings (EOS always stops).")
    max_tokens: int | None = config_field(
        None,
        "AReaL key: the most tokens a sequence may hold, prompt plus completion: each request "
        "generates at most min(max_new_tokens, max_tokens - its prompt length) tokens (null: "
        "no cap beyond max_new_tokens).",
    )

    def __post_init__(self) -> None:
        check_number("n_samples", self.n_samples, ge=1, integer=True)
        check_number("max_new_tokens", self.max_new_tokens, ge=1, integer=True)
        check_number("max_tokens", self.max_tokens, ge=2, integer=True, optional=True)
        check_number("min_new_tokens", self.min_new_tokens, ge=0, integer=True)
        if self.min_new_tokens > self.max_new_tokens:
            raise ConfigError(
                "min_new_tokens", f"must be <= max_new_tokens ({self.max_new_tokens})"
            )
        check_number("temperature", self.temperature, gt=0)
        check_number("top_p", self.top_p, gt=0, le=1)
        check_number("top_k", self.top_k, ge=0, integer=True)
        check_bool("greedy", self.greedy)
        if self.stop is not None and not (
            isinstance(self.stop, list) and all(isinstance(s, str) and s for s in self.stop)
        ):
            raise ConfigError("stop", f"must be a list of non-empty strings, got {self.stop!r}")


@dataclass
class VLLMConfig:
    """vLLM as the rollout engine (``rollout.backend: vllm``; docs/scaling.md)."""

    placement: str | None = config_field(
        None,
        "in_process: vllm.LLM inside the trainer (TRL's colocate mode; weights pushed in "
        "memory); servers: vLLM OpenAI-compatible servers (rollout.n_servers started here, or "
        "rollout.server_addrs), weights through disk. null: in_process in sync mode, servers in "
        "async mode.",
        choices=(None, "in_process", "servers"),
    )
    dtype: str | None = config_field(
        None,
        "vLLM --dtype (null: actor.dtype; AReaL key: vllm.dtype).",
        choices=(None, "float32", "bfloat16", "float16"),
    )
    max_model_len: int | None = config_field(
        None,
        "Context length vLLM reserves for; at least the episode budget (null: "
        "rollout.max_episode_tokens, as set or derived; AReaL key: vllm.max_model_len).",
    )
    kv_cache_gib: int = config_field(1, "CPU only: KV cache GiB (VLLM_CPU_KVCACHE_SPACE).")
    gpu_memory_utilization: float | None = config_field(
        None,
        "CUDA only: GPU memory share of each engine (null: 0.3 in process, beside the trainer; "
        "0.9 for servers on GPUs of their own; AReaL key: vllm.gpu_memory_utilization).",
    )
    enable_sleep_mode: bool = config_field(
        False,
        "CUDA, in_process only: vLLM frees its GPU memory while the trainer updates (sleep / "
        "wake_up around each step's update). Unsupported on CPU.",
    )
    python: str | None = config_field(
        None,
        "servers started here: the Python interpreter that runs them (e.g. a venv with vLLM "
        "whose pins conflict with the trainer's; it needs areal_m2po installed). null: the "
        "trainer's.",
    )
    server_args: list[str] | None = config_field(
        None,
        "servers started here: extra vLLM server arguments, e.g. ['--tensor-parallel-size', '2'].",
    )

    def __post_init__(self) -> None:
        expand_home(self, "python")
        validate_choices(self)
        check_number("max_model_len", self.max_model_len, ge=1, integer=True, optional=True)
        check_number("kv_cache_gib", self.kv_cache_gib, ge=1, integer=True)
        if self.gpu_memory_utilization is not None:
            check_number("gpu_memory_utilization", self.gpu_memory_utilization, gt=0)
            if self.gpu_memory_utilization > 1:
                raise ConfigError(
                    "gpu_memory_utilization",
                    f"must be in (0, 1], got {self.gpu_memory_utilization}",
                )
        check_bool("enable_sleep_mode", self.enable_sleep_mode)
        check_str("python", self.python, optional=True)
        if self.server_args is not None and not (
            isinstance(self.server_args, list) and all(isinstance(a, str) for a in self.server_args)
        ):
            raise ConfigError("server_args", f"must be a list of strings, got {self.server_args!r}")


@dataclass
class RolloutConfig:
    """How rollouts reach the trainer: in process with exact staleness (sync), or from rollout
    servers that generate while the trainer trains, with bounded staleness (async)."""

    mode: str = config_field(
        "sync",
        "sync: generate, then train, in this process (exact staleness, the paper's Stale-k); "
        "async: rollout servers generate continuously while the trainer trains, bounded by "
        "max_head_offpolicyness (docs/scaling.md).",
        choices=("sync", "async"),
    )
    staleness: int = config_field(
        0,
        "sync mode: the batch trained at step t was generated by the policy of step "
        "t - staleness (the first steps use the initial policy). 0 = on-policy. Must be 0 in "
        "async mode.",
    )
    max_head_offpolicyness: int | None = config_field(
        None,
        "AReaL's bound on how many versions a rollout may lag. async mode: no sample is "
        "started that would be more than this many versions behind when trained on (null: "
        "0). sync mode: the lag is exact (staleness); if set it must be >= staleness.",
    )
    dynamic_filtering: bool = config_field(
        False,
        "Drop groups whose rewards are all equal (they carry no GRPO signal; AReaL key: "
        "actor.dynamic_sampling).",
    )
    workflow: str = config_field(
        "rlvr",
        "The rollout workflow (docs/rollout.md): 'rlvr' (built in: n samples of the prompt, "
        "scored by reward.path and reward.model), 'multi_turn' or 'agent' (built in, "
        "docs/agents.md), or a dotted path 'module:Name' of a "
        "RolloutWorkflow subclass or factory, called as Name(context, **workflow_kwargs).",
    )
    workflow_kwargs: dict[str, Any] | None = config_field(
        None, "Keyword arguments of the workflow's constructor (a mapping; null: none)."
    )
    max_episode_tokens: int | None = config_field(
        None,
        "Token budget of one episode: its prompt and every token after it, generated or "
        "inserted (tool results, environment and user turns). Every workflow keeps to it (a "
        "turn gets at most what is left; an episode with no room left ends with finish "
        "reason 'length'), the agent endpoint clips or refuses calls past it, no training row "
        "is longer, and vLLM's max_model_len is derived from it. AReaL's gconfig.max_tokens "
        "(prompt + generated tokens of a request; an episode's last request holds all of it). "
        "null: the longest prompt the datasets keep plus one turn, max(train_dataset, "
        "valid_dataset).max_prompt_length + gconfig.max_new_tokens, at most gconfig.max_tokens "
        "(docs/rollout.md).",
    )
    episode_timeout_s: float | None = config_field(
        3600.0,
        "Seconds one episode may run (an agent that never returns, a tool that hangs): past "
        "it the episode is cancelled (an agent's endpoint session closed), its group dropped "
        "and counted in rollout/n_episode_timeouts, and the run goes on; an evaluation episode "
        "past it counts as failed (eval/timed_out). null: no limit.",
    )
    backend: str = config_field(
        "hf",
        "The inference engine: hf (sync: Hugging Face generate in process; async: our rollout "
        "servers or SGLang's) or vllm (rollout.vllm: in process or vLLM servers; needs "
        "bash scripts/install.sh --vllm). AReaL key: its backend strings 'sglang:dN' / "
        "'vllm:dN' map to hf / vllm, mode async and N servers (docs/areal_parity.md).",
        choices=("hf", "vllm"),
    )
    vllm: VLLMConfig = section_field(VLLMConfig, "vLLM engine settings (backend: vllm).")
    agent: AgentConfig = section_field(AgentConfig, "AReaL's agent-mode keys (docs/agents.md).")
    logp_mismatch_freq: int = config_field(
        0,
        "sync mode with staleness >= 1: every this many steps, the trainer also computes its "
        "log-probs of the batch just generated (at the version that generated it) and logs "
        "rollout/logp_mismatch_* (engine vs trainer log-probs; one extra forward pass). "
        "Other set-ups log them from the proximal forward pass at no extra cost. 0 = never "
        "(docs/rollout.md).",
    )
    server_addrs: list[str] | None = config_field(
        None,
        "async mode: host:port of running rollout servers (ours or SGLang's). null: the "
        "trainer starts n_servers servers on localhost and stops them when it exits.",
    )
    n_servers: int = config_field(
        1, "async mode: servers the trainer starts when server_addrs is null."
    )
    server_threads: int | None = config_field(
        None, "async mode: torch CPU threads of each server the trainer starts (null: default)."
    )
    server_device: str = config_field(
        "auto",
        "async mode: device of the servers the trainer starts: auto (cuda if PyTorch sees a GPU, "
        "else cpu), cpu, cuda or cuda:N (e.g. a GPU of its own, so generation overlaps training).",
    )
    max_concurrent_rollouts: int | None = config_field(
        None,
        "async mode: sample requests in flight at most (null: one training batch, "
        "train_dataset.batch_size x gconfig.n_samples). AReaL's key of the same name counts "
        "prompt groups; an AReaL file's value is multiplied by gconfig.n_samples.",
    )
    consumer_batch_size: int | None = config_field(
        None,
        "AReaL key: prompt groups the trainer takes per step. This trainer trains each step on "
        "one loader batch, so it must equal train_dataset.batch_size (null: that).",
    )
    queue_size: int | None = config_field(
        None,
        "AReaL key, async mode: prompt groups started but not yet trained on, at most (the "
        "rollouts queued for the trainer and those generating). The capacity rule of "
        "max_head_offpolicyness already keeps them within (max_head_offpolicyness + 1) x "
        "train_dataset.batch_size, so a value must be at least that (null: that bound).",
    )
    setup_timeout: float = config_field(
        120.0, "async mode: seconds to wait for the servers to answer /health at start."
    )
    request_timeout: float = config_field(
        3600.0, "async mode: seconds one /generate or weight-update request may take."
    )
    health_check_interval: float = config_field(
        5.0, "async mode: seconds between /health probes of every server."
    )
    health_check_timeout: float = config_field(
        10.0, "async mode: a server not answering /health within this many seconds is dead."
    )
    tolerate_server_failures: bool = config_field(
        False,
        "async mode: continue on the remaining servers when one dies or hangs (false: stop "
        "with one line naming the server and the last good checkpoint).",
    )
    server_api_key: str | None = config_field(
        None,
        "The API key of rollout servers started elsewhere (server_addrs; start them with "
        f"--api-key or ${SERVER_API_KEY_ENV}). null: ${SERVER_API_KEY_ENV} if set. Servers "
        "started here get a new key per run. Never written to config.yaml or printed; "
        "prefer the environment variable (a command line shows in ps).",
        secret=True,
    )
    allow_public_host: bool = config_field(
        False,
        "Let vllm.server_args bind servers started here to a non-loopback --host (they "
        "still want the run's key).",
    )

    def __post_init__(self) -> None:
        validate_choices(self)
        check_number("staleness", self.staleness, ge=0, integer=True)
        check_number(
            "max_head_offpolicyness", self.max_head_offpolicyness, ge=0, integer=True, optional=True
        )
        if self.mode == "async" and self.staleness != 0:
            raise ConfigError(
                "staleness",
                f"must be 0 in async mode (bound the lag with max_head_offpolicyness), "
                f"got {self.staleness}",
            )
        if (
            self.mode == "sync"
            and self.max_head_offpolicyness is not None
            and self.max_head_offpolicyness < self.staleness
        ):
            raise ConfigError(
                "max_head_offpolicyness",
                f"must be >= staleness ({self.staleness}), got {self.max_head_offpolicyness}",
            )
        check_bool("dynamic_filtering", self.dynamic_filtering)
        check_number("logp_mismatch_freq", self.logp_mismatch_freq, ge=0, integer=True)
        if self.logp_mismatch_freq and (self.mode != "sync" or self.staleness == 0):
            raise ConfigError(
                "logp_mismatch_freq",
                f"only sync mode with staleness >= 1 needs the extra forward pass (here mode="
                f"{self.mode}, staleness={self.staleness}: the proximal pass measures it); "
                f"set 0, got {self.logp_mismatch_freq}",
            )
        validate_section(self, "vllm", VLLMConfig)
        validate_section(self, "agent", AgentConfig)
        check_str("workflow", self.workflow)
        builtin = ("rlvr", "multi_turn", "agent")
        if self.workflow not in builtin and ":" not in self.workflow and "." not in self.workflow:
            raise ConfigError(
                "workflow",
                f"must be one of {', '.join(builtin)} or a dotted path 'module:Name', "
                f"got {self.workflow!r}",
            )
        if self.agent.export_style == "individual" and self.workflow not in ("rlvr", "multi_turn"):
            raise ConfigError(
                "agent.export_style",
                "individual (one row per interaction) is not supported with an agent "
                f"workflow ({self.workflow}): a record's group is gconfig.n_samples rows, one "
                "per episode; use concat",
            )
        check_number(
            "max_episode_tokens", self.max_episode_tokens, ge=2, integer=True, optional=True
        )
        check_number("episode_timeout_s", self.episode_timeout_s, gt=0, optional=True)
        if self.workflow_kwargs is not None and not (
            isinstance(self.workflow_kwargs, dict)
            and all(isinstance(k, str) for k in self.workflow_kwargs)
        ):
            raise ConfigError(
                "workflow_kwargs",
                f"must be a mapping of names to values, got {self.workflow_kwargs!r}",
            )
        self._check_servers()

    def _check_servers(self) -> None:
        """The keys of the rollout servers (addresses, resources, timeouts, key, host)."""
        if self.server_addrs is not None:
            if not isinstance(self.server_addrs, list) or not self.server_addrs:
                raise ConfigError("server_addrs", "must be a non-empty list of host:port or null")
            for addr in self.server_addrs:
                host, _, port = str(addr).rpartition(":")
                if not host or not port.isdigit():
                    raise ConfigError("server_addrs", f"{addr!r} is not host:port")
        check_number("n_servers", self.n_servers, ge=1, integer=True)
        check_number("server_threads", self.server_threads, ge=1, integer=True, optional=True)
        check_str("server_device", self.server_device)
        dev = self.server_device
        if not (dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit())):
            raise ConfigError("server_device", f"must be auto, cpu, cuda or cuda:N, got {dev!r}")
        check_number(
            "max_concurrent_rollouts",
            self.max_concurrent_rollouts,
            ge=1,
            integer=True,
            optional=True,
        )
        for name in ("consumer_batch_size", "queue_size"):
            check_number(name, getattr(self, name), ge=1, integer=True, optional=True)
        for name in ("setup_timeout", "request_timeout", "health_check_interval"):
            check_number(name, getattr(self, name), gt=0)
        check_number("health_check_timeout", self.health_check_timeout, gt=0)
        check_bool("tolerate_server_failures", self.tolerate_server_failures)
        key = self.server_api_key
        if key is not None and not (isinstance(key, str) and key.strip() and key.isprintable()):
            # (the value is a secret: never echoed)
            raise ConfigError("server_api_key", "must be a non-empty printable string or null")
        check_bool("allow_public_host", self.allow_public_host)
        server_args = self.vllm.server_args or []
        if any(a == "--api-key" or a.startswith("--api-key=") for a in server_args):
            raise ConfigError(
                "vllm.server_args",
                "--api-key: the servers started here take the run's key (set "
                f"rollout.server_api_key or ${SERVER_API_KEY_ENV} to choose it)",
            )
        bind = _server_host(server_args)
        if bind is not None and not self.allow_public_host and not _is_loopback(bind):
            raise ConfigError(
                "vllm.server_args",
                f"--host {bind} is not a loopback address: the servers started here would "
                "serve whoever reaches it (set rollout.allow_public_host: true to bind it)",
            )

    def api_key(self) -> str | None:
        """The key of servers started elsewhere: ``server_api_key``, else the environment
        variable ``AREAL_M2PO_SERVER_API_KEY`` (None: no key)."""
        return self.server_api_key or os.environ.get(SERVER_API_KEY_ENV) or None

    def engine_options(self, cls: type[_Options], **given: Any) -> _Options:
        """``cls(**given)``, an engine's options dataclass, with each of its other fields that
        names a key of this section (``request_timeout``, ``setup_timeout``, ...) set from
        that key."""
        keys = {f.name for f in fields(self)}
        taken = {
            f.name: getattr(self, f.name)
            for f in fields(cls)  # type: ignore[arg-type]
            if f.name in keys and f.name not in given
        }
        return cls(**taken, **given)

    @property
    def needs_local_vllm(self) -> bool:
        """Whether backend=vllm runs vLLM in this interpreter (in process, or servers started
        here with the trainer's Python); servers at given addresses or run by another
        interpreter need none here (checked at start-up, trainer/preflight.py)."""
        if self.backend != "vllm":
            return False
        return not (self.vllm_placement == "servers" and (self.server_addrs or self.vllm.python))

    @property
    def vllm_placement(self) -> str:
        """``rollout.vllm.placement`` resolved: in_process or servers."""
        if self.vllm.placement is not None:
            return self.vllm.placement
        return "in_process" if self.mode == "sync" else "servers"
