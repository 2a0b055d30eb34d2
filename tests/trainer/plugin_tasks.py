"""Task plug-ins for tests, loaded by the trainer through `train.task: tests.trainer.plugin_tasks:NAME`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

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


def env_probe(names: list[str]) -> Task:
    """Records what the trainer's environment holds when the task is built (rank 0), then trains as synthetic."""
    if os.environ["RANK"] == "0":
        values = {name: os.environ.get(name) for name in names}
        Path(os.environ["ORCH_OUTPUT_DIR"], "env.json").write_text(json.dumps(values))
    return synthetic.make(samples=256)


def records_pid(**synthetic_args) -> Task:
    """The synthetic task; each rank first writes its pid to ORCH_OUTPUT_DIR/pid-RANK (for signals in tests)."""
    Path(os.environ["ORCH_OUTPUT_DIR"]).mkdir(parents=True, exist_ok=True)
    Path(os.environ["ORCH_OUTPUT_DIR"], f"pid-{os.environ['RANK']}").write_text(str(os.getpid()))
    return synthetic.make(**synthetic_args)


class HeldAfter(Dataset):
    """Serves `inner`, but while `hold` exists and `release` does not, every fetch waits. A test can then act on
    a run that is certainly past a checkpoint and certainly not finished, on any machine load: it waits for the
    checkpoint, acts, then creates `release` (the data and so the mathematics are those of `inner`).
    `after`: fetches still served once `hold` exists (the steps a rank goes on for); when the hold begins, the
    rank creates `release`'s sibling held-RANK."""

    def __init__(self, inner: Dataset, hold: Path, release: Path, after: int = 0) -> None:
        self.inner, self.hold, self.release, self.after = inner, hold, release, after
        self.marker = release.with_name(f"held-{os.environ.get('RANK', '0')}")

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int):
        if self.after and self.hold.exists():
            self.after -= 1
        elif self.hold.exists() and not self.release.exists():
            self.marker.touch()
            while not self.release.exists():
                time.sleep(0.01)
        return self.inner[index]


def held_after_checkpoint(step: int, release: str, samples_after: int = 0, **synthetic_args) -> Task:
    """The synthetic task, holding its input once the step-`step` checkpoint (ORCH_OUTPUT_DIR/checkpoints,
    renamed into place when complete) is on disk, until the file `release` exists; with `samples_after`, once
    this rank has read that many more samples (micro-batch x accumulation per optimizer step)."""
    task = synthetic.make(**synthetic_args)
    hold = Path(os.environ["ORCH_OUTPUT_DIR"], "checkpoints", f"step-{step:08d}")
    task.train_dataset = HeldAfter(task.train_dataset, hold, Path(release), after=samples_after)
    return task


def exits_early(at_step: int = 3, **synthetic_args) -> Task:
    """A task whose loss function calls sys.exit(0) at its `at_step`-th call: every rank exits 0 without a
    summary."""
    import sys

    task = synthetic.make(**synthetic_args)
    loss_fn, calls = task.loss_fn, [0]

    def exiting(*args, **kwargs):
        calls[0] += 1
        if calls[0] >= at_step:
            sys.exit(0)
        return loss_fn(*args, **kwargs)

    task.loss_fn = exiting
    return task


def eval_says(value: object, **synthetic_args) -> Task:
    """A task whose on_eval returns {"verdict": value} (a string is allowed; a list is not)."""
    task = synthetic.make(**synthetic_args)
    task.on_eval = lambda step, results: {"verdict": value}
    return task


def slow_on_rank(rank: int, delay: float) -> Task:
    """The synthetic task; rank `rank` reads each sample `delay` seconds slower (a slow disk on one node)."""
    slow = int(os.environ["RANK"]) == rank
    return synthetic.make(samples=100_000, eval_samples=0, sample_delay=delay if slow else 0.0)


def held_in(directory: str, step: int, release: str, **synthetic_args) -> Task:
    """held_after_checkpoint for a checkpoint directory of the test's choosing (an absolute
    train.checkpoint.dir): the input holds once DIRECTORY/step-STEP is on disk, until `release` exists."""
    task = synthetic.make(**synthetic_args)
    task.train_dataset = HeldAfter(task.train_dataset, Path(directory, f"step-{step:08d}"), Path(release))
    return task


def stops_at_step(rank: int, step: int, accumulation: int, **synthetic_args) -> Task:
    """The synthetic task; rank `rank` stops in the forward pass of optimizer step `step` (a sleep: its other
    threads go on), once it wrote the time to ORCH_OUTPUT_DIR/stopped-RANK."""
    task = synthetic.make(**synthetic_args)
    if int(os.environ["RANK"]) != rank:
        return task
    loss_fn, calls = task.loss_fn, [0]

    def stopping(outputs, targets):
        calls[0] += 1
        if calls[0] == (step - 1) * accumulation + 1:  # the first micro-batch of `step`
            Path(os.environ["ORCH_OUTPUT_DIR"], f"stopped-{rank}").write_text(repr(time.time()))
            time.sleep(3600)
        return loss_fn(outputs, targets)

    task.loss_fn = stopping
    return task


class HeldAtStart(Dataset):
    """Serves `inner`; every fetch waits until `release` exists, after marking ORCH_OUTPUT_DIR/waiting-RANK: a
    rank that waits here is past its set-up (its stop handlers installed) and before its first step."""

    def __init__(self, inner: Dataset, release: Path) -> None:
        self.inner, self.release = inner, release
        self.mark = Path(os.environ["ORCH_OUTPUT_DIR"], f"waiting-{os.environ['RANK']}")

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int):
        if not self.release.exists():
            self.mark.touch()
            while not self.release.exists():
                time.sleep(0.01)
        return self.inner[index]


def held_at_start(release: str, **synthetic_args) -> Task:
    """The synthetic task whose first sample waits until the file `release` exists (HeldAtStart)."""
    task = synthetic.make(**synthetic_args)
    task.train_dataset = HeldAtStart(task.train_dataset, Path(release))
    return task


def held_in_save(hold: str, release: str, **synthetic_args) -> Task:
    """The synthetic task; on rank 1, a checkpoint save (it reads the model's state_dict) waits while the file
    `hold` exists and `release` does not, after creating ORCH_OUTPUT_DIR/saving-1. Rank 0 has then made the
    checkpoint's `.tmp` folder and waits for rank 1 at the save's barrier: a save certainly in flight."""
    task = synthetic.make(**synthetic_args)
    if os.environ["RANK"] == "1":
        hold_file, release_file = Path(hold), Path(release)
        mark = Path(os.environ["ORCH_OUTPUT_DIR"], "saving-1")

        def wait_in_save(module: nn.Module, prefix: str, keep_vars: bool) -> None:
            if prefix == "" and hold_file.exists() and not release_file.exists():
                mark.touch()
                while not release_file.exists():
                    time.sleep(0.01)

        task.model.register_state_dict_pre_hook(wait_in_save)
    return task
