"""Evaluation over the whole eval set, sharded over ranks, combined exactly (sums, not means of means)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[Any],
    *,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
    metrics_fn: Callable[[Any, torch.Tensor], dict[str, float]] | None,
    autocast: Callable[[], AbstractContextManager],
    device: torch.device,
) -> dict[str, float]:
    """Collective: every rank evaluates its shard; returns {"loss": ..., <task metrics>} on every rank."""
    was_training = model.training
    model.eval()
    totals: dict[str, float] = {"samples": 0.0}
    missing, last = _missing_forwards(model, batches, device), torch.zeros(0)
    for inputs, targets in batches:
        last = inputs
        inputs, targets = inputs.to(device), targets.to(device)
        with autocast():
            outputs = model(inputs)
            values = {"loss": loss_fn(outputs, targets).item()}
        values.update(metrics_fn(outputs, targets) if metrics_fn else {})
        count = float(len(targets))
        totals["samples"] += count
        for name, value in values.items():
            totals[name] = totals.get(name, 0.0) + value * count
    for _ in range(missing):  # FSDP: stay in step with the ranks that have one batch more
        with autocast():
            model(last.to(device))
    model.train(was_training)
    # Small host-side dicts: ranks with no samples contribute nothing and need not know the metric names.
    gathered: list[dict[str, float]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, totals)
    combined: dict[str, float] = {}
    for part in gathered:
        for name, value in part.items():
            combined[name] = combined.get(name, 0.0) + value
    samples = combined.pop("samples")
    return {name: value / samples for name, value in combined.items()} if samples else {}


def _missing_forwards(model: nn.Module, batches: Any, device: torch.device) -> int:
    """FSDP: every forward all-gathers parameters, so every rank must run as many forwards as the rank
    with the most eval batches (the sharded eval set differs by one batch at most). Agreed before the
    loop (a collective of its own): how many batches this rank repeats (and discards) at the end."""
    from orchestrator.trainer import parallel

    if not parallel.is_sharded(model):
        return 0
    mine = len(batches)
    counts = torch.tensor([mine, -mine], device=device)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    most, fewest = int(counts[0]), -int(counts[1])
    if most and not fewest:
        raise ValueError(
            f"train.parallel fsdp: the eval set is smaller than the world size {dist.get_world_size()} "
            "(a rank has no eval sample): use more eval samples"
        )
    return most - mine
