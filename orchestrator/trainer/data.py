"""Which samples each process reads: the global batch is fixed, only its split changes.

Optimizer step t (counted from 0 over the whole run) uses the samples at positions [t*B, (t+1)*B) of the
permutation of epoch e = t // steps_per_epoch, a permutation seeded by (seed, e) alone: the same on every
rank and for every world size (DistributedSampler's `set_epoch` idea, made a pure function of the step).
That batch of B = accumulation x world x micro samples is cut into micro-batches; rank r reads micro-batch
m * world + r at micro-step m. DDP averages gradients over ranks and each micro-loss is divided by the
accumulation, so the gradient is the mean over the same B samples whatever the world size.

The last partial batch of an epoch (len % B samples) is dropped: padding would repeat samples and weigh
them twice. A different tail is dropped each epoch because the permutation changes.
Resuming at step t needs nothing but t: the data position is the step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


@dataclass(frozen=True)
class Layout:
    """How one optimizer step's global batch is split over processes and micro-steps."""

    dataset_size: int
    batch_size: int
    micro_batch_size: int
    world_size: int
    seed: int

    def __post_init__(self) -> None:
        if self.batch_size % (self.micro_batch_size * self.world_size):
            raise ValueError(
                f"batch_size {self.batch_size} is not divisible by micro_batch_size {self.micro_batch_size}"
                f" x world size {self.world_size}"
            )
        if self.dataset_size < self.batch_size:
            raise ValueError(
                f"the training set has {self.dataset_size} samples, fewer than one batch "
                f"(batch_size {self.batch_size}); lower train.batch_size"
            )

    @property
    def accumulation(self) -> int:
        return self.batch_size // (self.micro_batch_size * self.world_size)

    @property
    def steps_per_epoch(self) -> int:
        return self.dataset_size // self.batch_size

    def global_batch(self, step: int) -> torch.Tensor:
        """Indices of the B samples of optimizer step `step`."""
        epoch, position = divmod(step, self.steps_per_epoch)
        start = position * self.batch_size
        return _permutation(self.dataset_size, self.seed, epoch)[start : start + self.batch_size]

    def micro_batch(self, step: int, micro_step: int, rank: int) -> list[int]:
        """Indices read by `rank` at micro-step `micro_step` of optimizer step `step`."""
        start = (micro_step * self.world_size + rank) * self.micro_batch_size
        return self.global_batch(step)[start : start + self.micro_batch_size].tolist()


@lru_cache(maxsize=2)
def _permutation(size: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


class MicroBatchSampler(Sampler[list[int]]):
    """Yields this rank's micro-batches for steps [start_step, end_step), accumulation per step."""

    def __init__(self, layout: Layout, rank: int, start_step: int, end_step: int) -> None:
        self.layout, self.rank, self.start_step, self.end_step = layout, rank, start_step, end_step

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start_step, self.end_step):
            for micro_step in range(self.layout.accumulation):
                yield self.layout.micro_batch(step, micro_step, self.rank)

    def __len__(self) -> int:
        return (self.end_step - self.start_step) * self.layout.accumulation


def train_loader(
    dataset: Dataset,
    layout: Layout,
    *,
    rank: int,
    start_step: int,
    end_step: int,
    num_workers: int,
    pin: bool,
) -> DataLoader:
    """A DataLoader over this rank's micro-batches; resuming just starts at a later step."""
    sampler = MicroBatchSampler(layout, rank, start_step, end_step)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin,
        persistent_workers=False,
    )


def eval_loader(dataset: Dataset, *, rank: int, world_size: int, batch_size: int) -> DataLoader:
    """Rank r evaluates samples r, r + world, ...: every sample exactly once over all ranks."""
    indices = list(range(rank, len(dataset), world_size))  # type: ignore[arg-type]
    return DataLoader(torch.utils.data.Subset(dataset, indices), batch_size=batch_size)
