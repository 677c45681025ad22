"""Steps and micro-batches with no loss-mask token: zero-gradient no-ops, never a crash.

Truncated rows masked by ``overlong_filtering`` have no loss-mask token; rows are sorted by
length before the micro-batch split, so they cluster into micro-batches of their own, and a
step whose every row is truncated has nothing to learn from at all. Such a micro-batch still
runs a forward and a (zero) backward pass through the model, so every rank runs the same
collectives; a step with nothing on any rank takes no optimizer step and counts in
``actor/empty_steps``.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from actors import plain_sgd, tiny_actor

from areal_m2po.api.cli_args import ActorConfig, MicroBatchSpec, OptimizerConfig
from areal_m2po.utils.data import Batch, split_microbatches

ROWS, PROMPT, COMPLETION = 8, 4, 6


def make_batch(vocab: int, masked_rows: list[int], seed: int = 0, clear: bool = True) -> Batch:
    """``ROWS`` rows in the rollout layout; ``masked_rows`` are truncated (``no_eos``) and, with
    ``clear``, have no loss-mask token (as ``overlong_filtering`` leaves them).

    Completion lengths decrease with the row index, so the length sort keeps row order.
    """
    g = torch.Generator().manual_seed(seed)
    width = PROMPT + COMPLETION
    input_ids = torch.randint(3, vocab, (ROWS, width), generator=g)
    attention = torch.zeros(ROWS, width, dtype=torch.bool)
    loss_mask = torch.zeros(ROWS, width, dtype=torch.bool)
    for r in range(ROWS):
        c_len = COMPLETION - r * (COMPLETION - 1) // (ROWS - 1)
        attention[r, : PROMPT + c_len] = True
        loss_mask[r, PROMPT : PROMPT + c_len] = True
    no_eos = torch.zeros(ROWS, dtype=torch.bool)
    no_eos[masked_rows] = True
    if clear:
        loss_mask[masked_rows] = False
    input_ids = torch.where(attention, input_ids, torch.zeros_like(input_ids))
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "no_eos": no_eos,
        "adv": torch.linspace(-1.0, 1.0, ROWS, dtype=torch.float32),
    }


def pg_loss(logp: torch.Tensor, ent: torch.Tensor, mb: Batch):
    """A token-mean policy-gradient loss (the loss of a micro-batch over its own tokens)."""
    m = mb["loss_mask"].float()
    return -(logp * mb["adv"][:, None] * m).sum() / m.sum().clamp(min=1), {
        "mean_logp": (logp * m).sum().detach() / m.sum().clamp(min=1)
    }


def n_tokens(mb: Batch) -> float:
    return float(mb["loss_mask"].sum())


def make_engine(n_mbs: int, packing: bool, opt: OptimizerConfig | None = None):
    from accelerate import Accelerator

    from areal_m2po.engine.train_engine import HFTrainEngine

    cfg = ActorConfig(
        path="builtin:tiny",
        optimizer=opt or plain_sgd(),
        mb_spec=MicroBatchSpec(n_mbs=n_mbs, packing=packing),
    )
    return HFTrainEngine(cfg, Accelerator(cpu=True), total_steps=4)


def state(engine) -> dict[str, torch.Tensor]:
    return copy.deepcopy(engine.unwrapped.state_dict())


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
def test_empty_micro_batch_is_a_zero_gradient_part_of_the_step(packing):
    """n_mbs=4: the last two rows (one micro-batch) are truncated; the step equals n_mbs=1."""
    probe = make_engine(1, packing)
    vocab = int(probe.unwrapped.config.vocab_size)
    batch = make_batch(vocab, masked_rows=[6, 7])
    parts = split_microbatches(batch, 4)
    assert [p.tolist() for p in parts][-1] == [6, 7]  # the premise: one micro-batch is empty
    moved = {}
    for n_mbs in (1, 4):
        engine = make_engine(n_mbs, packing)
        before = state(engine)
        stats, loss_stats = engine.train_batch(batch, pg_loss, n_tokens)
        assert stats["n_micro_batches"] == n_mbs
        assert stats["skipped"] == 0 and stats["empty"] == 0
        assert stats["grad_norm"] > 0
        assert torch.isfinite(torch.tensor(loss_stats["mean_logp"]))
        after = engine.unwrapped.state_dict()
        moved[n_mbs] = {k: after[k] - before[k] for k in before}
    for name, delta in moved[1].items():
        torch.testing.assert_close(moved[4][name], delta, rtol=1e-4, atol=1e-6, msg=name)
    assert max(float(d.abs().max()) for d in moved[1].values()) > 1e-4


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
@pytest.mark.parametrize("n_mbs", [1, 3])
def test_step_with_no_token_takes_no_optimizer_step(packing, n_mbs):
    """Every row truncated: no crash, no optimizer or scheduler step, ``empty`` counted.

    AdamW with weight decay would move the weights even with zero gradients, so unchanged
    weights show that the optimizer did not step.
    """
    adamw = OptimizerConfig(type="adamw", lr=0.1, weight_decay=0.5, lr_scheduler_type="linear")
    engine = make_engine(n_mbs, packing, adamw)
    batch = make_batch(int(engine.unwrapped.config.vocab_size), masked_rows=list(range(ROWS)))
    before = state(engine)
    lr_before = engine.current_lr()
    sched_before = engine.scheduler.last_epoch
    stats, loss_stats = engine.train_batch(batch, pg_loss, n_tokens)
    assert stats["empty"] == 1.0 and stats["skipped"] == 0.0
    assert stats["grad_norm"] == 0.0
    assert stats["n_micro_batches"] == n_mbs
    assert set(loss_stats) == {"mean_logp"}  # the loss stats keep their keys
    assert engine.scheduler.last_epoch == sched_before and engine.current_lr() == lr_before
    for name, w in engine.unwrapped.state_dict().items():
        assert torch.equal(w, before[name]), name
    assert all(not s for s in engine.optimizer.state.values())  # no Adam moments either
    # the next step with tokens is a normal step
    batch = make_batch(int(engine.unwrapped.config.vocab_size), masked_rows=[])
    stats, _ = engine.train_batch(batch, pg_loss, n_tokens)
    assert stats["empty"] == 0.0 and stats["grad_norm"] > 0


def test_constant_loss_is_attached_to_the_forward_graph():
    """A loss function that returns a constant for a micro-batch with nothing to score."""
    engine = make_engine(2, packing=True)
    batch = make_batch(int(engine.unwrapped.config.vocab_size), masked_rows=[4, 5, 6, 7])

    def loss_or_constant(logp, ent, mb):
        if not bool(mb["loss_mask"].any()):
            return torch.zeros(()), {}
        return pg_loss(logp, ent, mb)[0], {}

    stats, _ = engine.train_batch(batch, loss_or_constant, n_tokens)
    assert stats["skipped"] == 0 and stats["empty"] == 0 and stats["grad_norm"] > 0


def test_forward_without_graph_is_a_clear_error():
    from areal_m2po.engine.train_engine import HFTrainEngine

    engine = make_engine(1, packing=False)

    def detached(model, mb, temperature, compute_entropy):
        z = torch.zeros(mb["input_ids"].shape)
        return z, z

    engine = HFTrainEngine(
        engine.config, engine.accelerator, 1, model=engine.unwrapped, forward_fn=detached
    )
    batch = make_batch(int(engine.unwrapped.config.vocab_size), masked_rows=[])
    with pytest.raises(RuntimeError, match="forward_fn must run the model"):
        engine.train_batch(batch, lambda lp, e, mb: (lp.sum(), {}), n_tokens)


# -- the PPO actor ------------------------------------------------------------------------------

SCOPES = {"global": dict(m2_scope="global"), "microbatch": dict(m2_scope="microbatch"), "off": {}}
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def actor_batch(actor, masked_rows: list[int], seed: int = 0) -> Batch:
    """A rollout batch for ``actor`` with stale behaviour log-probs and varied rewards."""
    # the truncated rows keep their loss-mask tokens: compute_advantages (overlong_filtering)
    # takes them out
    vocab = int(actor.engine.unwrapped.config.vocab_size)
    batch = make_batch(vocab, masked_rows, seed, clear=False)
    del batch["adv"]
    g = torch.Generator().manual_seed(seed + 1)
    batch["versions"] = torch.where(batch["loss_mask"], 0, -1)
    batch["rewards"] = torch.rand(ROWS, generator=g)
    batch["prox_logp"] = actor.compute_logp(batch)
    noise = torch.randn(batch["input_ids"].shape, generator=g) * 0.35
    batch["behave_logp"] = (batch["prox_logp"] + noise) * batch["loss_mask"]
    return batch


def make_actor(n_mbs: int, opt: OptimizerConfig | None = None, **actor_kw):
    m2 = {"m2_threshold": 0.04} if "m2_scope" in actor_kw else {}
    return tiny_actor(
        4,
        COMPLETION,
        total_steps=4,
        optimizer=opt or plain_sgd(),
        mb_spec=MicroBatchSpec(n_mbs=n_mbs),
        **m2,
        **actor_kw,
    )


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("scope", sorted(SCOPES))
def test_actor_step_with_every_row_truncated_is_an_empty_step(scope, agg):
    adamw = OptimizerConfig(type="adamw", lr=0.1, weight_decay=0.5)
    actor = make_actor(2, adamw, loss_agg_mode=agg, **SCOPES[scope])
    batch = actor_batch(actor, masked_rows=list(range(ROWS)))
    actor.compute_advantages(batch)
    assert not bool(batch["loss_mask"].any())
    before = state(actor.engine)
    stats = actor.ppo_update(batch)
    assert stats["actor/empty_steps"] == 1.0
    assert stats["actor/skipped_steps"] == 0.0
    assert stats["actor/grad_norm"] == 0.0
    for name, w in actor.engine.unwrapped.state_dict().items():
        assert torch.equal(w, before[name]), name
    assert actor.engine.version == 1  # the step is counted


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("scope", sorted(SCOPES))
def test_actor_truncated_rows_cluster_in_one_micro_batch(scope, agg):
    """n_mbs=4 over 8 rows whose 2 shortest are truncated: one micro-batch has no token.

    Without ``skip_zero_adv_seqs`` (which would leave the zero-advantage truncated rows out,
    and is never applied with m2_scope=microbatch) the truncated rows reach the engine."""
    actor = make_actor(4, loss_agg_mode=agg, skip_zero_adv_seqs=False, **SCOPES[scope])
    batch = actor_batch(actor, masked_rows=[6, 7])
    actor.compute_advantages(batch)
    before = state(actor.engine)
    stats = actor.ppo_update(batch)
    assert stats["actor/empty_steps"] == 0.0 and stats["actor/skipped_steps"] == 0.0
    assert stats["actor/grad_norm"] > 0
    after = actor.engine.unwrapped.state_dict()
    assert max(float((after[k] - before[k]).abs().max()) for k in before) > 1e-6


# -- end to end ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        ["reward.path=toy_rewards:always_zero"],
        ["actor.m2_scope=microbatch", "actor.mb_spec.n_mbs=4"],
    ],
    ids=["zero-reward", "microbatch-scope-4-mbs"],
)
def test_cli_run_with_truncated_rows(tmp_path, extra):
    """The issue's commands: the random tiny model rarely emits EOS within 8 tokens, so with
    ``overlong_filtering`` whole micro-batches (and at seed 6 the first step; seed 1 before
    the own sampler's random stream) are empty."""
    from pathlib import Path

    from areal_m2po.train import main

    tiny = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
    out = tmp_path / "run"
    argv = [
        "--config",
        str(tiny),
        f"output_dir={out}",
        "total_train_steps=2",
        "actor.overlong_filtering=true",
        "evaluator.eval_at_end=false",
        "saver.save_at_end=false",
        "seed=6",
        *extra,
    ]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["actor/skipped_steps"] == 0
        # a step is empty exactly when no token on any rank has a loss weight
        if "m2po/n_valid" in r:
            assert r["actor/empty_steps"] == float(r["m2po/n_valid"] == 0)
    assert records[0]["actor/empty_steps"] == 1.0
