"""`synthetic`: a tiny regression or classification problem drawn from a fixed random teacher.

Fast and dependency-free, for tests and benchmarks. `sample_delay` makes each sample slow to load, to
exercise input stalls (and to give fault tests a run that lasts long enough to be interrupted).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from orchestrator.trainer.tasks import Task, accuracy


class SlowDataset(Dataset):
    """Wraps a dataset and sleeps `delay` seconds per sample, like a slow disk or decoder."""

    def __init__(self, inner: Dataset, delay: float) -> None:
        self.inner, self.delay = inner, delay

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        time.sleep(self.delay)
        return self.inner[index]


def make(
    kind: Literal["regression", "classification"] = "regression",
    samples: int = 1024,
    eval_samples: int = 256,
    features: int = 16,
    hidden: int = 32,
    classes: int = 4,
    noise: float = 0.1,
    seed: int = 0,
    sample_delay: float = 0.0,
) -> Task:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples + eval_samples, features, generator=generator)
    outputs = 1 if kind == "regression" else classes
    teacher = torch.randn(features, outputs, generator=generator)
    scores = inputs @ teacher + noise * torch.randn(len(inputs), outputs, generator=generator)
    targets = scores if kind == "regression" else scores.argmax(dim=1)
    model = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, outputs))
    train: Dataset = TensorDataset(inputs[:samples], targets[:samples])
    if sample_delay > 0:
        train = SlowDataset(train, sample_delay)
    return Task(
        model=model,
        train_dataset=train,
        eval_dataset=TensorDataset(inputs[samples:], targets[samples:]) if eval_samples else None,
        loss_fn=nn.functional.mse_loss if kind == "regression" else nn.functional.cross_entropy,
        eval_metrics=None if kind == "regression" else accuracy,
        flops_per_sample=6.0 * (features * hidden + hidden * outputs),
    )
