"""`digits`: scikit-learn's bundled 8x8 handwritten digits (1,797 images, no download) and a small CNN."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from orchestrator.trainer.tasks import Task, accuracy


class DigitsCNN(nn.Module):
    def __init__(self, channels: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * channels * 4 * 4, hidden), nn.ReLU(), nn.Linear(hidden, 10)
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images))


def _train_flops(channels: int, hidden: int) -> float:
    """Multiply-adds of one forward pass x 2 FLOPs x 3 (forward + backward)."""
    macs = 64 * channels * 9 + 64 * 2 * channels * channels * 9 + 2 * channels * 16 * hidden + hidden * 10
    return 6.0 * macs


def make(test_fraction: float = 0.2, channels: int = 16, hidden: int = 64, split_seed: int = 0) -> Task:
    from sklearn.datasets import load_digits  # imported here: only this task needs scikit-learn

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # pixel values are 0..16
    labels = torch.tensor(digits.target, dtype=torch.long)
    # A fixed split, independent of the training seed, so every run is scored on the same test images.
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(split_seed))
    n_test = int(len(labels) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return Task(
        model=DigitsCNN(channels, hidden),
        train_dataset=TensorDataset(images[train], labels[train]),
        eval_dataset=TensorDataset(images[test], labels[test]),
        loss_fn=nn.functional.cross_entropy,
        eval_metrics=accuracy,
        flops_per_sample=_train_flops(channels, hidden),
    )
