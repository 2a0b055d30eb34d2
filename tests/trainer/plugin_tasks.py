"""Task plug-ins for tests, loaded by the trainer through `train.task: tests.trainer.plugin_tasks:NAME`."""

from __future__ import annotations

import os

import torch
from torch import nn

from orchestrator.trainer.tasks import Task, synthetic


class PoisonAt(nn.Module):
    """Multiplies its inputs by `factor` during optimizer step `step` (training forwards only)."""

    def __init__(self, inner: nn.Module, step: int, accumulation: int, factor: float) -> None:
        super().__init__()
        self.inner, self.step, self.accumulation, self.factor = inner, step, accumulation, factor
        self.forwards = 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.training:
            if self.forwards // self.accumulation == self.step:
                inputs = inputs * self.factor
            self.forwards += 1
        return self.inner(inputs)


def poisoned(step: int, accumulation: int, factor: float, kind: str = "regression") -> Task:
    """A synthetic task with one bad optimizer step: x 1e6 overflows fp16, x 1e39 overflows fp32."""
    task = synthetic.make(kind=kind, samples=256, eval_samples=64)
    task.model = PoisonAt(task.model, step, accumulation, factor)
    return task


def fails_on_rank(rank: int) -> Task:
    if int(os.environ["RANK"]) == rank:
        raise ValueError(f"deliberate failure on rank {rank}")
    return synthetic.make(samples=256)


def not_a_task() -> dict:
    return {"model": None}
