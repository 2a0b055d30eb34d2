"""What the loop counts and what rank 0 tells people: step statistics, log lines, progress events, summary.json.

`Progress` keeps the loop's counters; each optimizer step becomes one `StepStats`, which both the `Reporter`
(log lines and `orch run`'s progress events, rank 0 only) and the metrics exporter (every rank) take. Every
other rank gets a Reporter that says nothing, so the loop never asks who it is before logging.
torch is imported inside `Progress`. How a number reads (`format_duration`, `format_value`) is written in
orchestrator/outputs.py: `orch run`'s progress bar shows the same.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import goodput
from orchestrator.outputs import format_duration, format_value

if TYPE_CHECKING:
    import torch

    from orchestrator.trainer.config import TrainSpec
    from orchestrator.trainer.data import Layout
    from orchestrator.trainer.dist import Dist
    from orchestrator.trainer.step import StepResult


@dataclass(frozen=True)
class Workload:
    """What one optimizer step processes on one rank; the same every step of a run."""

    samples: int
    tokens: int = 0
    flops: float | None = None
    """Model FLOPs (forward + backward), when the task knows its FLOPs per sample; else no MFU."""


@dataclass(frozen=True)
class StepStats:
    """One optimizer step, in host numbers only: building or reading it never waits for the device."""

    step: int
    max_steps: int
    lr: float
    grad_norm: float
    seconds: float
    data_wait_seconds: float
    skipped: bool
    """This step did not update the weights (fp16 overflow, or a non-finite gradient with nonfinite_loss: skip)."""
    skipped_total: int
    work: Workload
    # Log steps only: reading them is a host sync (and for the loss a collective), so other steps leave them None.
    loss: float | None = None
    """Mean training loss over the steps since the last log line, over all ranks."""
    loss_scale: float | None = None
    """fp16: the GradScaler's scale; None otherwise."""
    samples_per_second: float | None = None
    """Global samples per second over the steps since the last log line."""
    eta_seconds: float | None = None
    ready_seconds: float = 0.0
    """Host time until this rank reached the step's gradient reduction (see step.StepResult)."""


class Progress:
    """The loop's counters: the step, totals for summary.json and checkpoints, and the log window.

    The window's loss stays on the device and is summed there; `log` reads it (one all-reduce of two
    numbers, a host sync), so call it on log steps only. Every rank calls `log` on the same steps.
    """

    def __init__(
        self,
        *,
        step: int,
        max_steps: int,
        batch_size: int,
        work: Workload,
        device: torch.device,
        counters: dict[str, Any] | None = None,
    ) -> None:
        import torch

        self.step, self.first_step, self.max_steps = step, step, max_steps
        self.batch_size, self.work = batch_size, work
        self.skipped_steps: int = (counters or {}).get("skipped_steps", 0)
        self.last_loss: float | None = (counters or {}).get("last_loss")
        self.train_seconds = 0.0
        self._loss = torch.zeros((), device=device)
        self._updates = self._steps = 0
        self._seconds = 0.0

    def record(self, result: StepResult, *, lr: float, seconds: float) -> StepStats:
        """Count one optimizer step that took `seconds`."""
        self.step += 1
        if result.updated:
            self._loss += result.loss
            self._updates += 1
        else:
            self.skipped_steps += 1
        self.train_seconds += seconds
        self._steps, self._seconds = self._steps + 1, self._seconds + seconds
        return StepStats(
            step=self.step,
            max_steps=self.max_steps,
            lr=lr,
            grad_norm=result.grad_norm,
            seconds=seconds,
            data_wait_seconds=result.data_wait_seconds,
            ready_seconds=result.ready_seconds,
            skipped=not result.updated,
            skipped_total=self.skipped_steps,
            work=self.work,
        )

    def log(self, stats: StepStats, *, loss_scale: float | None) -> StepStats:
        """`stats` with the window's mean loss over ranks and its rate; starts a new window. A collective."""
        import torch
        import torch.distributed as dist

        totals = torch.stack(
            [self._loss.float(), torch.tensor(float(self._updates), device=self._loss.device)]
        )
        dist.all_reduce(totals)  # SUM: gloo has no AVG
        loss_sum, updates = totals.tolist()
        self.last_loss = loss_sum / updates if updates else math.nan
        rate = self._steps / self._seconds if self._seconds > 0 else 0.0  # optimizer steps per second
        self._loss.zero_()
        self._updates = self._steps = 0
        self._seconds = 0.0
        return dataclasses.replace(
            stats,
            loss=self.last_loss,
            loss_scale=loss_scale,
            samples_per_second=rate * self.batch_size,
            eta_seconds=(self.max_steps - self.step) / rate if rate else 0.0,
        )

    def counters(self) -> dict[str, Any]:
        """What a checkpoint keeps so that a resumed run reports like an uninterrupted one."""
        return {"skipped_steps": self.skipped_steps, "last_loss": self.last_loss}


