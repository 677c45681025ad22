"""Loss statistics of a step do not depend on how its batch is cut into micro-batches.

``mb_spec.max_tokens_per_mb`` bounds the memory of a training forward (256 tokens by default),
so the main job's batch is now cut into several micro-batches. Mean statistics were already
token-weighted over micro-batches; an extremum statistic (``*_max`` / ``*_min``, e.g.
``actor/importance_weight_max``) is now the extremum over the micro-batches that hold tokens,
i.e. the value one micro-batch gives, where it used to be a weighted mean of per-micro-batch
extrema (and a micro-batch without tokens, reporting 0, pulled it towards 0).
"""

from __future__ import annotations

import pytest
import torch

from areal_m2po.api.cli_args import ActorConfig, MicroBatchSpec, OptimizerConfig

ROWS, WIDTH, PROMPT = 16, 12, 5


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    """16 rows; the 4 longest (full width) have no loss token, so with 4 micro-batches (cut by
    length) one micro-batch has nothing to score."""
    g = torch.Generator().manual_seed(3)
    input_ids = torch.randint(3, vocab, (ROWS, WIDTH), generator=g)
    attention = torch.zeros(ROWS, WIDTH, dtype=torch.bool)
    loss_mask = torch.zeros(ROWS, WIDTH, dtype=torch.bool)
    for r in range(ROWS):
        length = WIDTH if r < 4 else WIDTH - 1 - r % 3
        attention[r, :length] = True
        if r >= 4:
            loss_mask[r, PROMPT:length] = True
    return {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask}


def _loss_fn(logp, ent, mb):
    m = mb["loss_mask"]
    n = m.sum().clamp(min=1)
    loss = -(logp * m).sum() / n
    has = bool(m.any())
    stats = {
        "x/mean": (logp * m).sum().detach() / n,
        "x/logp_max": logp[m].max().detach() if has else torch.zeros(()),
        "x/logp_min": logp[m].min().detach() if has else torch.zeros(()),
    }
    return loss, stats


def _step(n_mbs: int, budget: int | None) -> tuple[dict[str, float], dict[str, float]]:
    from accelerate import Accelerator

    from areal_m2po.engine.train_engine import HFTrainEngine

    sgd = OptimizerConfig(type="sgd", lr=1e-3, beta1=0.0, gradient_clipping=0.0)
    cfg = ActorConfig(
        path="builtin:tiny",
        optimizer=sgd,
        mb_spec=MicroBatchSpec(n_mbs=n_mbs, max_tokens_per_mb=budget),
    )
    torch.manual_seed(0)
    engine = HFTrainEngine(cfg, Accelerator(cpu=True), total_steps=1)
    batch = _batch(int(engine.unwrapped.config.vocab_size))
    return engine.train_batch(batch, _loss_fn, lambda mb: float(mb["loss_mask"].sum()))


def test_extremum_stats_are_extrema_over_micro_batches():
    one_stats, one = _step(1, None)
    four_stats, four = _step(4, None)
    assert (one_stats["n_micro_batches"], four_stats["n_micro_batches"]) == (1, 4)
    assert one["x/logp_max"] < 0  # so a token-less micro-batch's placeholder 0 would show
    for key in ("x/logp_max", "x/logp_min", "x/mean"):
        assert four[key] == pytest.approx(one[key], rel=1e-6, abs=1e-6), key
    assert four_stats["grad_norm"] == pytest.approx(one_stats["grad_norm"], rel=1e-5)


def test_default_token_budget_cuts_the_batch_and_keeps_the_stats():
    assert MicroBatchSpec().max_tokens_per_mb == 256
    one_stats, one = _step(1, None)
    cut_stats, cut = _step(1, 40)  # 40 tokens: 3-4 rows per micro-batch
    assert cut_stats["n_micro_batches"] >= 4
    for key in one:
        assert cut[key] == pytest.approx(one[key], rel=1e-6, abs=1e-6), key
    assert cut_stats["grad_norm"] == pytest.approx(one_stats["grad_norm"], rel=1e-5)


def test_all_micro_batches_without_tokens_report_zero_extrema():
    from accelerate import Accelerator

    from areal_m2po.engine.train_engine import HFTrainEngine

    cfg = ActorConfig(path="builtin:tiny", mb_spec=MicroBatchSpec(n_mbs=2))
    engine = HFTrainEngine(cfg, Accelerator(cpu=True), total_steps=1)
    batch = _batch(int(engine.unwrapped.config.vocab_size))
    batch["loss_mask"][:] = False
    stats, loss_stats = engine.train_batch(batch, _loss_fn, lambda mb: float(mb["loss_mask"].sum()))
    assert stats["empty"] == 1.0
    assert loss_stats["x/logp_max"] == 0.0 and loss_stats["x/logp_min"] == 0.0
