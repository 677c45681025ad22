"""AReaL's recording OpenAI client (``areal.experimental.openai.client.ArealOpenAI`` at
areal-project/AReaL cbff54d6): an ``openai.AsyncOpenAI`` whose ``chat.completions.create``
generates with the workflow's engine in this process (no network) and records each
completion, token for token, for training.

A request is read as this package's agent endpoint reads one
(:func:`~areal_m2po.rollout.openai.chat_request.parse_chat_request`: fields it does not honour
are refused in one line, never ignored), rendered by its chat template
(:class:`~areal_m2po.rollout.openai.prompt_builder.PromptBuilder`: ``chat_template_type="hf"``
renders the whole conversation; ``"concat"`` builds on the tokens of the earlier completion
the messages extend, which becomes the interaction's ``parent``), and its reply parsed by the
endpoint's tool-call and reasoning parsers when ``tools`` are given. AReaL's sampling
arguments: ``temperature`` 1.0 unless given (0: greedy), ``top_p`` 1.0,
``max_completion_tokens`` (or ``max_tokens``) cut to ``max_total_tokens`` /
``engine_max_tokens`` minus the prompt, 512 when nothing bounds it.

Not here: ``stream=True``, ``n`` above 1 and ``seed`` (refused, as AReaL refuses ``n``), the
Responses API (``client.responses``), LoRA names, images.
"""

from __future__ import annotations

import copy
import logging
import time
import uuid
from typing import Any

from openai import AsyncOpenAI
from openai.resources.chat.completions import AsyncCompletions
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.completion_usage import CompletionUsage

from areal_m2po.api.engine_api import InferenceEngine as _PackageEngine
from areal_m2po.areal.api.engine_api import InferenceEngine
from areal_m2po.areal.api.generation import GenerationHyperparameters
from areal_m2po.areal.api.io_struct import ModelRequest, ModelResponse
from areal_m2po.areal.experimental.openai.cache import InteractionCache
from areal_m2po.areal.experimental.openai.types import InteractionWithTokenLogpReward
from areal_m2po.rollout.openai.chat_request import ChatRequest, parse_chat_request
from areal_m2po.rollout.openai.prompt_builder import PromptBuilder
from areal_m2po.rollout.openai.session import CallRecord
from areal_m2po.rollout.openai.tool_parsers import reasoning_parser as _reasoning_parser
from areal_m2po.rollout.openai.tool_parsers import tool_call_parser as _tool_call_parser
from areal_m2po.rollout.token_text import encode_text

__all__ = ["ArealOpenAI"]

logger = logging.getLogger("areal_m2po.areal")

_TRANSPORT = ("extra_headers", "extra_query", "timeout")
DEFAULT_MAX_NEW_TOKENS = 512


def is_omitted(value: Any) -> bool:
    """Whether an argument was left out (None, ``NOT_GIVEN`` or ``Omit``)."""
    return value is None or type(value).__name__ in ("NotGiven", "Omit")


def _message_dict(message: Any) -> dict[str, Any]:
    if hasattr(message, "model_dump"):
        return message.model_dump(exclude_none=True)
    return dict(message)


