"""A ``/generate`` body of the HF rollout server, checked on arrival.

Everything generation could refuse is refused here with a one-line ValueError naming the field
(the server answers 400), so a request that reaches the generation thread fails there only for
the server's own reasons: token ids outside the vocabulary, a context that does not fit, a
``max_new_tokens`` beyond the context, a temperature outside ``{0} U [MIN_TEMPERATURE,
MAX_TEMPERATURE]``, a non-finite number, stop ids outside the vocabulary, stop strings that are
not strings, too many or too long, and text that is not valid Unicode (a lone surrogate, which
JSON's ``\\u`` escapes can carry and no reply could echo). Whether the tokenizer can match the
stop strings at all is :func:`check_stop_strings` (it tokenises them, so the server runs it off
its event loop). Stop strings are at most ``MAX_STOP_STRINGS`` of ``MAX_STOP_CHARS`` characters
and are matched on the decoded tail of each row (:mod:`areal_m2po.rollout.engines.stop_strings`),
never through per-vocabulary tables.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import uuid
from dataclasses import dataclass, field
from typing import Any

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.rollout.engines.request_limits import RequestLimits

__all__ = [
    "MAX_STOP_CHARS",
    "MAX_STOP_STRINGS",
    "MAX_TEMPERATURE",
    "MIN_TEMPERATURE",
    "SamplingRequest",
    "check_min_new_tokens",
    "check_stop_strings",
    "checked_text",
    "parse_generate_request",
    "parse_json_object",
]

MIN_TEMPERATURE = 1e-5
"""The lowest non-zero temperature (SGLang's and vLLM's sampling epsilon): below it the logits
divided by the temperature overflow and sampling fails."""
MAX_TEMPERATURE = 100.0
"""The highest temperature (far beyond any useful one; the samples are uniform long before)."""
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
"""Characters of one stop string, and of a request id."""
MAX_STOP_TOKEN_IDS = 256

_UNSUPPORTED_ZERO = ("frequency_penalty", "presence_penalty")


@dataclass
class SamplingRequest:
    """One parsed ``/generate`` request (one prompt, one sample)."""

    input_ids: list[int]
    gconfig: GenerationConfig
    greedy: bool
    stop_token_ids: list[int]
    return_logprob: bool
    rid: str
    future: concurrent.futures.Future[dict[str, Any]] = field(
        default_factory=concurrent.futures.Future
    )

    def batch_key(self) -> tuple[Any, ...]:
        g = self.gconfig
        return (
            g.max_new_tokens,
            g.min_new_tokens,
            g.temperature,
            g.top_p,
            g.top_k,
            tuple(g.stop or ()),
            self.greedy,
            tuple(self.stop_token_ids),
        )


def parse_json_object(raw: bytes, empty_ok: bool = False) -> dict[str, Any]:
    """The JSON object in ``raw``; ValueError (one line) for anything else: not UTF-8, not
    JSON, nested beyond the parser's depth, a number too long to convert, not an object."""
    if not raw and empty_ok:
        return {}
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ValueError("the request body is not JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a 5,000-digit integer
        raise ValueError(f"the request body is not JSON ({' '.join(str(exc).split())})") from None
    if not isinstance(body, dict):
        raise ValueError(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def checked_text(value: Any, name: str, max_chars: int | None = None) -> str:
    """``value`` if it is a string of valid Unicode (no lone surrogate) within ``max_chars``;
    ValueError naming ``name`` otherwise."""
    if not isinstance(value, str):
        raise ValueError(f"{name}: must be a string, got {type(value).__name__}")
    if max_chars is not None and len(value) > max_chars:
        raise ValueError(f"{name}: longer than {max_chars} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name}: not valid Unicode (a lone surrogate)") from None
    return value


def _int(sp: dict[str, Any], key: str, default: int, low: int = 0) -> int:
    value = sp.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"sampling_params.{key}: must be an integer, got {_short(value)}")
    if not low <= value < 2**31:
        raise ValueError(f"sampling_params.{key}: must lie in [{low}, 2**31), got {value}")
    return value


def _float(sp: dict[str, Any], key: str, default: float) -> float:
    value = sp.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"sampling_params.{key}: must be a number, got {_short(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"sampling_params.{key}: must be finite, got {value}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _temperature(sp: dict[str, Any]) -> float:
    t = _float(sp, "temperature", 1.0)
    if t != 0.0 and not MIN_TEMPERATURE <= t <= MAX_TEMPERATURE:
        raise ValueError(
            f"sampling_params.temperature: must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, "
            f"{MAX_TEMPERATURE:g}], got {t:g}"
        )
    return t


def _stop_strings(sp: dict[str, Any]) -> list[str] | None:
    stop = sp.get("stop")
    if stop is None:
        return None
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOP_STRINGS:
        raise ValueError(
            f"sampling_params.stop: must be a string or a list of at most {MAX_STOP_STRINGS} "
            f"strings, got {_short(stop)}"
        )
    for i, s in enumerate(stops):
        checked_text(s, f"sampling_params.stop[{i}]", MAX_STOP_CHARS)
        if not s:
            raise ValueError(f"sampling_params.stop[{i}]: must not be empty")
    return list(stops) or None


def _stop_token_ids(sp: dict[str, Any], vocab: int | None) -> list[int]:
    ids = sp.get("stop_token_ids") or []
    high = vocab if vocab is not None else 2**31
    if not isinstance(ids, list) or len(ids) > MAX_STOP_TOKEN_IDS:
        raise ValueError(
            f"sampling_params.stop_token_ids: must be a list of at most {MAX_STOP_TOKEN_IDS} "
            "token ids"
        )
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < high:
            raise ValueError(
                f"sampling_params.stop_token_ids[{i}]: must be a token id in [0, {high}), "
                f"got {_short(t)}"
            )
    return list(ids)


def _input_ids(body: dict[str, Any], limits: RequestLimits | None) -> list[int]:
    ids = body.get("input_ids")
    if body.get("text") is not None:
        raise ValueError("text: this server takes token ids only (send input_ids)")
    if not isinstance(ids, list) or not ids:
        raise ValueError("input_ids: must be a non-empty list of token ids")
    context = limits.context_len if limits is not None else None
    if context is not None and len(ids) > context:  # before any pass over a huge list
        raise ValueError(
            f"input_ids: {len(ids)} tokens exceed the context of {context} tokens "
            f"({limits.context_name})"  # type: ignore[union-attr]
        )
    if any(isinstance(x, list) for x in ids):
        raise ValueError("input_ids: batched requests are not supported; send one prompt")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
        raise ValueError("input_ids: must hold integers")
    return ids


def _gconfig(sp: dict[str, Any], limits: RequestLimits | None) -> tuple[GenerationConfig, bool]:
    """The generation settings of ``sampling_params`` and whether they are greedy."""
    if _int(sp, "n", 1) != 1:
        raise ValueError("sampling_params.n: must be 1 (send one request per sample)")
    for key in _UNSUPPORTED_ZERO:
        if _float(sp, key, 0.0) != 0.0:
            raise ValueError(f"sampling_params.{key}: only 0 is supported")
    temperature = _temperature(sp)
    greedy = temperature == 0.0
    top_k = _int(sp, "top_k", -1, low=-1)
    max_new_tokens = _int(sp, "max_new_tokens", 128)
    context = limits.context_len if limits is not None else None
    if context is not None and max_new_tokens > context:
        raise ValueError(
            f"sampling_params.max_new_tokens: {max_new_tokens} exceeds the context of "
            f"{context} tokens ({limits.context_name})"  # type: ignore[union-attr]
        )
    min_new_tokens, top_p = _int(sp, "min_new_tokens", 0), _float(sp, "top_p", 1.0)
    stop = _stop_strings(sp)  # each raises naming sampling_params.<key> already
    try:
        gconfig = GenerationConfig(
            n_samples=1,
            max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens,
            temperature=1.0 if greedy else temperature,
            top_p=top_p,
            top_k=0 if top_k < 0 else top_k,
            stop=stop,
        )
    except ValueError as exc:
        raise ValueError(f"sampling_params.{exc}") from None
    return gconfig, greedy


def parse_generate_request(body: Any, limits: RequestLimits | None = None) -> SamplingRequest:
    """Validate a ``/generate`` body against the server's ``limits`` (see the module doc);
    ValueError names the offending field and the limit."""
    if not isinstance(body, dict):
        raise ValueError(f"the body must be a JSON object, got {type(body).__name__}")
    ids = _input_ids(body, limits)
    if body.get("stream"):
        raise ValueError("stream: streaming is not supported")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise ValueError("sampling_params: must be an object")
    gconfig, greedy = _gconfig(sp, limits)
    if limits is not None:
        reason = limits.refusal(ids, gconfig.max_new_tokens)
        if reason is not None:
            raise ValueError(reason)
    return_logprob = body.get("return_logprob", False)
    if not isinstance(return_logprob, bool):
        raise ValueError("return_logprob: must be true or false")
    if greedy and return_logprob:
        raise ValueError("return_logprob: not supported with temperature 0 (greedy)")
    rid = body.get("rid")
    return SamplingRequest(
        input_ids=list(ids),
        gconfig=gconfig,
        greedy=greedy,
        stop_token_ids=_stop_token_ids(sp, limits.vocab_size if limits is not None else None),
        return_logprob=return_logprob,
        rid=checked_text(rid, "rid", MAX_STOP_CHARS) if rid else uuid.uuid4().hex,
    )


def check_stop_strings(tokenizer: Any, stops: list[str] | None) -> None:
    """ValueError when ``tokenizer`` cannot match one of ``stops``: its tokens decode to
    other text (a character no token holds, such as ``€`` in a byte-less vocabulary), so no
    completion could ever hold it. Costs the strings' length (no vocabulary table)."""
    if not stops:
        return
    from areal_m2po.rollout.engines.stop_strings import unmatchable_stop

    bad = unmatchable_stop(tokenizer, stops)
    if bad is not None:
        raise ValueError(
            f"sampling_params.stop: the tokenizer cannot match {_short(bad)} (its tokens "
            "decode to other text)"
        )


def check_min_new_tokens(job: SamplingRequest, eos_ids: list[int], vocab: int | None) -> None:
    """ValueError when ``job`` asks for ``min_new_tokens`` while its stop token ids and the
    model's ``eos_ids`` cover the whole ``vocab``: until the minimum every token would be
    masked, and sampling from no token fails."""
    if job.gconfig.min_new_tokens <= 0 or vocab is None:
        return
    ended = {t for t in (*job.stop_token_ids, *eos_ids) if 0 <= t < vocab}
    if len(ended) >= vocab:
        raise ValueError(
            f"sampling_params.min_new_tokens: {job.gconfig.min_new_tokens} with stop_token_ids "
            f"and EOS covering all {vocab} token ids leaves no token to sample"
        )
