"""The rollout (behaviour-policy) engine: batched sampling on the prompts' prefix tree with
an own decode loop (:mod:`.decode_loop`), or with HF ``generate`` for top-k, top-p, a minimum
length, or attention the cascade does not reproduce.

It holds its own copy of the policy weights, updated from the trainer with
:meth:`HFGenerator.update_weights`, and a version number: the behaviour log-probs and the
per-token versions it returns therefore describe exactly the policy that produced each token,
whatever the trainer has done since. A generator built with ``share=True`` instead samples
from the trainer's own module (sync mode, where the behaviour weights always equal the
trainer's when it generates): no second copy of the weights, the same tokens.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.engine.hf_model import output_embeddings
from areal_m2po.engine.prefix_tree import MIN_SAVED_TOKENS
from areal_m2po.rollout.engines.decode_loop import decode, decode_supported
from areal_m2po.rollout.engines.sampled_logprobs import SampledLogprobRecorder
from areal_m2po.rollout.engines.shared_prefill import generate_shared_prefill
from areal_m2po.rollout.engines.stop_strings import TailStopStrings
from areal_m2po.utils.data import Batch
from areal_m2po.utils.host_memory import lifted_mmap_threshold

logger = logging.getLogger("areal_m2po.rollout")


class HFGenerator:
    """Samples completions from a frozen copy of the policy, or from the policy itself.

    Args:
        model: a causal LM whose weights seed the behaviour policy (deep-copied unless
            ``share``).
        tokenizer: its tokenizer (pad/eos ids; decoding; stop strings).
        device: where generation runs.
        share: generate from ``model`` itself, the trainer's policy module, whose weights are
            the behaviour policy's whenever this generator runs (sync mode: the weight sync
            follows every update). :meth:`update_weights` then only sets the version, and
            :meth:`generate` puts the module in eval mode and restores its mode after; its
            ``requires_grad`` flags are left alone (generation runs without gradient).
    """

    def __init__(
        self, model: torch.nn.Module, tokenizer: Any, device: torch.device, share: bool = False
    ) -> None:
        self.share = share
        if share:
            self.model = model
        else:
            self.model = copy.deepcopy(model).to(device)
            self.model.requires_grad_(False)
            self.model.eval()
        self.tokenizer = tokenizer
        self.device = device
        self.version = 0
        # where a run of tokens shared by several prompts is prefilled once (prefix_tree.py);
        # inf: identical prompts only (benchmarks compare the two)
        self.min_saved_tokens: float = MIN_SAVED_TOKENS
        # shared levels kept once, attention per level (cascade_attention.py); None: where the
        # model's attention allows it, False: a DynamicCache copied per row (benchmarks)
        self.cascade: bool | None = None
        # generate with the own decode loop (decode_loop.py) where it applies; False: always
        # HF generate (benchmarks compare the two)
        self.decode_loop = True
        # the host mmap threshold (MiB) this process runs under, lifted while sampling
        # (utils/host_memory.lifted_mmap_threshold); None: left alone. Set only where nothing
        # else allocates meanwhile (the sync rollout in the trainer's process).
        self.restore_mmap_threshold_mib: int | None = None
        eos = tokenizer.eos_token_id
        self.eos_ids: list[int] = list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        for extra in gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos]:
            if extra is not None and int(extra) not in self.eos_ids:
                self.eos_ids.append(int(extra))
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.eos_ids[0]

    @torch.no_grad()
    def update_weights(
        self,
        state_dict: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        version: int,
    ) -> None:
        """Load the trainer's current weights; tokens generated from now on carry ``version``.

        ``state_dict`` is a mapping or an iterable of ``(name, tensor)`` pairs consumed once
        (e.g. full tensors gathered one at a time from a sharded policy), so no second full
        copy of the weights need exist at once. A shared generator holds the trainer's weights
        already: it reads none of them.
        """
        if self.share:
            self.version = version
            return
        own = self.model.state_dict()
        pairs = state_dict.items() if isinstance(state_dict, Mapping) else state_dict
        seen: set[str] = set()
        for name, value in pairs:
            if name in own:
                own[name].copy_(value.to(own[name].device, own[name].dtype))
                seen.add(name)
        missing = [name for name in own if name not in seen]
        # tied weights (lm_head = embeddings) may be listed under one name only
        missing = [n for n in missing if not _is_tied_alias(self.model, n)]
        if missing:
            raise RuntimeError(
                f"rollout weight sync got no value for {len(missing)} tensors (e.g. "
                f"{missing[0]!r}); the behaviour policy would silently keep old weights"
            )
        self.version = version

    def state_dict(
        self, policy: Iterable[tuple[str, torch.Tensor]], policy_version: int
    ) -> dict[str, Any]:
        """``version`` and ``weights`` (on the CPU) for recover checkpoints; ``weights`` is None
        when they equal the trainer's ``policy`` (``(name, tensor)`` pairs, consumed to the end
        when ``policy_version`` equals this engine's: it may be a collective gather), which the
        checkpoint holds already (always, when shared)."""
        if self.share:
            return {"version": self.version, "weights": None}
        weights = self.model.state_dict()
        same = self.version == policy_version and _same_tensors(weights, policy)
        return {
            "version": self.version,
            "weights": None if same else {k: v.cpu() for k, v in weights.items()},
        }

    def load_state_dict(
        self,
        state: Mapping[str, Any],
        policy: Callable[[], Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]],
    ) -> None:
        """Restore :meth:`state_dict`; ``policy()`` gives the weights when it saved none. A
        shared generator accepts saved weights only when they equal the policy's (it has no
        weights of its own to put them in)."""
        weights = state["weights"]
        if self.share and weights is not None:
            if not _same_tensors(weights, self.model.state_dict().items()):
                raise ValueError(
                    "the checkpoint's rollout weights differ from the policy's, and this "
                    "in-process HF engine generates from the policy itself (sync mode)"
                )
            weights = None
        self.update_weights(policy() if weights is None else weights, int(state["version"]))

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        longest = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), longest), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, longest - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, longest - len(p) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _hf_generation_config(
        self, g: GenerationConfig, greedy: bool, n: int, eos_ids: list[int]
    ) -> Any:
        from transformers import GenerationConfig as HFGenerationConfig

        kwargs: dict[str, Any] = {
            "max_new_tokens": g.max_new_tokens,
            "min_new_tokens": g.min_new_tokens,
            "eos_token_id": eos_ids,
            "pad_token_id": self.pad_id,
            "num_return_sequences": n,
            "return_dict_in_generate": False,  # the sequences only: no logits, no cache
            "use_cache": True,
        }
        if greedy:
            kwargs.update(do_sample=False)
        else:
            kwargs.update(
                do_sample=True,
                temperature=g.temperature,
                top_p=g.top_p,
                # 0, not None: transformers 5 reads None as "unset" and applies top_k=50
                top_k=g.top_k,
            )
        return HFGenerationConfig(**kwargs)

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        gconfig: GenerationConfig,
        greedy: bool = False,
        seed: int | None = None,
        stop_token_ids: list[int] | None = None,
        stopping_criteria: Any = None,
    ) -> Batch:
        """Sample ``gconfig.n_samples`` completions per prompt (1 when greedy): rows
        ``i * n .. i * n + n - 1`` are the samples of prompt ``i``.

        ``stop_token_ids`` end a sample like EOS (kept, in the loss mask); ``stopping_criteria``
        (a ``transformers.StoppingCriteriaList``) may end the whole call early (a server paused
        for a weight update): unfinished rows then simply stop.

        Returns a batch in the layout of :mod:`areal_m2po.utils.data`, with the behaviour
        log-probs ``log softmax(logits / temperature)`` over the full vocabulary of each
        sampled token taken from the logits it was sampled from (no second forward pass, one
        step's logits alive at a time; 0 when greedy) and every generated token
        stamped with this engine's version: the sampled distribution's log-probs only without
        ``top_p``/``top_k``/``min_new_tokens`` (refused wherever training reads them).
        """
        if not prompts:
            raise ValueError("generate() got no prompts")
        n = 1 if greedy else gconfig.n_samples
        ids, attn = self._left_pad(prompts)
        eos_ids = self.eos_ids + [int(t) for t in stop_token_ids or [] if t not in self.eos_ids]
        if seed is not None:
            torch.manual_seed(seed)
        with lifted_mmap_threshold(self.restore_mmap_threshold_mib):
            if self._decodes(prompts, gconfig, greedy):
                with self._eval_mode():
                    seqs, logp = self._decode(
                        prompts, ids, gconfig, greedy, n, eos_ids, stopping_criteria
                    )
            else:
                seqs, logp = self._hf_generate(
                    ids, attn, gconfig, greedy, n, eos_ids, stopping_criteria
                )
        p = ids.shape[1]  # seqs: [B*n, P + C]
        gen = seqs[:, p:]
        b, c = gen.shape
        eos = torch.tensor(eos_ids, device=gen.device)
        is_eos = torch.isin(gen, eos)
        # a token is generated if no EOS came strictly before it
        eos_before = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
        gen_mask = ~eos_before
        if self.pad_id not in eos_ids:
            # a sequence finished by a stop string is filled with pad after it
            gen_mask &= ~((gen == self.pad_id).long().cumsum(-1) > 0)
        elif gconfig.stop:
            _drop_fill_after_stop_string(self.tokenizer, gen, is_eos, gen_mask, gconfig.stop)
        no_eos = ~(is_eos & gen_mask).any(-1)
        prompt_mask = attn.bool().repeat_interleave(n, 0)
        full_attn = torch.cat([prompt_mask, gen_mask], 1)
        loss_mask = torch.cat([torch.zeros_like(prompt_mask), gen_mask], 1)
        input_ids = torch.where(full_attn, seqs, torch.full_like(seqs, self.pad_id))
        versions = torch.full_like(input_ids, -1)
        versions[loss_mask] = self.version
        behave_logp = torch.cat(
            [torch.zeros(b, p, dtype=torch.float32, device=gen.device), logp * gen_mask], 1
        )
        return {
            "input_ids": input_ids.cpu(),
            "attention_mask": full_attn.cpu(),
            "loss_mask": loss_mask.cpu(),
            "behave_logp": behave_logp.cpu(),
            "versions": versions.cpu(),
            "no_eos": no_eos.cpu(),
        }

    def _decodes(self, prompts: list[list[int]], g: GenerationConfig, greedy: bool) -> bool:
        """Whether :mod:`.decode_loop` generates this call (else HF ``generate``): the cascade
        is on and fits the model and prompts, and no top-k, top-p or minimum length is set."""
        plain = greedy or (g.top_p >= 1.0 and g.top_k == 0)
        return (
            self.decode_loop
            and self.cascade is not False
            and plain
            and g.min_new_tokens == 0
            and decode_supported(self.model, prompts)
        )

    def _decode(
        self,
        prompts: list[list[int]],
        ids: torch.Tensor,
        g: GenerationConfig,
        greedy: bool,
        n: int,
        eos_ids: list[int],
        stopping_criteria: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`.decode_loop.decode`: the sequences ``[B*n, P + C]`` (``ids`` ``[B, P]``
        repeated, then the generated columns) and the behaviour log-probs ``[B*n, C]``."""
        from transformers import StoppingCriteriaList

        criteria = StoppingCriteriaList(list(stopping_criteria or []))
        strings = TailStopStrings(self.tokenizer, list(g.stop)) if g.stop else None
        prompt_rows = ids.repeat_interleave(n, 0)
        stop = None
        if criteria or strings is not None:

            def stop(active: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
                done = torch.zeros(generated.shape[0], dtype=torch.bool, device=generated.device)
                if criteria:
                    done |= criteria(torch.cat([prompt_rows[active], generated], 1), None)
                if strings is not None:
                    done |= strings.done(generated).to(generated.device)
                return done

        tokens, logp = decode(
            self.model,
            prompts,
            n,
            g.max_new_tokens,
            None if greedy else g.temperature,
            eos_ids,
            self.pad_id,
            self.min_saved_tokens,
            stop,
        )
        return torch.cat([prompt_rows, tokens.to(ids.device)], 1), logp.to(ids.device)

    def _hf_generate(
        self,
        ids: torch.Tensor,
        attn: torch.Tensor,
        g: GenerationConfig,
        greedy: bool,
        n: int,
        eos_ids: list[int],
        stopping_criteria: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """HF ``generate`` (each shared run of prompt tokens prefilled once): the sequences
        ``[B*n, P + C]`` and the behaviour log-probs ``[B*n, C]`` recorded step by step."""
        from transformers import StoppingCriteriaList

        hf_cfg = self._hf_generation_config(g, greedy, n, eos_ids)
        extra: dict[str, Any] = {}
        criteria = StoppingCriteriaList(list(stopping_criteria or []))
        if g.stop:  # matched here, not by transformers' per-vocabulary tables
            criteria.append(TailStopStrings(self.tokenizer, list(g.stop)))
        if criteria:
            extra["stopping_criteria"] = criteria
        recorder = None if greedy else SampledLogprobRecorder(g.temperature)
        if recorder is not None:
            from transformers import LogitsProcessorList

            extra["logits_processor"] = LogitsProcessorList([recorder])
        attached = recorder.attached(self.model) if recorder else contextlib.nullcontext()
        with self._eval_mode(), attached:
            seqs = generate_shared_prefill(
                self.model, ids, attn, hf_cfg, n, self.min_saved_tokens, self.cascade, **extra
            )
        gen = seqs[:, ids.shape[1] :]
        if recorder is None:
            return seqs, torch.zeros(gen.shape, dtype=torch.float32, device=gen.device)
        return seqs, recorder.finish(gen)

    def finish_reasons(
        self,
        batch: Batch,
        max_new_tokens: int,
        stop_token_ids: Iterable[int] = (),
        stop: Iterable[str] | None = None,
        interrupted: bool = False,
    ) -> list[str]:
        """Why each row of a :meth:`generate` batch ended, the first that holds:

        ``stop``: its last token is EOS or one of ``stop_token_ids``, or its text holds one of
        the ``stop`` strings (generation ends at the token completing one): the row is
        complete, also in a batch cut short, and must not be continued; ``length``:
        ``max_new_tokens`` generated; ``abort``: the batch was ``interrupted`` (a pause) before
        the row ended; ``stop`` otherwise.
        """
        ends = set(self.eos_ids) | {int(t) for t in stop_token_ids}
        stops = list(stop or ())
        reasons = []
        for ids, mask in zip(batch["input_ids"], batch["loss_mask"]):
            out = [int(t) for t in ids[mask].tolist()]
            if (out and out[-1] in ends) or (
                stops and any(s in self.tokenizer.decode(out) for s in stops)
            ):
                reasons.append("stop")
            elif len(out) >= max_new_tokens:
                reasons.append("length")
            else:
                reasons.append("abort" if interrupted else "stop")
        return reasons

    @contextlib.contextmanager
    def _eval_mode(self) -> Iterator[None]:
        """The model in eval mode meanwhile, its own mode restored after (shared model)."""
        was_training = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(was_training)

    def decode_completions(self, batch: Batch) -> list[str]:
        """The generated text of every row (EOS and padding stripped)."""
        texts = []
        for ids, mask in zip(batch["input_ids"], batch["loss_mask"]):
            toks = [int(t) for t in ids[mask].tolist() if int(t) not in self.eos_ids]
            texts.append(self.tokenizer.decode(toks, skip_special_tokens=True))
        return texts


class StopWhenSet:
    """A ``transformers`` stopping criterion that ends every row of a ``generate`` call once
    ``flag`` is set (a pause cutting the running batch short)."""

    def __init__(self, flag: threading.Event) -> None:
        self.flag = flag

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        return torch.full(
            (input_ids.shape[0],), self.flag.is_set(), dtype=torch.bool, device=input_ids.device
        )


def _drop_fill_after_stop_string(
    tokenizer: Any,
    gen: torch.Tensor,
    is_eos: torch.Tensor,
    gen_mask: torch.Tensor,
    stop: Iterable[str],
) -> None:
    """Unmask, in place, the pad that follows a stop string when pad is an EOS id.

    HF fills a row that a stop string finished with pad; when pad is also EOS (SmolLM2's
    ``<|im_end|>``), the first fill reads as a generated EOS. A row's first EOS is such a fill
    when the tokens before it already contain a stop string (generation stops at the token
    completing one, so that token is the last before the fill).

    Args:
        gen: generated ids [B, C]; is_eos: [B, C] bool; gen_mask: [B, C] bool, changed in place.
    """
    stops = list(stop)
    first = is_eos.long().argmax(-1)  # [B] first EOS column (0 when the row has none)
    for row in range(gen.shape[0]):
        end = int(first[row])
        if end == 0 or not bool(is_eos[row, end]):
            continue
        text = tokenizer.decode(gen[row, :end].tolist())
        if any(s in text for s in stops):
            gen_mask[row, end:] = False


def _is_tied_alias(model: torch.nn.Module, name: str) -> bool:
    """True for the output embedding when it is tied to the input embedding."""
    if not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        return False
    return output_embeddings(model) is not None and name.startswith("lm_head.")


def _same_tensors(a: Mapping[str, torch.Tensor], b: Iterable[tuple[str, torch.Tensor]]) -> bool:
    """Whether the ``(name, tensor)`` pairs ``b`` (consumed to the end) equal ``a``."""
    same, seen = True, set()
    for k, v in b:
        seen.add(k)
        same = same and k in a and torch.equal(a[k].cpu(), v.cpu())
    return same and seen == set(a)
