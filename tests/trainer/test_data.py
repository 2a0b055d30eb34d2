"""The samples of optimizer step t do not depend on world size or accumulation."""

from __future__ import annotations

import pytest

from orchestrator.trainer.data import Layout, MicroBatchSampler


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
