"""What the train engine hands the rollout side (``HFTrainEngine.weights_for_rollout``), checked
against references built without the engine: a plain engine hands out its own module, a float16
engine its float32 master weights and a float16 copy, a LoRA engine the merged weights (as
peft's own ``merge_and_unload`` computes them); and the backend is picked from the config."""

from __future__ import annotations

import copy

import pytest
import torch

from areal_m2po.api.cli_args import LoRAConfig, OptimizerConfig, TrainEngineConfig


def _engine(dtype: str = "float32", lora: LoRAConfig | None = None, backend: str = "ddp"):
    from accelerate import Accelerator

    from areal_m2po.engine.train_engine import HFTrainEngine

    torch.manual_seed(0)
    cfg = TrainEngineConfig(
        path="builtin:tiny",
        dtype=dtype,
        optimizer=OptimizerConfig(lr=1e-3),
        lora=lora,
        backend=backend,
    )
    return HFTrainEngine(cfg, Accelerator(cpu=True), total_steps=4)


def _reference_float32() -> dict[str, torch.Tensor]:
    """The tiny model's weights as ``transformers`` loads them in float32, no engine."""
    from transformers import AutoModelForCausalLM

    from areal_m2po.engine.builtin_models import resolve_model_path

    path = resolve_model_path("builtin:tiny")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_the_backend_is_the_one_the_config_names():
    from accelerate import Accelerator

    from areal_m2po.engine.backends import DDPBackend, FSDP2Backend, placement_backend
    from areal_m2po.engine.precision import MixedPrecision

    precision = MixedPrecision("float32", True, False, "cpu")
    acc = Accelerator(cpu=True)
    ddp = placement_backend(TrainEngineConfig(backend="ddp"), acc, precision)
    fsdp2 = placement_backend(TrainEngineConfig(backend="fsdp2"), acc, precision)
    assert (type(ddp), ddp.sharded) == (DDPBackend, False)
    assert (type(fsdp2), fsdp2.sharded) == (FSDP2Backend, True)
    engine = _engine()
    assert type(engine.backend) is DDPBackend and not engine.sharded and not engine.lora


def test_a_plain_engine_hands_its_own_module_and_state():
    engine = _engine()
    engine.version = 7
    weights = engine.weights_for_rollout()
    assert weights.own_module and weights.version == 7
    assert weights.model() is engine.unwrapped  # no copy: generate from the trainer's module
    got = dict(weights.named_tensors())
    want = _reference_float32()
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), name
    assert weights.model_config is engine.unwrapped.config
    assert engine.computes_like_plain_model()


def test_a_float16_engine_hands_float32_masters_and_a_float16_copy():
    """Mixed precision: the tensors are the float32 master weights (here the loaded float32
    weights, before any step), the model a float16 copy, never the trainer's own module."""
    engine = _engine("float16")
    weights = engine.weights_for_rollout()
    assert not weights.own_module
    assert not engine.computes_like_plain_model()  # float16 autocast over float32 masters
    want = _reference_float32()
    got = dict(weights.named_tensors())
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], value), name
    plain = weights.model()
    assert plain is not engine.unwrapped
    for name, value in plain.state_dict().items():
        assert value.dtype == torch.float16 and torch.equal(value, want[name].half()), name


@pytest.mark.parametrize("alpha", [8.0, 16.0])
def test_a_lora_engine_hands_the_merged_weights(alpha):
    """Each adapted layer's tensor is ``W + (alpha / r) B A``, as peft's own merge gives it,
    under the base model's names; the model is a plain causal LM holding the same."""
    pytest.importorskip("peft")
    engine = _engine(lora=LoRAConfig(r=4, alpha=alpha))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # B starts at zero: give the adapter something to merge
        for name, p in engine.unwrapped.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    weights = engine.weights_for_rollout()
    assert not weights.own_module
    want = copy.deepcopy(engine.unwrapped).merge_and_unload().state_dict()
    got = dict(weights.named_tensors())
    assert got.keys() == want.keys()
    base = _reference_float32()
    changed = 0
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-6, msg=name)
        changed += int(not torch.equal(value, base[name]))
    assert changed >= 2 * 7  # every linear layer of both decoder layers moved (tiny: 2 x 7)
    plain = weights.model()
    assert type(plain).__name__ == "LlamaForCausalLM"
    for name, value in plain.state_dict().items():
        torch.testing.assert_close(value, want[name], rtol=0, atol=1e-6, msg=name)