class _ChatCompletions(AsyncCompletions):
    """``client.chat.completions``: :meth:`create` generates in process and records."""

    def __init__(self, client: ArealOpenAI) -> None:
        super().__init__(client)
        self.areal = client

    async def create(self, *, messages: Any, **kwargs: Any) -> ChatCompletion:  # type: ignore[override]
        """One chat completion of ``messages`` (see the module doc), recorded unless
        ``store=False``; ``max_total_tokens`` and ``extra_body["chat_template_kwargs"]``
        as AReaL takes them.

        Raises:
            ValueError: a refused or malformed field (one line naming it).
            NotImplementedError: ``stream=True`` or ``n`` above 1.
        """
        given = {k: v for k, v in kwargs.items() if not is_omitted(v) and k not in _TRANSPORT}
        if given.get("n", 1) != 1:
            raise NotImplementedError("n != 1 is not supported yet")
        if given.get("stream"):
            raise NotImplementedError("ArealOpenAI: stream=True is not supported here")
        store = given.pop("store", True)
        metadata = given.pop("metadata", {})
        max_total = given.pop("max_total_tokens", None)
        extra_body = given.pop("extra_body", None) or {}
        given.pop("areal_cache", None)
        raw = [_message_dict(m) for m in messages]
        request = parse_chat_request({"messages": raw, **given})
        a = self.areal
        cid = f"chatcmpl-{uuid.uuid4().hex[:29]}"
        interaction = InteractionWithTokenLogpReward(
            messages=copy.deepcopy(raw), chat_template_type=a.chat_template_type
        )
        prompt_ids, parent = a._prompt(request, extra_body.get("chat_template_kwargs", {}))
        if store:
            a._cache[cid] = interaction  # creation order: when the call starts
            if parent is not None:
                interaction.parent = a._cache[a._record_ids[parent]]
        try:
            gconfig = a._gconfig(request, len(prompt_ids), max_total)
            resp = await a.engine.agenerate(
                ModelRequest(
                    rid=uuid.uuid4().hex, input_ids=prompt_ids, gconfig=gconfig,
                    metadata=dict(metadata), tokenizer=a.tokenizer,
                )
            )  # fmt: skip
        except BaseException:
            a._cache.pop(cid, None)
            raise
        reply, finish = a._reply(request, resp)
        completion = _completion(cid, reply, finish, resp)
        if store:
            interaction.completion, interaction.model_response = completion, resp
            interaction.output_message_list = [
                completion.choices[0].message.model_dump(exclude_none=True)
            ]
            a._record(cid, request, reply, resp, parent)
        return completion


def _completion(
    cid: str, reply: dict[str, Any], finish: str, resp: ModelResponse
) -> ChatCompletion:
    message = ChatCompletionMessage(
        role="assistant", content=reply["content"], tool_calls=reply.get("tool_calls") or None
    )
    return ChatCompletion(
        id=cid,
        choices=[Choice(finish_reason=finish, index=0, logprobs=None, message=message)],  # type: ignore[arg-type]
        created=int(time.time()),
        model="None",
        object="chat.completion",
        usage=CompletionUsage(
            completion_tokens=resp.output_len,
            prompt_tokens=resp.input_len,
            total_tokens=resp.input_len + resp.output_len,
        ),
    )


