"""AReaL's ``GenerationHyperparameters`` (``areal.api.cli_args`` at areal-project/AReaL
cbff54d6): this package's ``gconfig`` section (:class:`~areal_m2po.api.cli_args.
GenerationConfig`) with AReaL's ``stop_token_ids`` and its two copy methods, so that
``config.gconfig`` of a config read by :func:`~areal_m2po.areal.api.expr_config.
load_expr_config` is what an AReaL workflow takes as ``gconfig``.

One class for one concept: every key and default is the section's own (``n_samples``
defaults to 8 here, as ``gconfig.n_samples`` does; AReaL's hand-built default is 1, which
only matters to code that builds the object without arguments). AReaL keys this trainer
does not honour (``ignore_eos``, ``frequency_penalty``, ``use_beam_search``, ``lora_name``,
...) are refused by the dataclass as unknown keywords, never accepted and ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from areal_m2po.api.cli_args import ConfigError, GenerationConfig
from areal_m2po.api.config.checks import config_field
from areal_m2po.api.engine_api import SamplingParams

__all__ = ["GenerationHyperparameters"]


@dataclass
class GenerationHyperparameters(GenerationConfig):
    """The ``gconfig`` section with AReaL's ``stop_token_ids`` and copy methods."""

    stop_token_ids: list[int] | None = config_field(
        None,
        "AReaL key: token ids that end a completion like EOS (kept as its last token); null: "
        "none beyond EOS.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        ids = self.stop_token_ids
        if ids is not None and not (
            isinstance(ids, list) and all(isinstance(t, int) and t >= 0 for t in ids)
        ):
            raise ConfigError("stop_token_ids", f"must be a list of token ids, got {ids!r}")

    @classmethod
    def of(cls, gconfig: GenerationConfig) -> GenerationHyperparameters:
        """``gconfig`` as this class (the same values; ``stop_token_ids`` kept if it has them)."""
        if isinstance(gconfig, cls):
            return gconfig
        values = {f.name: getattr(gconfig, f.name) for f in dataclasses.fields(GenerationConfig)}
        return cls(**values)

    def new(self, **kwargs: Any) -> GenerationHyperparameters:
        """A copy with ``kwargs`` replaced (checked like the section)."""
        return dataclasses.replace(self, **kwargs)

    def new_with_stop_and_pad_token_ids(self, tokenizer: Any) -> GenerationHyperparameters:
        """A copy whose ``stop_token_ids`` also hold the tokenizer's pad and EOS ids."""
        ids = list(self.stop_token_ids or ())
        for t in (tokenizer.pad_token_id, tokenizer.eos_token_id):
            if t is not None and t not in ids:
                ids.append(int(t))
        return self.new(stop_token_ids=ids)

    def to_openai_args_dict(
        self, exclude_args: list[str] | None = None, api_format: str = "completions"
    ) -> dict[str, Any]:
        """AReaL's arguments of an OpenAI call: ``n``, the token bound
        (``max_completion_tokens``; ``max_output_tokens`` for ``responses``, ``max_tokens``
        for ``openai-agents``), ``temperature``, ``top_p``, ``stop``; the fields named in
        ``exclude_args`` left out."""
        bounds = {
            "completions": "max_completion_tokens",
            "responses": "max_output_tokens",
            "openai-agents": "max_tokens",
        }
        if api_format not in bounds:
            raise ValueError(f"Unsupported API format: {api_format}")
        fields = {"n_samples": "n", "max_new_tokens": bounds[api_format]}
        fields.update({k: k for k in ("temperature", "top_p", "stop")})
        skip = set(exclude_args or ())
        return {key: getattr(self, name) for name, key in fields.items() if name not in skip}

    def to_sampling(self) -> SamplingParams:
        """The :class:`~areal_m2po.api.engine_api.SamplingParams` of one completion
        (``greedy``: temperature 0; ``n_samples`` is not a per-call setting)."""
        return dataclasses.replace(
            SamplingParams.from_gconfig(self), stop_token_ids=tuple(self.stop_token_ids or ())
        )
