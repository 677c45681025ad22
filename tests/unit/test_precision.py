"""float16 mixed precision of the train engine (float32 masters, float16 autocast, a dynamic
loss scale) and the finiteness check before a save."""

from __future__ import annotations

import math

import pytest
import torch

from areal_m2po.api.cli_args import OptimizerConfig, TrainEngineConfig
from areal_m2po.api.errors import NonFiniteWeightsError
from areal_m2po.engine.precision import (
    LossScale,
    MixedPrecision,
    check_finite_weights,
    load_dtype,
)

pytestmark = pytest.mark.usefixtures("restore_threads")


def test_loss_scale_halves_on_overflow_and_doubles_after_good_steps():
    scale = LossScale(init_scale=8.0, growth_interval=3)
    scale.update(overflow=True)
    assert scale.scale == 4.0
    for _ in range(2):
        scale.update(overflow=False)
    assert scale.scale == 4.0
    scale.update(overflow=False)
    assert scale.scale == 8.0 and scale.good_steps == 0
    scale.update(overflow=False)
    restored = LossScale()
    restored.load_state_dict(scale.state_dict())
    assert (restored.scale, restored.good_steps) == (8.0, 1)


def test_an_overflow_is_a_finite_loss_with_a_non_finite_gradient_above_scale_one():
    mp = MixedPrecision("float16", trainable=True, sharded=False, device_type="cpu")
    assert mp.overflowed(loss_finite=True, grad_finite=False) and mp.scale == 2.0**15
    # a non-finite loss is no overflow and leaves the scale alone
    assert not mp.overflowed(loss_finite=False, grad_finite=False) and mp.scale == 2.0**15
    assert mp.loss_scale is not None
    mp.loss_scale.scale = 1.0  # the gradient is non-finite even unscaled
    assert not mp.overflowed(loss_finite=True, grad_finite=False) and mp.scale == 1.0
    for dtype, trainable in (("float32", True), ("bfloat16", True), ("float16", False)):
        off = MixedPrecision(dtype, trainable, sharded=False, device_type="cpu")
        assert not off.enabled and off.scale == 1.0
        assert not off.overflowed(loss_finite=True, grad_finite=False)


def test_load_dtype_gives_float32_masters_to_trained_float16_models_only():
    assert load_dtype("float16", trainable=True, lora=False) == "float32"
    assert load_dtype("float16", trainable=True, lora=True) == "float16"  # frozen base
    assert load_dtype("float16", trainable=False, lora=False) == "float16"
    assert load_dtype("bfloat16", trainable=True, lora=False) == "bfloat16"


def test_check_finite_weights_names_the_first_bad_tensor():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    check_finite_weights(model, "x")
    with torch.no_grad():
        model[1].bias[0] = math.nan
    with pytest.raises(NonFiniteWeightsError, match=r"^not saving out/final: 1 of 4 .*1\.bias"):
        check_finite_weights(model, "out/final")


def _engine(dtype: str, lr: float = 1e-3):
    from accelerate import Accelerator

    from areal_m2po.engine.train_engine import HFTrainEngine

    config = TrainEngineConfig(path="builtin:tiny", dtype=dtype, optimizer=OptimizerConfig(lr=lr))
    return HFTrainEngine(config, Accelerator(cpu=True), total_steps=4)


def _sft_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 60, (4, 12), generator=gen)
    mask = torch.zeros(4, 12, dtype=torch.bool)
    mask[:, 6:] = True
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": mask}


def _step(engine) -> dict[str, float]:
    from areal_m2po.trainer.sft_trainer import sft_loss_weight, sft_microbatch_loss

    stats, _ = engine.train_batch(_sft_batch(), sft_microbatch_loss, sft_loss_weight)
    return stats


def test_a_float16_engine_keeps_float32_masters_and_steps_like_float32():
    """One AdamW step of the float16 engine moves the weights as the float32 engine's does
    (the first AdamW step is lr * sign(grad): float16 compute flips at most a few signs of
    near-zero gradients), with float32 parameters and optimizer state; the bare float16
    model's step (AdamW on float16 parameters) loses it."""
    torch.manual_seed(0)
    half, full = _engine("float16"), _engine("float32")
    assert all(p.dtype == torch.float32 for p in half.model.parameters())
    before = {n: p.detach().clone() for n, p in full.unwrapped.named_parameters()}
    stats = _step(half)
    assert stats["skipped"] == 0 and stats["overflow"] == 0 and stats["loss_scale"] == 2.0**16
    _step(full)
    lr = 1e-3
    diffs = []
    for name, p in half.unwrapped.named_parameters():
        d_half = p.detach() - before[name]
        d_full = dict(full.unwrapped.named_parameters())[name].detach() - before[name]
        assert float((d_half - d_full).abs().max()) <= 2 * lr + 1e-6, name
        diffs.append((d_half - d_full).abs().flatten())
    off = torch.cat(diffs) > 1e-2 * lr
    assert float(off.float().mean()) < 0.01
    state = half.optimizer.state_dict()["state"]
    assert state and all(s["exp_avg"].dtype == torch.float32 for s in state.values())
    assert half.build_full_model().dtype == torch.float16  # the rollout copy


def test_an_overflow_skips_the_optimizer_step_and_halves_the_scale():
    engine = _engine("float16")
    assert engine.precision.loss_scale is not None
    engine.precision.loss_scale.scale = 1e30  # any float16 gradient overflows
    before = {n: p.detach().clone() for n, p in engine.unwrapped.named_parameters()}
    stats = _step(engine)
    assert (stats["overflow"], stats["skipped"], stats["loss_scale"]) == (1.0, 0.0, 1e30)
    assert engine.precision.scale == 5e29
    for name, p in engine.unwrapped.named_parameters():
        assert torch.equal(p.detach(), before[name]), name
    # the scale travels with the training state
    state = engine.training_state()
    assert state["loss_scale"]["scale"] == 5e29
