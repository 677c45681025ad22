"""The proximal log-probs from the update's own forward (PPOActor.prox_from_update): with one
PPO minibatch and nothing reading them before the update, the separate proximal pass is skipped
and the gradient and every logged statistic, M2PO's included, are bit-identical to a run that
makes the pass (where the pass sees the update's micro-batches, so its values are the update's
own to the bit)."""

from __future__ import annotations

import pytest
import torch
from actors import tiny_actor

from areal_m2po.api.cli_args import MicroBatchSpec


def _stale_batch(actor, n_groups: int = 3, group: int = 4, seed: int = 0) -> dict:
    """Groups of rows sharing a prompt, generated one version before the actor's, with
    behaviour log-probs away from the policy's so M2PO has something to mask."""
    g = torch.Generator().manual_seed(seed)
    vocab = actor.engine.unwrapped.config.vocab_size
    p_len, c_len = 5, 6
    rows = n_groups * group
    ids = torch.randint(3, vocab, (rows, p_len + c_len), generator=g)
    for k in range(n_groups):
        ids[k * group : (k + 1) * group, :p_len] = ids[k * group, :p_len]
    attn = torch.ones(rows, p_len + c_len, dtype=torch.bool)
    loss = torch.zeros_like(attn)
    loss[:, p_len:] = True
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": loss,
        "behave_logp": (-4.6 + 0.3 * torch.randn(rows, p_len + c_len, generator=g)) * loss,
        "versions": torch.full((rows, p_len + c_len), actor.engine.version - 1),
        "advantages": torch.randn(rows, p_len + c_len, generator=g) * loss,
    }


def _step(from_update: bool, **kw) -> tuple[torch.Tensor, dict, int]:
    torch.manual_seed(0)
    # prox_read_before_update=False: the shortcut may apply
    actor = tiny_actor(4, 6, prox_read_before_update=not from_update, **kw)
    actor.engine.version = 1
    calls = []
    actor.engine.unwrapped.register_forward_pre_hook(lambda *_: calls.append(1))
    batch = _stale_batch(actor)
    actor.engine.forward_tokens(batch, 1.0)  # the one-time checks, not counted below
    calls.clear()
    assert actor.prepare_proximal(batch) == {}
    assert ("prox_logp" in batch) is not from_update
    stats = actor.ppo_update(batch)
    params = torch.cat([p.detach().flatten() for p in actor.engine.unwrapped.parameters()])
    return params, stats, len(calls)


SAME_SPLIT = MicroBatchSpec(max_tokens_per_mb=None, shared_prefix_max_tokens_per_mb=None)


@pytest.mark.parametrize(
    "kw",
    [
        {"m2_threshold": 0.01, "m2_scope": "microbatch", "use_decoupled_loss": True},
        {"m2_threshold": None, "use_decoupled_loss": True},
        {"m2_threshold": 0.01, "m2_scope": "microbatch", "use_decoupled_loss": False},
    ],
    ids=["m2po-microbatch", "m2po-off", "m2po-microbatch-coupled"],
)
def test_gradient_and_stats_are_bit_identical(kw: dict) -> None:
    with_pass = _step(False, mb_spec=SAME_SPLIT, skip_zero_adv_seqs=False, **kw)
    shortcut = _step(True, mb_spec=SAME_SPLIT, skip_zero_adv_seqs=False, **kw)
    assert torch.equal(shortcut[0], with_pass[0])
    assert shortcut[1] == with_pass[1]
    if kw["m2_threshold"] is not None:
        assert shortcut[1]["m2po/masked_fraction"] > 0  # M2PO acted, identically
    assert shortcut[2] < with_pass[2]  # the proximal pass was skipped


@pytest.mark.parametrize(
    "kw",
    [
        {"m2_threshold": 0.04, "m2_scope": "global"},
        {"m2_threshold": None, "ppo_n_minibatches": 2},
        {"m2_threshold": None, "kl_ctl": 0.1},
    ],
    ids=["m2po-global", "two-minibatches", "kl-on-proximal"],
)
def test_the_pass_stays_where_its_result_is_read_first(kw: dict) -> None:
    actor = tiny_actor(4, 6, **kw)
    assert not actor.prox_from_update()
    actor.engine.version = 1
    batch = _stale_batch(actor)
    actor.prepare_proximal(batch)
    assert "prox_logp" in batch


def test_the_pass_stays_for_a_teacher_and_for_current_tokens() -> None:
    # a teacher reads the student's log-probs
    teacher = tiny_actor(4, 6, m2_threshold=None, prox_read_before_update=True)
    teacher.engine.version = 1
    assert not teacher.prox_from_update()
    batch = _stale_batch(teacher)
    teacher.prepare_proximal(batch)
    assert "prox_logp" in batch
    actor = tiny_actor(4, 6, m2_threshold=None)
    actor.engine.version = 1
    assert actor.prox_from_update() and actor.plan.exact_behave_logp
    batch = _stale_batch(actor)
    batch["versions"][0] = 1  # one row of the current version: its mismatch is logged
    stats = actor.prepare_proximal(batch)
    assert "prox_logp" in batch and stats["rollout/logp_mismatch_tokens"] == 6
