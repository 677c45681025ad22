"""The teacher of on-policy distillation (``teacher`` section): a frozen causal LM that scores
the student's sampled tokens, and the advantage it adds.

Each step, after the proximal and reference log-probs (``RLTrainer._learn``):

* :meth:`Teacher.score` sets ``batch["teacher_logp"]``: the teacher's log-probs of the tokens the
  student sampled, ``log_softmax(logits / T)`` at the rollout temperature ``T``
  (``gconfig.temperature``, the one the behaviour and proximal log-probs are taken at), on the
  policy tokens (``loss_mask``) and 0 elsewhere: a multi-turn row's tool and user tokens are not
  scored;
* after the actor's task advantages (its estimator and ``adv_norm``),
  :meth:`Teacher.mix_advantages` replaces ``batch["advantages"]`` with
  ``rl_loss_weight * A_task + distill_loss_weight * A_distill``
  (:mod:`areal_m2po.algo.distill`), the student's log-probs being the proximal ones (the policy
  at step start, the one the update improves). The loss, M2PO and the decoupled correction read
  the advantages as in RL; ``returns`` (the critic's targets) stay the task's.

:func:`check_same_vocabulary` refuses, before any model loads, a teacher whose tokenizer or
vocabulary is not the student's: the teacher must score the student's token ids.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from areal_m2po.algo.distill import mix_advantages, reverse_kl_advantages, reverse_kl_sums
from areal_m2po.api.cli_args import ConfigError, PPOConfig, TeacherConfig, TrainEngineConfig
from areal_m2po.engine.builtin_models import resolve_model_path
from areal_m2po.engine.train_engine import HFTrainEngine
from areal_m2po.utils import dist
from areal_m2po.utils.data import Batch

__all__ = ["Teacher", "build_teacher", "check_same_vocabulary"]

logger = logging.getLogger("areal_m2po.trainer")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _vocab_difference(teacher: dict[str, int], student: dict[str, int]) -> str | None:
    """How two tokenizers' vocabularies (token -> id) differ, in a few words; None: equal."""
    if teacher == student:
        return None
    if len(teacher) != len(student):
        return f"{len(teacher)} tokens, the student's {len(student)}"
    # equal sizes, unequal maps: some student token has another id (or none) in the teacher's
    token, i = next(
        (tok, i) for tok, i in sorted(student.items(), key=lambda x: x[1]) if teacher.get(tok) != i
    )
    return f"token {token!r} has id {teacher.get(token)}, the student's {i}"


def check_same_vocabulary(teacher_path: str, student_path: str, tokenizer: Any) -> None:
    """Refuse a teacher that cannot score the student's token ids, from config and tokenizer
    files only (no weights): its tokenizer (when its folder has one) must map every token to
    the same id as the student's ``tokenizer``, and its output layer must cover every id the
    student can sample (without a tokenizer: the same vocabulary size as the student's model).

    Raises:
        ConfigError: ``teacher.path``, one line saying what differs or why it cannot be read.
    """
    from transformers import AutoConfig, AutoTokenizer

    resolved = resolve_model_path(teacher_path)
    try:
        teacher_config = AutoConfig.from_pretrained(resolved)
    except (OSError, ValueError) as exc:
        msg = f"{teacher_path!r} does not load: {_first_line(exc)}"
        raise ConfigError("teacher.path", msg) from None
    teacher_vocab = int(teacher_config.vocab_size)
    try:
        teacher_tok = AutoTokenizer.from_pretrained(resolved)
    except (OSError, ValueError, TypeError):
        teacher_tok = None
    n_ids = len(tokenizer)
    if teacher_tok is not None:
        diff = _vocab_difference(teacher_tok.get_vocab(), tokenizer.get_vocab())
        if diff is not None:
            raise ConfigError(
                "teacher.path",
                f"{teacher_path!r} has another tokenizer than the student ({diff}); on-policy "
                "distillation scores the student's token ids with the teacher, so both must "
                "share one tokenizer",
            )
    else:
        student_vocab = int(AutoConfig.from_pretrained(resolve_model_path(student_path)).vocab_size)
        n_ids = max(n_ids, student_vocab)
        if teacher_vocab != student_vocab:
            raise ConfigError(
                "teacher.path",
                f"{teacher_path!r} has a vocabulary of {teacher_vocab} tokens and no tokenizer "
                f"to compare, the student ({student_path}) {student_vocab}; the teacher must "
                "share the student's tokenizer",
            )
    if teacher_vocab < n_ids:
        raise ConfigError(
            "teacher.path",
            f"{teacher_path!r} outputs {teacher_vocab} token ids, fewer than the student's "
            f"tokenizer's {n_ids}",
        )


