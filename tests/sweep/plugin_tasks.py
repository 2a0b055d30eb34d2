"""Task plug-ins for the sweep tests, loaded by a trial's trainer through `train.task: tests.sweep.plugin_tasks:NAME`
(the trial's processes find `tests` through PYTHONPATH, which the test sets to the repository's root)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from orchestrator.trainer.tasks import Task, digits

HELD = "held"  # in a trial's run dir once its hold began
HOLD_SECONDS = 600.0  # a test that never signals gets its trial back after this


def digits_held_until_signalled(trials: list[int], step: int) -> Task:
    """The digits task; the first run of each trial numbered in `trials` (its run dir trial-N is ORCH_OUTPUT_DIR)
    stops in its log step `step` until its process gets SIGTERM or SIGINT, then goes on: the trainer's stop
    path (trainer/stop.py) ends it at the next step, with a checkpoint. So a test can signal `orch sweep` when
    those trials are certainly past a checkpoint and certainly not finished, however loaded the machine is.
    The hold writes HELD in the run dir as it begins; a resumed run (HELD there already) is not held again."""
    task = digits.make()
    out = Path(os.environ["ORCH_OUTPUT_DIR"])
    marker = out / HELD
    if int(out.name.removeprefix("trial-")) not in trials or marker.exists():
        return task
    signalled = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        stop_request = signal.getsignal(number)  # the trainer's, installed before it builds the task
        assert callable(stop_request), (
            "the trainer's stop handler (train.checkpoint.on_stop) is not installed"
        )

        def chained(signum: int, frame: FrameType | None, stop_request: Callable = stop_request) -> None:
            signalled.set()
            stop_request(signum, frame)

        signal.signal(number, chained)

    def hold(at: int, metrics: dict[str, float]) -> None:
        if at != step or marker.exists():
            return None
        marker.touch()
        deadline = time.monotonic() + HOLD_SECONDS
        while not signalled.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)  # the signal's handler runs in this thread, between two sleeps
        return None  # no metrics of its own

    task.on_log = hold
    return task
