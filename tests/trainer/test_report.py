"""The loop's counters (report.Progress): one StepStats per step, the log window, the summary."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from orchestrator.trainer import report
from orchestrator.trainer.config import TrainSpec
from orchestrator.trainer.data import Layout
from orchestrator.trainer.dist import Dist
from orchestrator.trainer.step import StepResult


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def result(loss: float, *, updated: bool = True) -> StepResult:
    return StepResult(loss=torch.tensor(loss), grad_norm=0.5, updated=updated, data_wait_seconds=0.01)


def test_the_window_averages_updated_steps_and_restarts(group):
    work = report.Workload(samples=4, tokens=64, flops=1e6)
    progress = report.Progress(step=10, max_steps=20, batch_size=8, work=work, device=torch.device("cpu"))
    first = progress.record(result(1.0), lr=0.1, seconds=0.5)
    assert first == report.StepStats(
        step=11, max_steps=20, lr=0.1, grad_norm=0.5, seconds=0.5, data_wait_seconds=0.01, skipped=False,
        skipped_total=0, work=work,
    )  # fmt: skip
    progress.record(result(float("inf"), updated=False), lr=0.1, seconds=0.5)  # not in the mean
    third = progress.record(result(3.0), lr=0.1, seconds=0.5)
    logged = progress.log(third, loss_scale=None)
    # mean of the updated steps' losses; 3 steps in 1.5 s at 8 samples each; 7 steps left at 2 steps/s
    assert (logged.loss, logged.samples_per_second, logged.eta_seconds) == (2.0, 16.0, 3.5)
    assert (logged.step, logged.skipped_total) == (13, 1)
    assert progress.counters() == {"skipped_steps": 1, "last_loss": 2.0}
    # a new window
    logged = progress.log(progress.record(result(5.0), lr=0.1, seconds=1.0), loss_scale=1024.0)
    assert (logged.loss, logged.loss_scale, logged.samples_per_second) == (5.0, 1024.0, 8.0)

    train = TrainSpec(task="synthetic", batch_size=8, max_steps=20)
    world = Dist(rank=0, world_size=2, local_rank=0, local_world_size=2, node_rank=0, num_nodes=1,
                 restart_count=1, device=torch.device("cpu"))  # fmt: skip
    layout = Layout(dataset_size=64, batch_size=8, micro_batch_size=4, world_size=2, seed=0)
    summary = report.summary(
        job="j", train=train, world=world, layout=layout, progress=progress, tokens_per_sample=16,
        results={"loss": 1.5}, loss_scale=None, resumed_from=10, wall_seconds=9.0,
    )  # fmt: skip
    assert summary["steps"] == 14 and summary["samples"] == 14 * 8
    assert summary["samples_per_second"] == 4 * 8 / 2.5  # this attempt's steps over its train time
    assert summary["tokens_per_second"] == 4 * 8 * 16 / 2.5
    where = ("world_size", "nodes", "micro_batch_size", "accumulation", "device", "restarts")
    assert [summary[key] for key in where] == [2, 1, 4, 1, "cpu", 1]
    assert (summary["final_loss"], summary["skipped_steps"], summary["resumed_from_step"]) == (5.0, 1, 10)


def test_resumed_counters_carry_on():
    progress = report.Progress(
        step=5, max_steps=9, batch_size=2, work=report.Workload(samples=1), device=torch.device("cpu"),
        counters={"skipped_steps": 3, "last_loss": 0.25},
    )  # fmt: skip
    assert progress.counters() == {"skipped_steps": 3, "last_loss": 0.25}
    assert progress.record(result(1.0, updated=False), lr=0.1, seconds=0.1).skipped_total == 4
