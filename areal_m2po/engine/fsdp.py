"""FSDP2 sharding of a Hugging Face model on the process group ``accelerate launch`` set up.

The model is sharded with ``torch.distributed.fsdp.fully_shard``: one unit per decoder layer
(the classes named in the model's ``_no_split_modules``) plus the root (embeddings, final norm,
LM or value head). Every parameter is then a ``DTensor`` sharded along dim 0 over all ranks, and
the optimizer built on ``model.parameters()`` holds only this rank's shard of its state.

Every forward of a sharded model is a collective (all-gather per unit), and so is every
backward (reduce-scatter per unit): all ranks must run the same number of them.
:func:`idle_forward` is the forward a rank with nothing to score runs to keep in step.

Weights leave the sharded model in three ways:

* :func:`iter_full_tensors`: one full tensor at a time, on every rank (rollout sync; no rank
  holds more than one gathered tensor beyond what the consumer keeps);
* :func:`full_state_dict_on_rank0`: the whole state on rank 0's CPU (HF ``save_pretrained``);
* :func:`save_sharded` / :func:`load_sharded`: model and optimizer shards with
  ``torch.distributed.checkpoint`` (recover checkpoints; nothing is gathered).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.distributed as torch_dist

from areal_m2po.api.cli_args import FSDPEngineConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder layers: modules whose class is in ``model._no_split_modules``.

    Raises:
        ValueError: when the model names no such classes or none is found.
    """
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"backend fsdp2: found no decoder layers in {type(model).__name__} "
            f"(_no_split_modules={sorted(names)}); it cannot be sharded layer by layer"
        )
    return layers


def _broadcast_from_rank0(model: torch.nn.Module) -> None:
    """Make every rank's copy equal to rank 0's before sharding (as DDP does when wrapping)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            torch_dist.broadcast(tensor.data, src=0)


def shard_model(
    model: torch.nn.Module, config: FSDPEngineConfig, device: torch.device
) -> torch.nn.Module:
    """``fully_shard`` each decoder layer, then the root, over all ranks of the default group.

    The model is moved to ``device`` and synchronised from rank 0 first. Returns the same
    module (FSDP2 changes its class in place; state-dict keys are unchanged).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    model = model.to(device)
    _broadcast_from_rank0(model)
    mesh = init_device_mesh(device.type, (torch_dist.get_world_size(),))
    param_dtype = _DTYPES[config.param_dtype] if config.param_dtype else None
    reduce_dtype = _DTYPES[config.reduce_dtype] if config.reduce_dtype else None
    kwargs: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
    }
    if config.offload_params:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, reshard_after_forward=config.reshard_after_forward, **kwargs)
    fully_shard(model, reshard_after_forward=config.reshard_after_forward, **kwargs)
    return model


def set_grad_sync(model: torch.nn.Module, enabled: bool) -> None:
    """Whether the next backward reduce-scatters gradients (FSDP2's ``no_sync``)."""
    model.set_requires_gradient_sync(enabled)  # type: ignore[operator]


def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip sharded gradients to a global L2 norm of ``max_norm``; returns the norm before
    clipping as a plain 0-dim tensor (the same on every rank)."""
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return norm


def idle_forward(model: torch.nn.Module, device: torch.device) -> torch.Tensor:
    """One forward of a single token, for a rank with nothing to compute while the others run
    a forward. Returns ``0 * sum(outputs)``: a 0-dim float32 zero tied to every parameter the
    forward used, so its backward joins the others' gradient reduction and adds nothing."""
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return out.logits.float().sum() * 0.0


def iter_full_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` of every state-dict entry, gathered one at a time on every rank
    (a collective: all ranks must consume the whole iterator). Tensors are on the compute
    device; a CPU-offloaded shard is moved there for the gather."""
    from torch.distributed.tensor import DTensor

    for name, value in model.state_dict().items():
        if isinstance(value, DTensor):
            mesh_type = value.device_mesh.device_type
            if value.device.type != mesh_type:
                value = value.to(mesh_type)
            yield name, value.full_tensor()
        else:
            yield name, value


def full_state_dict_on_rank0(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full model state on rank 0's CPU (empty on the other ranks); a collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    # full_state_dict=True gathers every entry into a plain tensor (no DTensor/ShardedTensor)
    return cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))


def save_sharded(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, directory: str
) -> None:
    """Write this rank's shards of the model (and optimizer) state into ``directory`` with
    ``torch.distributed.checkpoint``; a collective, every rank writes its own files."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        state: dict[str, Any] = {"model": get_model_state_dict(model)}
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optimizer": optim_sd}
    dcp.save(state, checkpoint_id=directory)


def load_sharded(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, directory: str
) -> None:
    """Load what :func:`save_sharded` wrote (same world size); a collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    if optimizer is None:
        state: dict[str, Any] = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=directory)
        set_model_state_dict(model, state["model"])
        return
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )


def local_nbytes(t: torch.Tensor) -> int:
    """Bytes of this rank's part of ``t`` (its local shard for a ``DTensor``)."""
    from torch.distributed.tensor import DTensor

    local = t.to_local() if isinstance(t, DTensor) else t
    return int(local.numel() * local.element_size())


def local_state_bytes(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> dict[str, int]:
    """Bytes this rank holds of parameters, gradients and optimizer state (local shards only
    for ``DTensor`` s; a tied parameter counted once)."""
    nbytes = local_nbytes
    params = list({id(p): p for p in model.parameters()}.values())
    out = {
        "params": sum(nbytes(p) for p in params),
        "grads": sum(nbytes(p.grad) for p in params if p.grad is not None),
        "optimizer": 0,
    }
    if optimizer is not None:
        for state in optimizer.state.values():
            out["optimizer"] += sum(nbytes(v) for v in state.values() if torch.is_tensor(v))
    return out