def summary(
    *,
    job: str,
    train: TrainSpec,
    world: Dist,
    layout: Layout,
    progress: Progress,
    tokens_per_sample: int | None,
    results: dict[str, float],
    loss_scale: float | None,
    resumed_from: int | None,
    wall_seconds: float,
) -> dict[str, Any]:
    """summary.json: what the run did, where (`world`) and how its batch was split (`layout`)."""
    seconds = progress.train_seconds
    samples_done = (progress.step - progress.first_step) * train.batch_size
    return {
        "job": job,
        "task": train.task,
        "steps": progress.step,
        "samples": progress.step * train.batch_size,
        "final_loss": progress.last_loss,
        "eval": results,
        "samples_per_second": samples_done / seconds if seconds else None,
        "tokens_per_second": samples_done * tokens_per_sample / seconds
        if tokens_per_sample and seconds
        else None,
        "wall_seconds": wall_seconds,
        "train_seconds": seconds,
        "world_size": world.world_size,
        "nodes": world.num_nodes,
        "batch_size": train.batch_size,
        "micro_batch_size": layout.micro_batch_size,
        "accumulation": layout.accumulation,
        "precision": train.precision,
        "device": world.device.type,
        "skipped_steps": progress.skipped_steps,
        "loss_scale": loss_scale,
        "resumed_from_step": resumed_from,
        "restarts": world.restart_count,
    }


class Reporter:
    def __init__(self, *, enabled: bool, lines: bool, events_file: str | None) -> None:
        self.enabled, self.lines = enabled, lines
        self.events = open(events_file, "a", buffering=1) if enabled and events_file else None  # noqa: SIM115

    def event(self, kind: str, **fields: Any) -> None:
        if self.events:
            self.events.write(json.dumps({"event": kind, **fields}) + "\n")

    def say(self, message: str) -> None:
        if self.enabled and self.lines:
            print(message, flush=True)

    def step(self, stats: StepStats, extra: dict[str, Any] | None = None) -> None:
        """A log step: `stats` comes from `Progress.log`, so loss and rates are set. `extra`: the task's
        own numbers (Task.on_log), shown after orch's."""
        loss, rate, eta = stats.loss or 0.0, stats.samples_per_second or 0.0, stats.eta_seconds or 0.0
        extra = extra or {}
        self.event("step", step=stats.step, max_steps=stats.max_steps, loss=stats.loss, lr=stats.lr,
                   grad_norm=stats.grad_norm, samples_per_second=rate, eta_seconds=eta,
                   skipped=stats.skipped_total, extra=extra)  # fmt: skip
        self.say(
            f"step {stats.step}/{stats.max_steps}  loss {loss:.4f}  lr {stats.lr:.3g}  "
            f"grad_norm {stats.grad_norm:.3g}  {rate:,.0f} samples/s  eta {format_duration(eta)}"
            + (f"  skipped {stats.skipped_total}" if stats.skipped_total else "")
            + "".join(f"  {name} {format_value(value)}" for name, value in extra.items())
        )

    def evaluation(self, *, step: int, results: dict[str, Any]) -> None:
        self.event("eval", step=step, **results)
        self.say(f"eval at step {step}: " + "  ".join(f"{k} {format_value(v)}" for k, v in results.items()))

    def done(self, summary: dict[str, Any], *, summary_file: Path) -> None:
        self.event("done", **summary)
        results = summary["eval"]
        accuracy = results.get("accuracy")
        self.say(
            f"done: {summary['steps']} steps, final loss {_fmt(summary['final_loss'])}"
            + (f", eval accuracy {accuracy:.4f}" if accuracy is not None else "")
            + (f", eval loss {results['loss']:.4f}" if "loss" in results else "")
            + f" -> {summary_file}"
        )
        if summary.get("goodput"):
            self.say(goodput.line(summary["goodput"]))

    def close(self) -> None:
        if self.events:
            self.events.close()
            self.events = None


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
