"""The samples of optimizer step t do not depend on world size or accumulation."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch

from orchestrator.trainer.data import (
    ORDER_FEISTEL,
    ORDER_RANDPERM,
    Layout,
    MicroBatchSampler,
    Permutation,
    epoch_key,
)


def step_samples(layout: Layout, step: int) -> list[int]:
    """Every sample any rank reads at any micro-step of `step`, in (micro-step, rank) order."""
    return [
        index
        for micro_step in range(layout.accumulation)
        for rank in range(layout.world_size)
        for index in layout.micro_batch(step, micro_step, rank)
    ]


@pytest.mark.parametrize(("world_size", "micro"), [(1, 16), (1, 4), (2, 4), (4, 4), (4, 1), (8, 2)])
def test_global_batch_is_the_same_for_every_split(world_size, micro):
    reference = Layout(dataset_size=100, batch_size=16, micro_batch_size=16, world_size=1, seed=3)
    layout = Layout(dataset_size=100, batch_size=16, micro_batch_size=micro, world_size=world_size, seed=3)
    for step in range(20):  # 6 steps per epoch: crosses three epoch boundaries
        samples = step_samples(layout, step)
        assert len(samples) == len(set(samples)) == 16
        assert samples == reference.global_batch(step).tolist()


def test_an_epoch_sees_each_sample_once_and_drops_the_partial_tail():
    layout = Layout(dataset_size=100, batch_size=16, micro_batch_size=4, world_size=2, seed=0)
    assert layout.steps_per_epoch == 6 and layout.accumulation == 2
    epoch0 = [i for step in range(6) for i in step_samples(layout, step)]
    epoch1 = [i for step in range(6, 12) for i in step_samples(layout, step)]
    assert len(set(epoch0)) == 96 and len(set(epoch1)) == 96  # 4 samples dropped per epoch
    assert epoch0 != epoch1  # reshuffled each epoch
    assert set(range(100)) - set(epoch0) != set(range(100)) - set(epoch1)  # a different tail is dropped


def test_seed_changes_the_order():
    a = Layout(dataset_size=64, batch_size=8, micro_batch_size=8, world_size=1, seed=0)
    b = Layout(dataset_size=64, batch_size=8, micro_batch_size=8, world_size=1, seed=1)
    assert a.global_batch(0).tolist() != b.global_batch(0).tolist()


def test_sampler_resumes_at_a_step_without_replaying():
    layout = Layout(dataset_size=64, batch_size=8, micro_batch_size=2, world_size=2, seed=0)
    full = list(MicroBatchSampler(layout, rank=1, start_step=0, end_step=10))
    resumed = list(MicroBatchSampler(layout, rank=1, start_step=4, end_step=10))
    assert len(full) == 20 and resumed == full[8:]


def test_layout_refuses_splits_that_do_not_divide_and_tiny_datasets():
    with pytest.raises(ValueError, match="not divisible"):
        Layout(dataset_size=100, batch_size=16, micro_batch_size=3, world_size=2, seed=0)
    with pytest.raises(ValueError, match="fewer than one batch"):
        Layout(dataset_size=10, batch_size=16, micro_batch_size=4, world_size=2, seed=0)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 17, 64, 100, 1000, 4097, 65_537])
def test_the_permutation_is_a_bijection_for_every_size(size):
    order = Permutation(size, epoch_key(seed=5, epoch=2)).at(np.arange(size, dtype=np.uint64))
    assert sorted(order.tolist()) == list(range(size))
    if size >= 100:  # shuffled, not the identity or a rotation
        assert sum(order[i] == i for i in range(size)) < size // 10


def test_the_epoch_order_is_computed_per_index_in_bounded_memory():
    """10^13 samples: torch.randperm would need 80 TB; a step of the Feistel order needs its batch only."""
    layout = Layout(dataset_size=10**13, batch_size=512, micro_batch_size=64, world_size=4, seed=1)
    tracemalloc.start()
    batch = layout.global_batch(step=123_456_789)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2**20
    assert len(set(batch.tolist())) == 512 and all(0 <= i < 10**13 for i in batch.tolist())
    assert step_samples(layout, 123_456_789) == batch.tolist()


def test_runs_started_before_the_feistel_order_keep_their_randperm_order():
    """A checkpoint without `data_order` resumes with the order it started with: torch.randperm's."""
    legacy = Layout(
        dataset_size=100, batch_size=16, micro_batch_size=4, world_size=2, seed=3, order=ORDER_RANDPERM
    )
    expected = torch.randperm(100, generator=torch.Generator().manual_seed(3 * 1_000_003 + 1))
    assert legacy.global_batch(7).tolist() == expected[16:32].tolist()  # step 7 = epoch 1, batch 1
    assert (
        Layout(dataset_size=100, batch_size=16, micro_batch_size=4, world_size=2, seed=3).order
        == ORDER_FEISTEL
    )
