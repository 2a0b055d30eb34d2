"""Data parallelism: DDP (every rank holds the whole model) or FSDP2 (every rank holds 1/world of it).

`wrap()` is the one place that decides. Both modes keep the trainer's promises (the global batch, one
gradient reduction per optimizer step, AMP, clipping, resume), so the loop does not branch on the mode:

- `ddp`: `DistributedDataParallel` with `gradient_as_bucket_view=True`; `compile: true` compiles the
  DDP-wrapped model (torch's documented order: DDP's reducer hooks then overlap the compiled backward).
- `fsdp`: `fully_shard` (torch.distributed.fsdp, "FSDP2") on a 1-D device mesh over all ranks, applied to
  each unit the task names (`Task.shard_units`; default: each direct child module that has parameters),
  then to the root. Parameters, gradients and optimizer state are DTensors sharded on dim 0; a unit's
  parameters are all-gathered for its forward and backward and its gradients reduce-scattered after
  backward. `compile: true` compiles each unit in place (`nn.Module.compile`, so state-dict keys keep
  their names), as torchtitan does per transformer block.

Mixed precision under FSDP is FSDP's own `MixedPrecisionPolicy`: parameters are cast to bf16/fp16 for the
all-gather and compute, gradients are reduced in fp32 and the sharded master weights stay fp32. The
trainer's autocast stays on around the forward (it keeps losses and norms in fp32). fp16 uses
`ShardedGradScaler`, whose inf/NaN check is all-reduced over the ranks so every rank skips together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from orchestrator.trainer import precision as precision_mod

MODES = ("ddp", "fsdp")


@dataclass
class Wrapped:
    """The model as the loop calls it, and what the rest of the trainer needs to know about it."""

    model: nn.Module
    """What the loop calls: DDP (maybe compiled) or the fully_shard-ed root (the module itself)."""
    module: nn.Module
    """The task's module with its original parameter names (under FSDP: the same object as `model`)."""
    mode: str
    ddp: nn.Module | None = None
    """The DistributedDataParallel object (for no_sync and communication hooks); None under FSDP."""

    @property
    def sharded(self) -> bool:
        return self.mode == "fsdp"


def default_shard_units(module: nn.Module) -> list[nn.Module]:
    """Each direct child that has parameters (a ModuleList/Sequential container: each of its children)."""
    units: list[nn.Module] = []
    for child in module.children():
        if not any(True for _ in child.parameters()):
            continue
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            units.extend(c for c in child.children() if any(True for _ in c.parameters()))
        else:
            units.append(child)
    return units


FSDP_MIN_TORCH = (2, 6)


def wrap(
    module: nn.Module,
    *,
    mode: str,
    device: torch.device,
    world_size: int,
    precision: str = "fp32",
    compile: bool = False,
    shard_units: list[nn.Module] | None = None,
    reshard_after_forward: bool = True,
) -> Wrapped:
    """Make `module` data-parallel over the default process group. Collective: every rank calls it."""
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(
            module,
            device_ids=[device.index] if device.type == "cuda" else None,
            # gradients live in the all-reduce buckets: no copy in and out, less memory
            gradient_as_bucket_view=True,
        )
        model = cast(nn.Module, torch.compile(ddp)) if compile else ddp
        return Wrapped(model=model, module=module, mode=mode, ddp=ddp)
    if mode != "fsdp":
        raise ValueError(f"train.parallel {mode!r}: expected one of {', '.join(MODES)}")

    from orchestrator.trainer import compat

    compat.require("train.parallel: fsdp (FSDP2's fully_shard in torch.distributed.fsdp)", FSDP_MIN_TORCH)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    policy = mixed_precision_policy(precision)
    units = default_shard_units(module) if shard_units is None else list(shard_units)
    owned = {id(m) for m in module.modules()}
    for unit in units:
        if id(unit) not in owned or unit is module:
            raise ValueError(
                f"Task.shard_units: {type(unit).__name__} is not a submodule of the task's model; "
                "name modules of task.model (e.g. its transformer blocks)"
            )
        if compile:
            unit.compile()  # in place: the unit keeps its name in the state dict (no `_orig_mod.`)
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    # The root holds what no unit took (embeddings, final norm...); it is gathered first in forward and
    # never resharded after it (it is needed again at once by the backward).
    fully_shard(module, mesh=mesh, reshard_after_forward=False, mp_policy=policy)
    return Wrapped(model=module, module=module, mode=mode)


