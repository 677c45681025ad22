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


def test_filter_groups_keeps_the_informative_groups():
    """Rows of the groups whose rewards differ, indices built on the rewards' device; the first
    group when none differs."""
    from areal_m2po.trainer.rollout_stats import filter_groups

    batch = {
        "rewards": torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]),
        "ids": torch.arange(8),
    }
    kept, dropped = filter_groups(batch, 2)
    assert kept["ids"].tolist() == [2, 3, 6, 7] and dropped == 0.5
    same = {"rewards": torch.ones(4), "ids": torch.arange(4)}
    kept, dropped = filter_groups(same, 2)
    assert kept["ids"].tolist() == [0, 1] and dropped == 1.0


def test_rollout_stats_sums_and_counts():
    from areal_m2po.trainer.rollout_stats import rollout_stats

    mask = torch.tensor([[False, True, True], [False, True, False]])
    batch = {
        "rewards": torch.tensor([1.0, 3.0]),
        "loss_mask": mask,
        "versions": torch.where(mask, 4, -1),
        "no_eos": torch.tensor([True, False]),
    }
    stats = rollout_stats(batch, {}, version=5)
    assert stats["reward/mean"] == 2.0 and stats["reward/std"] == 1.0
    assert stats["rollout/gen_len_mean"] == 1.5 and stats["rollout/no_eos_fraction"] == 0.5
    assert stats["rollout/staleness"] == 1.0
