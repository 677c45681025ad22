"""On-policy distillation: the per-token reverse-KL advantage and its mix with the task reward's.

The student samples ``y``; a frozen teacher scores the same tokens. For each policy token ``t``
(``loss_mask``) the log-ratio ``r_t = log pi_teacher(y_t) - log pi_student(y_t)`` (nats) is
minus the single-sample estimate of the reverse KL ``KL(student || teacher)`` at that
position, so a policy gradient on ``r`` lowers the reverse KL: tokens the teacher finds likelier
than the student does are pushed up, the others down (the Thinking Machines / Tinker recipe,
slime's and AReaL's on-policy distillation). Sign and form:

* :func:`reverse_kl_advantages`: with ``c_t = r_t - baseline``, ``A_t = c_t`` (``discount = 0``:
  the per-token form of slime, AReaL and Tinker) or ``A_t = sum_{k >= t} discount^(k - t) c_k``
  over the policy tokens of the row (Tinker's ``kl_discount_factor``; ``discount = 1`` is the
  rest of the sequence's log-ratio). ``baseline`` is a constant: Tinker subtracts the batch's
  mean log-ratio (a variance-reducing baseline: the expected gradient is unchanged), slime and
  AReaL none (0);
* :func:`mix_advantages`: ``rl_weight * A_task + distill_weight * A_distill`` on the policy
  tokens, 0 elsewhere (slime adds ``-opd_kl_coef * (student - teacher)`` to the estimator's
  advantages the same way);
* :func:`reverse_kl_sums`: the sum of ``log pi_student - log pi_teacher`` over the policy tokens
  and their count (float64 ``[2]``), so the mean can be taken over several ranks.

Per-token tensors are float ``[B, T]`` with a ``torch.bool`` ``loss_mask`` of the same shape.
The module imports only torch and :mod:`areal_m2po.algo`; it keeps no state.
"""

from __future__ import annotations

import math

import torch

from areal_m2po.algo.advantages import gae_advantages
from areal_m2po.algo.checks import check_bool_mask, check_real, check_same_shape, check_tensor

__all__ = ["mix_advantages", "reverse_kl_advantages", "reverse_kl_sums"]


def _checked_logps(
    student_logp: torch.Tensor, teacher_logp: torch.Tensor, loss_mask: torch.Tensor
) -> None:
    """Both log-prob tensors float, shaped like ``loss_mask`` (2-D), finite on its tokens."""
    check_tensor("student_logp", student_logp, floating=True)
    check_tensor("teacher_logp", teacher_logp, floating=True)
    check_bool_mask("loss_mask", loss_mask)
    check_same_shape("loss_mask", loss_mask, student_logp=student_logp, teacher_logp=teacher_logp)
    if loss_mask.ndim != 2:
        raise ValueError(f"loss_mask must be 2-D [B, T], got shape {tuple(loss_mask.shape)}")
    for name, x in (("student_logp", student_logp), ("teacher_logp", teacher_logp)):
        bad = loss_mask & ~torch.isfinite(x)
        if bool(bad.any()):
            row, col = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"{name} is not finite at policy token [{row}, {col}]: {x[row, col]}")


def reverse_kl_advantages(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    loss_mask: torch.Tensor,
    discount: float = 0.0,
    baseline: float = 0.0,
) -> torch.Tensor:
    """The reverse-KL advantage of each policy token, float ``[B, T]``, 0 outside ``loss_mask``.

    Args:
        student_logp, teacher_logp: log-probs (nats) of the sampled tokens under the student and
            the teacher, float ``[B, T]``, finite on the policy tokens.
        loss_mask: bool ``[B, T]``, the student's own tokens (a multi-turn row's tool and user
            tokens are outside it and neither get nor pass on an advantage).
        discount: 0: ``A_t = log pi_teacher(y_t) - log pi_student(y_t) - baseline``; in
            ``(0, 1]``: the discounted sum of that over this and the later policy tokens of the
            row.
        baseline: subtracted from every policy token's log-ratio before discounting (nats),
            e.g. the batch's mean log-ratio (minus :func:`reverse_kl_sums`' mean).
    Raises:
        TypeError, ValueError: a wrong type, shape or dtype, a non-finite log-prob on a policy
            token, or a discount outside ``[0, 1]``.
    """
    _checked_logps(student_logp, teacher_logp, loss_mask)
    gamma = check_real("discount", discount)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {gamma}")
    b = check_real("baseline", baseline)
    if not math.isfinite(b):
        raise ValueError(f"baseline must be finite, got {b}")
    log_ratio = torch.where(loss_mask, teacher_logp - student_logp - b, 0.0)
    if gamma == 0.0:
        return log_ratio
    adv, _ = gae_advantages(log_ratio, torch.zeros_like(log_ratio), loss_mask, gamma, 1.0)
    return adv.to(log_ratio.dtype)


def mix_advantages(
    task_advantages: torch.Tensor,
    distill_advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    rl_weight: float,
    distill_weight: float,
) -> torch.Tensor:
    """``rl_weight * task_advantages + distill_weight * distill_advantages`` on the policy
    tokens, 0 elsewhere; float ``[B, T]`` in the promoted dtype of the two advantages."""
    check_tensor("task_advantages", task_advantages, floating=True)
    check_tensor("distill_advantages", distill_advantages, floating=True)
    check_bool_mask("loss_mask", loss_mask)
    check_same_shape(
        "loss_mask",
        loss_mask,
        task_advantages=task_advantages,
        distill_advantages=distill_advantages,
    )
    a = check_real("rl_weight", rl_weight)
    b = check_real("distill_weight", distill_weight)
    return torch.where(loss_mask, a * task_advantages + b * distill_advantages, 0.0)


def reverse_kl_sums(
    student_logp: torch.Tensor, teacher_logp: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """``[sum of (student_logp - teacher_logp) over the policy tokens, their count]`` as float64
    ``[2]``: summed over ranks, their ratio is the mean sampled reverse KL per policy token."""
    _checked_logps(student_logp, teacher_logp, loss_mask)
    diff = torch.where(loss_mask, student_logp.double() - teacher_logp.double(), 0.0)
    return torch.stack([diff.sum(), loss_mask.sum().double()])
