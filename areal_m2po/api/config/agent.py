"""The ``rollout.agent`` section: AReaL's agent-mode keys, with AReaL's meanings.

Read by the ``agent`` rollout workflow (:mod:`areal_m2po.rollout.workflows.agent`) and its
OpenAI-compatible endpoint (docs/agents.md). The keys are AReaL's (``areal/api/cli_args.py``,
``AgentConfig``, at commit cbff54d6); two of AReaL's values are refused here with one line
each: ``mode: online`` (external users driving sessions through a gateway) and
``export_style: individual`` (one training row per interaction, which the batch layout of
``gconfig.n_samples`` rows per record cannot hold) with a workflow that uses the agent
endpoint (:class:`~areal_m2po.api.config.rollout.RolloutConfig` checks it; the rlvr and
multi_turn workflows make one row per episode whatever the style, as in AReaL, where the style
applies only to agents behind its proxy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["AGENT_MODES", "EXPORT_STYLES", "REASONING_PARSERS", "TOOL_CALL_PARSERS", "AgentConfig"]

AGENT_MODES = ("inline", "subproc", "online")
EXPORT_STYLES = ("concat", "individual")
TOOL_CALL_PARSERS = ("qwen", "qwen25", "qwen3", "hermes", "none")
"""Tool-call formats read from a completion; all name the ``<tool_call>{json}</tool_call>``
format of Hermes and Qwen 2.5/3 (AReaL's spellings); ``none`` parses no tool call."""
REASONING_PARSERS = ("qwen3", "deepseek-r1", "deepseek_r1", "none")
"""Reasoning formats: ``<think>...</think>`` (``deepseek-r1``: the opening tag may be in the
prompt, so text before a lone ``</think>`` is reasoning); ``none`` splits nothing."""
CHAT_TEMPLATE_TYPES = ("hf", "concat")


@dataclass
class AgentConfig:
    """``rollout.agent``: how agent code is run and its interactions become training data."""

    mode: str = field(
        default="inline",
        metadata={
            "help": "inline: the agent runs as a coroutine in the trainer's rollout loop, "
            "called run(data, base_url=, api_key=, http_client=); subproc: in a pool of "
            "subproc_max_workers worker processes, called run(data) with OPENAI_BASE_URL and "
            "OPENAI_API_KEY set (AReaL's contract only); online: refused (external users "
            "driving sessions through a gateway; docs/agents.md).",
            "choices": AGENT_MODES,
        },
    )
    tool_call_parser: str = field(
        default="qwen",
        metadata={
            "help": "Parser of tool calls in the model's output (qwen, qwen25, qwen3, hermes: "
            "<tool_call>{json}</tool_call>; none: no parsing).",
            "choices": TOOL_CALL_PARSERS,
        },
    )
    reasoning_parser: str = field(
        default="none",
        metadata={
            "help": "Parser of reasoning content (qwen3, deepseek-r1: <think>...</think> "
            "returned as reasoning_content / a reasoning output item; none: no split). "
            "AReaL's default is qwen3; none here because the built-in model does not think.",
            "choices": REASONING_PARSERS,
        },
    )
    chat_template_type: str = field(
        default="hf",
        metadata={
            "help": "hf: the tokenizer's chat template renders every request, and a request "
            "that extends an earlier one is built on its tokens; concat: the same (AReaL's "
            "multi-turn concatenation is what the endpoint always does).",
            "choices": CHAT_TEMPLATE_TYPES,
        },
    )
    turn_discount: float = field(
        default=1.0,
        metadata={
            "help": "Backward reward propagation over an episode's interactions in creation "
            "order: reward[i] = own[i] + turn_discount * reward[i+1] (own: the agent's reward "
            "for it, 0 if none); in [0, 1].",
        },
    )
    export_style: str = field(
        default="concat",
        metadata={
            "help": "concat: the chain of interactions ending at the episode's last one is "
            "one trajectory with that interaction's reward; individual (AReaL's default): "
            "refused with the agent workflow (the batch holds one row per episode); with rlvr "
            "and multi_turn it changes nothing (one interaction chain per episode).",
            "choices": EXPORT_STYLES,
        },
    )

    subproc_max_workers: int = field(
        default=4,
        metadata={"help": "Worker processes of mode: subproc (each runs one episode at a time)."},
    )

    def __post_init__(self) -> None:
        """Raise ValueError("key: why") for a value out of range (the loader prefixes it
        with ``rollout.agent``)."""
        for key, value, choices in (
            ("mode", self.mode, AGENT_MODES),
            ("tool_call_parser", self.tool_call_parser, TOOL_CALL_PARSERS),
            ("reasoning_parser", self.reasoning_parser, REASONING_PARSERS),
            ("chat_template_type", self.chat_template_type, CHAT_TEMPLATE_TYPES),
            ("export_style", self.export_style, EXPORT_STYLES),
        ):
            if value not in choices:
                raise ValueError(f"{key}: must be one of {list(choices)}, got {value!r}")
        if self.mode == "online":
            raise ValueError(
                "mode: online (external users through a gateway) is not supported; use inline"
            )
        workers = self.subproc_max_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"subproc_max_workers: must be an integer >= 1, got {workers!r}")
        discount = self.turn_discount
        if (
            isinstance(discount, bool)
            or not isinstance(discount, (int, float))
            or not (math.isfinite(discount) and 0.0 <= discount <= 1.0)
        ):
            raise ValueError(f"turn_discount: must be a number in [0, 1], got {discount!r}")
