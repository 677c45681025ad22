"""On-policy distillation maths (algo/distill.py): the reverse-KL advantage and its mix with the
task advantage against hand-derived values, the sign against the exact gradient of the reverse
KL, and bad input."""

from __future__ import annotations

import math

import pytest
import torch

from areal_m2po.algo.distill import mix_advantages, reverse_kl_advantages, reverse_kl_sums

T, F = True, False


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_per_token_advantage_is_teacher_minus_student_on_policy_tokens():
    student = _t([[-1.0, -2.0, -0.5, -9.0], [-0.25, -3.0, -1.0, -1.0]])
    teacher = _t([[-0.5, -3.0, -0.5, -1.0], [-1.25, -0.5, -2.0, -2.0]])
    mask = torch.tensor([[T, T, T, F], [T, T, F, F]])
    adv = reverse_kl_advantages(student, teacher, mask)
    # the teacher likes token (0, 0) 0.5 nats more than the student: pushed up; (0, 1) down
    assert adv.tolist() == [[0.5, -1.0, 0.0, 0.0], [-1.0, 2.5, 0.0, 0.0]]
    assert adv.dtype == torch.float32


def test_baseline_is_subtracted_from_every_policy_token():
    student = _t([[-1.0, -2.0, -7.0]])
    teacher = _t([[-0.5, -3.0, -1.0]])
    mask = torch.tensor([[T, T, F]])
    # log-ratios 0.5, -1.0; their mean -0.25 as the baseline: 0.75, -0.75
    adv = reverse_kl_advantages(student, teacher, mask, baseline=-0.25)
    assert adv.tolist() == [[0.75, -0.75, 0.0]]


def test_discounted_form_sums_the_later_policy_tokens_of_the_row():
    # log-ratios r = [1, (5: not a policy token), 2, -4]; a multi-turn row: the tool token at 1
    # neither gets an advantage nor passes one on
    student = torch.zeros(1, 4)
    teacher = _t([[1.0, 5.0, 2.0, -4.0]])
    mask = torch.tensor([[T, F, T, T]])
    # gamma 0.5: A3 = -4, A2 = 2 + 0.5 * -4 = 0, A0 = 1 + 0.5 * 0 = 1
    half = reverse_kl_advantages(student, teacher, mask, discount=0.5)
    assert half.tolist() == [[1.0, 0.0, 0.0, -4.0]]
    # gamma 1: the rest of the row's log-ratio: A0 = 1 + 2 - 4 = -1, A2 = -2, A3 = -4
    whole = reverse_kl_advantages(student, teacher, mask, discount=1.0)
    assert whole.tolist() == [[-1.0, 0.0, -2.0, -4.0]]
    # the baseline comes off each token before discounting: c = [0, 1, -5] on the policy tokens
    centred = reverse_kl_advantages(student, teacher, mask, discount=1.0, baseline=1.0)
    assert centred.tolist() == [[-4.0, 0.0, -4.0, -5.0]]


def test_mix_weights_both_advantages_and_zeroes_the_rest():
    task = _t([[1.0, 1.0, 7.0], [-0.5, -0.5, -0.5]])
    distill = _t([[0.5, -1.0, 3.0], [2.0, 0.0, 1.0]])
    mask = torch.tensor([[T, T, F], [T, T, T]])
    mixed = mix_advantages(task, distill, mask, rl_weight=0.5, distill_weight=2.0)
    assert mixed.tolist() == [[1.5, -1.5, 0.0], [3.75, -0.25, 1.75]]
    pure = mix_advantages(task, distill, mask, rl_weight=0.0, distill_weight=1.0)
    assert pure.tolist() == [[0.5, -1.0, 0.0], [2.0, 0.0, 1.0]]


def test_reverse_kl_sums_over_policy_tokens_in_float64():
    student = _t([[-1.0, -2.0, -0.5], [-0.25, -3.0, -1.0]])
    teacher = _t([[-0.5, -3.0, -9.0], [-1.25, -0.5, -2.0]])
    mask = torch.tensor([[T, T, F], [T, F, F]])
    sums = reverse_kl_sums(student, teacher, mask)
    # student - teacher: -0.5, 1.0, 1.0 on the three policy tokens
    assert sums.dtype == torch.float64 and sums.tolist() == [1.5, 3.0]


def test_policy_gradient_with_the_advantage_is_minus_the_reverse_kl_gradient():
    """For one position with student logits theta: sum_y pi(y) A(y) grad log pi(y) is exactly
    -grad KL(pi || teacher), so ascending the advantage lowers the reverse KL (the sign)."""
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(7, generator=gen, dtype=torch.float64, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(7, generator=gen, dtype=torch.float64), -1)
    logp = torch.log_softmax(theta, -1)
    kl = (logp.exp() * (logp - teacher)).sum()
    (kl_grad,) = torch.autograd.grad(kl, theta)

    ys = torch.arange(7)
    mask = torch.ones(1, 7, dtype=torch.bool)
    adv = reverse_kl_advantages(logp.detach()[None], teacher[None], mask)[0]
    pg = torch.zeros(7, dtype=torch.float64)
    for y in ys:  # the expectation over the next token, term by term
        (g,) = torch.autograd.grad(torch.log_softmax(theta, -1)[y], theta)
        pg += logp.detach()[y].exp() * adv[y] * g
    assert torch.allclose(pg, -kl_grad, atol=1e-12)
    # a baseline leaves the expected gradient unchanged
    centred = reverse_kl_advantages(logp.detach()[None], teacher[None], mask, baseline=0.3)[0]
    pg_c = sum(
        logp.detach()[y].exp()
        * centred[y]
        * torch.autograd.grad(torch.log_softmax(theta, -1)[y], theta)[0]
        for y in ys
    )
    assert torch.allclose(pg_c, -kl_grad, atol=1e-12)


def test_bad_input_is_refused_in_one_line():
    student, teacher = torch.zeros(1, 3), torch.zeros(1, 3)
    mask = torch.tensor([[T, T, F]])
    nan_teacher = _t([[0.0, math.nan, 0.0]])
    with pytest.raises(ValueError, match=r"^teacher_logp is not finite at policy token \[0, 1\]"):
        reverse_kl_advantages(student, nan_teacher, mask)
    inf_outside = _t([[0.0, 0.0, -math.inf]])  # never read: not a policy token
    assert reverse_kl_advantages(student, inf_outside, mask).tolist() == [[0.0, 0.0, 0.0]]
    with pytest.raises(TypeError, match="^loss_mask must be torch.bool"):
        reverse_kl_advantages(student, teacher, mask.float())
    with pytest.raises(ValueError, match=r"^teacher_logp shape \(1, 2\) does not match"):
        reverse_kl_advantages(student, torch.zeros(1, 2), mask)
    with pytest.raises(ValueError, match=r"^discount must be in \[0, 1\], got 1.5"):
        reverse_kl_advantages(student, teacher, mask, discount=1.5)
    with pytest.raises(ValueError, match="^baseline must be finite"):
        reverse_kl_advantages(student, teacher, mask, baseline=math.inf)
    with pytest.raises(TypeError, match="^student_logp must be a floating-point tensor"):
        reverse_kl_sums(torch.zeros(1, 3, dtype=torch.long), teacher, mask)
    with pytest.raises(ValueError, match="^distill_advantages shape"):
        mix_advantages(student, torch.zeros(2, 3), mask, 1.0, 1.0)
