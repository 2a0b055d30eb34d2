"""One optimizer step: `accumulation` micro-steps, one gradient all-reduce, clip, update.

Kept apart from the loop so tests can drive it directly (count all-reduces, inject an fp16 overflow).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from orchestrator.trainer import parallel
from orchestrator.trainer.timeline import Timeline


@dataclass
class StepResult:
    loss: torch.Tensor
    """This rank's mean loss over its micro-batches, still on the device (reading it would sync)."""
    grad_norm: float
    """Norm of the all-reduced gradient before clipping: identical on every rank."""
    updated: bool
    """False when the step was skipped: an fp16 overflow, or a non-finite gradient in fp32/bf16."""
    data_wait_seconds: float
    ready_seconds: float = 0.0
    """Host time from the step's start until this rank reached its gradient reduction (the last micro-step's
    backward): the ranks wait for each other there, so this, not the step time, tells a straggler apart.
    Host time: on a GPU it sees slow input, slow host code and contention, not a slow device."""


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    batches: Iterator[Any],
    *,
    accumulation: int,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
    autocast: Callable[[], AbstractContextManager],
    grad_clip: float | None,
    device: torch.device,
    timeline: Timeline,
) -> StepResult:
    loss_sum = torch.zeros((), device=device)
    data_wait = ready = 0.0
    step_started = time.perf_counter()
    for micro_step in range(accumulation):
        started = time.perf_counter()
        with timeline.phase("data"):
            inputs, targets = next(batches)
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
        data_wait += time.perf_counter() - started
        # Gradients are reduced only on the last micro-step (DDP: all-reduce; FSDP: reduce-scatter). The
        # forward pass must be inside no_sync() too, or DDP still synchronises (DDP.no_sync docs).
        sync = micro_step == accumulation - 1
        with nullcontext() if sync else parallel.no_sync(model):
            with timeline.phase("forward"), autocast():
                # Divided by the accumulation so the summed gradient is the mean over the global batch
                # (DDP already averages over ranks).
                loss = loss_fn(model(inputs), targets) / accumulation
            if sync:
                ready = time.perf_counter() - step_started
            with timeline.phase("backward"):  # fp16: the scale stays constant over the micro-steps
                scaler.scale(loss).backward()
        loss_sum += loss.detach()

    with timeline.phase("optimizer"):
        updated, grad_norm = update(model, optimizer, scaler, grad_clip=grad_clip)
    return StepResult(
        loss=loss_sum, grad_norm=grad_norm, updated=updated, data_wait_seconds=data_wait, ready_seconds=ready
    )


def update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    *,
    grad_clip: float | None,
) -> tuple[bool, float]:
    """Once per optimizer step: unscale (fp16), measure and clip the gradient norm, update the weights
    unless the norm is not finite. Returns (updated, grad_norm)."""
    scaler.unscale_(optimizer)
    parameters = [p for p in model.parameters() if p.grad is not None]
    norm = clip_grad_norm(parameters, grad_clip) if grad_clip else total_norm(parameters)
    norm = parallel.full_norm(norm)  # FSDP: the shards' partial norms combined (same on every rank)
    # The one host sync of the step: whether the update may happen. The norm is of the all-reduced
    # gradient, so every rank takes the same decision. It is not finite exactly when a gradient is not,
    # which under fp16 is what unscale_ just recorded as an overflow.
    grad_norm = norm.item()
    updated = math.isfinite(grad_norm)
    if updated:
        # The gradients are unscaled already. Not scaler.step(): its own overflow check reads the
        # device (a second sync) before it calls this same optimizer.step().
        optimizer.step()
    scaler.update()  # fp16: halves the scale after an overflow, grows it after enough good steps; no sync
    optimizer.zero_grad(set_to_none=True)
    return updated, grad_norm


def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip in place to `max_norm`; the norm before clipping (a device tensor: reading it syncs)."""
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm)


def total_norm(parameters: list[torch.nn.Parameter]) -> torch.Tensor:
    """The 2-norm of all gradients, without clipping (a device tensor).

    torch.nn.utils.get_total_norm exists from torch 2.6; older releases get the same number from norms of norms.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)
    if get_total_norm is not None:
        return get_total_norm(grads)
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach()) for g in grads]))