class Teacher:
    """A frozen teacher over an engine with ``forward_tokens`` (an :class:`HFTrainEngine` built
    with ``trainable=False``).

    Args:
        config: the ``teacher`` section (the advantage weights and ``kl_discount``).
        engine: the teacher model.
        temperature: the rollout temperature (``gconfig.temperature``).
    """

    def __init__(self, config: TeacherConfig, engine: Any, temperature: float) -> None:
        self.config = config
        self.engine = engine
        self.temperature = temperature

    def score(self, batch: Batch) -> None:
        """Set ``batch["teacher_logp"]``, float32 ``[B, T]``: the teacher's log-probs of the
        batch's tokens at :attr:`temperature` on ``batch["loss_mask"]``, 0 elsewhere."""
        logp, _ = self.engine.forward_tokens(batch, self.temperature)
        batch["teacher_logp"] = torch.where(batch["loss_mask"], logp, 0.0)

    def mix_advantages(self, batch: Batch) -> dict[str, float]:
        """Replace ``batch["advantages"]`` (the task's, ``[B, T]``) with the weighted sum of it
        and the reverse-KL advantage of ``prox_logp`` against ``teacher_logp`` (centred on the
        batch's mean log-ratio with ``center_reverse_kl``). Returns
        ``distill/reverse_kl``: the mean of ``prox_logp - teacher_logp`` over the policy tokens
        of all ranks (nats per token)."""
        c = self.config
        mask = batch["loss_mask"]
        student, teacher = batch["prox_logp"], batch["teacher_logp"]
        total, count = dist.all_reduce_sum(reverse_kl_sums(student, teacher, mask)).tolist()
        reverse_kl = total / count if count else 0.0
        baseline = -reverse_kl if c.center_reverse_kl else 0.0  # the mean log-ratio
        distill = reverse_kl_advantages(student, teacher, mask, c.kl_discount, baseline)
        batch["advantages"] = mix_advantages(
            batch["advantages"], distill, mask, c.rl_loss_weight, c.distill_loss_weight
        )
        return {"distill/reverse_kl": reverse_kl}


def build_teacher(config: PPOConfig, accelerator: Any, tokenizer: Any) -> Teacher | None:
    """The run's :class:`Teacher` (None without a ``teacher`` section): the vocabulary checked
    first (:func:`check_same_vocabulary`), then the model loaded frozen, placed like the
    reference model (the actor's backend, FSDP settings and micro-batches)."""
    t = config.teacher
    if t is None:
        return None
    assert t.path is not None  # PPOConfig refuses a teacher section without a path
    check_same_vocabulary(t.path, config.actor.path, tokenizer)
    engine_config = TrainEngineConfig(
        path=t.path,
        dtype=t.dtype,
        attn_implementation=t.attn_implementation,
        backend=config.actor.backend,
        fsdp=config.actor.fsdp,
        mb_spec=config.actor.mb_spec,
    )
    engine = HFTrainEngine(engine_config, accelerator, 0, trainable=False)
    logger.info(
        "on-policy distillation from %s: advantage = %s x task + %s x reverse-KL (discount %s)",
        t.path,
        t.rl_loss_weight,
        t.distill_loss_weight,
        t.kl_discount,
    )
    return Teacher(t, engine, config.gconfig.temperature)
