"""The device audit's fixes leave the CPU numbers as they were (issue 50)."""

from __future__ import annotations

import torch

from areal_m2po.algo.ppo_loss import PPOLossSpec, ppo_actor_loss


def _stats(valid_rows: int) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(3)
    logp, prox, behave = (torch.randn(3, 5, generator=g) * 0.3 for _ in range(3))
    adv = torch.randn(3, 5, generator=g)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[:valid_rows, 1:4] = True
    spec = PPOLossSpec(eps_clip=0.2)
    return ppo_actor_loss(logp, prox, behave, adv, mask, spec, None)[1], (logp, prox, behave, mask)


def test_loss_extrema_are_the_valid_tokens_extrema():
    """The extrema filled instead of selected: equal to the selection's max/min, bit for bit."""
    stats, (logp, prox, behave, mask) = _stats(2)
    ratio = torch.exp(logp - prox)
    weight = torch.exp(prox - behave)
    assert stats["actor/importance_weight_max"].item() == ratio[mask].max().float().item()
    assert stats["actor/importance_weight_min"].item() == ratio[mask].min().float().item()
    assert stats["actor/behave_imp_weight_max"].item() == weight[mask].max().float().item()


def test_loss_extrema_without_a_valid_token_are_zero():
    stats, _ = _stats(0)
    for key in ("importance_weight_max", "importance_weight_min", "behave_imp_weight_max"):
        assert stats[f"actor/{key}"].item() == 0.0
        assert stats[f"actor/{key}"].dtype == torch.float32


def test_sapo_gate_min_is_the_valid_tokens_minimum():
    from areal_m2po.algo.sapo_loss import sapo_loss, sapo_token_terms

    g = torch.Generator().manual_seed(5)
    logp, prox, adv = (torch.randn(3, 5, generator=g) * 0.4 for _ in range(3))
    for rows in (2, 0):
        mask = torch.zeros(3, 5, dtype=torch.bool)
        mask[:rows, 1:4] = True
        args = (logp, prox, adv, 1.0, 1.05, mask, None, "token-mean")
        _, stats = sapo_loss(*args)
        gate = sapo_token_terms(*args).gate
        want = gate[mask].min().float().item() if rows else 0.0
        assert stats["sapo/gate_min"].item() == want
