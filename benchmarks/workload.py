"""The one workload every loop trains, with a clock and a collective counter that all loops share.

`timed` is an orch task factory (`train.task: benchmarks.workload:timed`): it builds a built-in task
(`synthetic` on CPU, `gpt` on GPU) and wraps its loss function with a `StepClock`. The bare DDP loop, the
Accelerate loop and orch's trainer all call `task.loss_fn` exactly once per training micro-step, so the
clock measures every loop the same way, from outside it: the time between the first micro-steps of two
consecutive optimizer steps is one optimizer step, whatever that loop does in between (data, forward,
backward, all-reduce, clipping, optimizer, logging, metrics).

When `ORCH_BENCH_COUNT_COMM=1`, importing this module also wraps DDP so that every gradient all-reduce
goes through a counting communication hook (the default all-reduce, counted), and wraps
`torch.distributed.all_reduce` to count other all-reduces (for example a loss averaged for a log line).
Each rank writes what it saw to `$ORCH_BENCH_DIR/rank<RANK>.json` when its last optimizer step starts
(`ORCH_BENCH_STEPS`), or at exit: orch's trainer leaves with os._exit, which skips atexit handlers.

Turns (`ORCH_BENCH_GATE_DIR`): on a shared machine the load changes from one second to the next, so
loops measured one after the other see different machines. Instead, the loops being compared start
together and take turns: a loop runs `ORCH_BENCH_TURN_STEPS` optimizer steps, hands the turn to the next
loop and waits (in its first micro-step's loss call, so at the same point in every loop) until the turn
comes back. Only one loop computes at a time, and all of them sample the same minutes of load. A step's
time is measured from just after a wait to just before the next one, so no wait is ever counted; the
first step after each wait (cold caches, the previous loop's last rank finishing) is left out.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import turns
from orchestrator.trainer.tasks import Task, build_task

_STATE: dict[str, Any] = {
    "loss_calls": [],  # wall-clock seconds (time.time) of each training micro-step's loss call
    "step_pre": [],  # each optimizer step's first loss call, before its turn gate
    "step_post": [],  # ... and after it (the same when not taking turns)
    "cpu_pre": [],  # the same two points in CPU seconds of this process (all its threads)
    "cpu_post": [],
    "cuda_events": [],  # on GPU: one CUDA event per training micro-step, read once at exit (no syncs)
    "grad_allreduce_calls": 0,
    "grad_allreduce_bytes": 0,
    "grad_syncs": 0,  # backward passes that reduced gradients (bucket 0 seen)
    "other_allreduce_calls": 0,
}


class StepClock:
    """Wraps a loss function; records when each training (grad-enabled) micro-step reaches its loss.

    With the accumulation known (`ORCH_BENCH_ACCUMULATION`), also records each optimizer step's start
    before and after its turn gate (`step_pre`, `step_post`; equal when the loop is not taking turns).
    """

    def __init__(self, loss_fn: Any, use_cuda_events: bool) -> None:
        self.loss_fn, self.use_cuda_events = loss_fn, use_cuda_events
        self.accumulation = int(os.environ.get("ORCH_BENCH_ACCUMULATION", "1"))
        self.gate = Gate.from_env()
        # The report is written when the last step starts: the trainer may end with os._exit (no atexit).
        self.total_steps = int(os.environ.get("ORCH_BENCH_STEPS", "0"))
        # A hold: at the start of optimizer step ORCH_BENCH_HOLD_STEP, wait (untimed, like a turn) until the file
        # ORCH_BENCH_HOLD_UNTIL exists; make gpu-check releases it once it has scraped the running exporter.
        self.hold_step = int(os.environ.get("ORCH_BENCH_HOLD_STEP", "-1"))
        self.hold_until = os.environ.get("ORCH_BENCH_HOLD_UNTIL")

    def __call__(self, outputs: Any, targets: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():  # evaluation runs under no_grad: not a training step
            now = time.time()
            calls = _STATE["loss_calls"]
            if len(calls) % self.accumulation == 0:  # the first micro-step of an optimizer step
                step = len(calls) // self.accumulation
                _STATE["step_pre"].append(now)
                _STATE["cpu_pre"].append(time.process_time())
                if self.gate:
                    self.gate.wait_turn(step)
                if step == self.hold_step and self.hold_until:
                    _hold(Path(self.hold_until))
                _STATE["step_post"].append(time.time())
                _STATE["cpu_post"].append(time.process_time())
                if step == self.total_steps - 1:  # the last step: its start ends the last measured period
                    _STATE["steps_completed"] = step
                    _write_report()
            calls.append(now)
            if self.use_cuda_events:
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                _STATE["cuda_events"].append(event)
        return self.loss_fn(outputs, targets)


class Gate:
    """A loop's side of the turn file (benchmarks/turns.py). Gate number g (at optimizer step
    g * turn_steps) opens when the turn is this loop's and it has been given the turn g + 1 times.
    Rank 0 hands the turn on first (from gate 1 on); the harness does it when the loop exits."""

    POLL_SECONDS = 0.02  # fast enough for turns of ~0.1-1 s, rare enough to cost nothing

    def __init__(self, directory: Path, name: str, turn_steps: int, rank: int) -> None:
        self.path, self.name, self.turn_steps, self.rank = directory / "turn.json", name, turn_steps, rank

    @classmethod
    def from_env(cls) -> Gate | None:
        directory = os.environ.get("ORCH_BENCH_GATE_DIR")
        if not directory:
            return None
        return cls(Path(directory), os.environ["ORCH_BENCH_LOOP"], int(os.environ["ORCH_BENCH_TURN_STEPS"]),
                   int(os.environ.get("RANK", "0")))  # fmt: skip

    def wait_turn(self, step: int) -> None:
        if step % self.turn_steps:
            return
        number = step // self.turn_steps
        if number > 0 and self.rank == 0:
            turns.hand_on(self.path, turns.read(self.path), self.name)
        deadline = time.monotonic() + 600
        while True:
            state = turns.read(self.path)
            if state["turn"] == self.name and state["visits"][self.name] >= number + 1:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"benchmark turn never came back to {self.name}: {state}")
            time.sleep(self.POLL_SECONDS)


def _hold(release: Path, limit: float = 300) -> None:
    """Wait for `release`; after `limit` seconds go on anyway (a broken exporter is the row's to report, not a
    reason to hang the run)."""
    deadline = time.monotonic() + limit
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def timed(inner: str = "synthetic", **inner_args: Any) -> Task:
    """Build the built-in task `inner` with `inner_args` and put a StepClock on its loss."""
    if os.environ.get("ORCH_BENCH_PIN") == "1" and hasattr(os, "sched_setaffinity"):
        # rank r on core r, in every loop alike: which core a rank lands on is not left to chance
        os.sched_setaffinity(0, {int(os.environ.get("LOCAL_RANK", "0")) % (os.cpu_count() or 1)})
    task = build_task(inner, inner_args)
    task.loss_fn = StepClock(task.loss_fn, use_cuda_events=torch.cuda.is_available())
    _STATE["flops_per_sample"], _STATE["tokens_per_sample"] = task.flops_per_sample, task.tokens_per_sample
    _STATE["parameters"] = sum(p.numel() for p in task.model.parameters())
    _STATE["device_name"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return task


def _write_report() -> None:
    out = os.environ.get("ORCH_BENCH_DIR")
    if not out or _STATE.get("written"):
        return
    _STATE["written"] = True
    report = {key: value for key, value in _STATE.items() if key != "cuda_events"}
    events = _STATE["cuda_events"]
    if torch.cuda.is_available():
        report["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    if events:
        torch.cuda.synchronize()
        # seconds since the first event, one per micro-step: the GPU's own timeline
        report["cuda_seconds"] = [events[0].elapsed_time(event) / 1000.0 for event in events]
    path = Path(out) / f"rank{os.environ.get('RANK', '0')}.json"
    path.write_text(json.dumps(report))


def _count_collectives() -> None:
    """Count gradient all-reduces through a DDP comm hook, and every other dist.all_reduce call."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    original_all_reduce = dist.all_reduce

    # No annotations: DDP checks them by identity, and this module's are strings (__future__).
    def counting_allreduce(process_group, bucket):  # noqa: ANN001, ANN202
        """What DDP's default hook does (average over ranks), counted, calling the unwrapped all_reduce."""
        buffer = bucket.buffer()
        _STATE["grad_allreduce_calls"] += 1
        _STATE["grad_allreduce_bytes"] += buffer.numel() * buffer.element_size()
        _STATE["grad_syncs"] += bucket.index() == 0
        group = process_group if process_group is not None else dist.group.WORLD
        buffer.div_(group.size())
        work = original_all_reduce(buffer, group=group, async_op=True)
        return work.get_future().then(lambda future: future.value()[0])

    original_init = DistributedDataParallel.__init__

    def init_with_hook(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.register_comm_hook(None, counting_allreduce)

    DistributedDataParallel.__init__ = init_with_hook  # type: ignore[method-assign]

    def counted_all_reduce(*args: Any, **kwargs: Any) -> Any:
        _STATE["other_allreduce_calls"] += 1
        return original_all_reduce(*args, **kwargs)

    dist.all_reduce = counted_all_reduce


if os.environ.get("ORCH_BENCH_COUNT_COMM") == "1":
    _count_collectives()
atexit.register(_write_report)