def mixed_precision_policy(precision: str) -> Any:
    """bf16/fp16: parameters cast for all-gather and compute, gradients reduced in fp32. fp32: off."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "fp32":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=precision_mod.DTYPES[precision], reduce_dtype=torch.float32)


def grad_scaler(precision: str, device: torch.device, mode: str) -> torch.amp.GradScaler:
    """fp16 under FSDP: the sharded scaler (its overflow check spans all ranks' shards); else precision's."""
    if mode == "fsdp" and precision == "fp16":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    return precision_mod.grad_scaler(precision, device)


def is_sharded(model: nn.Module) -> bool:
    """Whether `model` is fully_shard-ed (FSDP2). torch without FSDP2 has none."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(model, FSDPModule)


@contextmanager
def no_sync(model: nn.Module) -> Iterator[None]:
    """Accumulate gradients locally, without reducing them: DDP's no_sync, FSDP2's gradient sync off.

    Under FSDP the unsharded gradients are kept until the micro-step that syncs (more memory, one
    reduce-scatter per unit per optimizer step instead of one per micro-step).
    """
    if is_sharded(model):
        sharded: Any = model  # an FSDPModule
        sharded.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            sharded.set_requires_gradient_sync(True)
    else:
        with model.no_sync():  # type: ignore[operator]
            yield


def full_norm(norm: torch.Tensor) -> torch.Tensor:
    """The norm of the whole gradient as a plain tensor. Over DTensor (sharded) gradients, torch's
    clip_grad_norm_ returns a DTensor of partial sums: this all-reduces it, so every rank has the same."""
    # Duck-typed, not isinstance(DTensor): torch.distributed.tensor is public from 2.5 only (compat.py).
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


# --- memory: what this rank holds -----------------------------------------------------------------


def local_bytes(tensors: Any) -> int:
    """Bytes of the tensors as this rank holds them: the local shard of a DTensor."""
    total, seen = 0, set()
    for tensor in tensors:
        if tensor is None or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor's shard
        total += local.numel() * local.element_size()
    return total


class MemoryMeter:
    """Parameter, gradient and optimizer-state bytes held by this rank, measured from the tensors.

    Gradients exist only between the backward and `zero_grad`, and the optimizer state appears at the
    first step: both are read by hooks on the optimizer's step, the moment they are all alive.
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        publish: Callable[..., None] | None = None,
    ) -> None:
        """`publish(**report())` is called after the first optimizer step (e.g. the metrics' gauges)."""
        self.module, self.optimizer, self.device, self.publish = module, optimizer, device, publish
        self.gradient_bytes = 0
        self.optimizer_bytes = 0
        self._handles = [
            optimizer.register_step_pre_hook(self._before_step),
            optimizer.register_step_post_hook(self._after_step),
        ]

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
        self.gradient_bytes = max(self.gradient_bytes, local_bytes(grads))

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        states = [
            value
            for state in optimizer.state.values()
            for value in state.values()
            if isinstance(value, torch.Tensor) and value.dim() > 0  # not Adam's scalar step counters
        ]
        self.optimizer_bytes = max(self.optimizer_bytes, local_bytes(states))
        if self.publish is not None:
            self.publish(**self.report())
            self.publish = None  # once: the sizes do not change after the first step

    def report(self) -> dict[str, int | None]:
        peak = None
        if self.device.type == "cuda":
            peak = int(torch.cuda.max_memory_allocated(self.device))
        return {
            "parameter_bytes": local_bytes(self.module.parameters()),
            "gradient_bytes": self.gradient_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "peak_allocated_bytes": peak,
        }

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