class ArealOpenAI(AsyncOpenAI):
    """AReaL's recording client (see the module doc).

    Args:
        engine: the engine an AReaL workflow's ``arun_episode`` gets (or this package's).
        tokenizer: the policy's tokenizer (its chat template renders the messages).
        tool_call_parser / reasoning_parser: the endpoint's parsers by name (``qwen``,
            ``hermes``, ``none``; ``qwen3``, ``deepseek-r1``, ``none``).
        engine_max_tokens: the most tokens a sequence may hold (prompt and completion).
        chat_template_type: ``hf`` or ``concat`` (see the module doc).
        lora_name: must be empty (no LoRA adapters by name here).
        **kwargs: ``openai.AsyncOpenAI``'s (an api key is not needed).
    """

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        tool_call_parser: str = "qwen",
        reasoning_parser: str = "qwen3",
        engine_max_tokens: int | None = None,
        chat_template_type: str = "hf",
        lora_name: str = "",
        **kwargs: Any,
    ) -> None:
        if chat_template_type not in ("hf", "concat"):
            raise ValueError(f"Unsupported chat_template_type {chat_template_type}")
        if lora_name:
            raise ValueError("ArealOpenAI: lora_name is not supported here (no named adapters)")
        kwargs.setdefault("api_key", "areal-in-process")
        super().__init__(**kwargs)
        self.engine = InferenceEngine(engine) if isinstance(engine, _PackageEngine) else engine
        self.tokenizer = tokenizer
        self.tool_call_parser, self.reasoning_parser = tool_call_parser, reasoning_parser
        self.engine_max_tokens = engine_max_tokens
        self.chat_template_type = chat_template_type
        self._parse_tools = _tool_call_parser(tool_call_parser)
        self._parse_reasoning = _reasoning_parser(reasoning_parser)
        self._eos = {t for t in (tokenizer.eos_token_id, tokenizer.pad_token_id) if t is not None}
        self._builder = PromptBuilder(tokenizer, self._eos)
        self._cache = InteractionCache()
        self._records: list[CallRecord] = []
        self._record_ids: list[str] = []
        self.chat.completions = _ChatCompletions(self)  # type: ignore[misc]

    @property
    def responses(self) -> Any:  # type: ignore[override]
        raise NotImplementedError("ArealOpenAI: the Responses API is not supported here")

    # -- AReaL's reward API -----------------------------------------------------------------

    def get_interaction(self, id: str) -> InteractionWithTokenLogpReward | None:  # noqa: A002
        """The recorded completion ``id`` (None if there is none)."""
        return self._cache.get(id)

    def set_reward(self, id: str, reward: float) -> None:  # noqa: A002 - AReaL's name
        """Set the reward of completion ``id`` (KeyError when it was not recorded)."""
        if id not in self._cache:
            raise KeyError(f"Interaction with ID {id} not found in cache")
        self._cache.set_reward(id, reward)

    def set_last_reward(self, reward: float) -> None:
        """Set the reward of the most recent completion (RuntimeError when there is none)."""
        if not self._cache:
            raise RuntimeError("No interaction in cache to set reward for")
        self._cache.set_last_reward(reward)

    def apply_reward_discount(
        self, turn_discount: float = 1.0
    ) -> dict[str, InteractionWithTokenLogpReward]:
        """AReaL's backward discount (see :class:`InteractionCache`); once only."""
        return self._cache.apply_reward_discount(turn_discount)

    def export_interactions(self, style: str) -> dict[str, InteractionWithTokenLogpReward]:
        """The completions to train on, ``individual`` or ``concat`` (see
        :meth:`InteractionCache.export_interactions`)."""
        return self._cache.export_interactions(style)

    # -- one call -------------------------------------------------------------------------------

    def _prompt(
        self, request: ChatRequest, template_kwargs: dict[str, Any]
    ) -> tuple[list[int], int | None]:
        """(prompt ids, index of the recorded call they extend or None)."""
        if self.chat_template_type == "concat":
            return self._builder.build(request, self._records)
        text = self._builder.render(request.messages, request.tools, True, **template_kwargs)
        return encode_text(self.tokenizer, text), None

    def _gconfig(
        self, request: ChatRequest, prompt_len: int, max_total: int | None
    ) -> GenerationHyperparameters:
        limits = [t for t in (max_total, self.engine_max_tokens) if t is not None]
        budget = min(limits) - prompt_len if limits else None
        if budget is not None and budget <= 0:
            raise ValueError(
                f"len of prompt tokens {prompt_len} exceeds max_total_tokens {min(limits)}"
            )
        bounds = [b for b in (budget, request.max_new_tokens) if b is not None]
        temperature = 1.0 if request.temperature is None else request.temperature
        stop = list(request.stop) or None
        if stop is not None and self.chat_template_type == "concat":
            logger.warning("stop strings are not supported in concat mode; ignoring them")
            stop = None
        return GenerationHyperparameters(
            n_samples=1,
            max_new_tokens=min(bounds) if bounds else DEFAULT_MAX_NEW_TOKENS,
            temperature=temperature or 1.0,
            greedy=temperature == 0,
            top_p=request.top_p or 1.0,
            stop=stop,
            stop_token_ids=sorted(self._eos),
        )

    def _reply(self, request: ChatRequest, resp: ModelResponse) -> tuple[dict[str, Any], str]:
        """(the assistant message, its finish reason): the text without the stopping token,
        reasoning and tool calls parsed when ``tools`` are given (unless ``tool_choice`` is
        ``none``)."""
        ids = list(resp.output_tokens)
        if ids and ids[-1] in self._eos:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids)
        calls: list[dict[str, Any]] = []
        if request.tools and request.tool_choice != "none":
            _, text = self._parse_reasoning(text)
            text, calls = self._parse_tools(text)
        reply: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            reply["tool_calls"] = calls
        finish = "tool_calls" if calls else ("stop" if resp.stop_reason == "stop" else "length")
        return reply, finish

    def _record(
        self, cid: str, request: ChatRequest, reply: dict[str, Any], resp: ModelResponse,
        parent: int | None,
    ) -> None:  # fmt: skip
        self._records.append(
            CallRecord(
                request.messages, request.tools, reply, list(resp.input_tokens),
                list(resp.output_tokens), list(resp.output_logprobs),
                list(resp.output_versions), resp.stop_reason, parent,
            )
        )  # fmt: skip
        self._record_ids.append(cid)
