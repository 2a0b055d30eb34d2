"""Where this rank is: the step and the phase of the training loop, and the seconds spent in each phase.

The loop marks its phases with `with` lines (main.py: setup, checkpoint load, each step, eval, checkpoint
save; step.py: data, forward, backward, optimizer); every moment of the process, from its start, belongs to
exactly one phase (a phase entered inside another pauses it), so the seconds add up to the process's age.
Two readers: the goodput journal (journal.py: seconds per phase, snapshots at checkpoints) and the heartbeat
(heartbeat.py: which rank stopped, at which step and in which phase).

A mark costs a clock read and a few stores: no collective, no device sync, no lock. The heartbeat's thread
reads `position`, one tuple the loop replaces whole (Python swaps a reference atomically), so it never sees
a step from one mark and a phase from another. `seq` counts the marks within a step: every rank runs the same
code, so ranks at the same place have the same (step, seq), and the rank that stopped is the one behind.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from orchestrator import goodput


@dataclass(frozen=True)
class Position:
    """A rank's place in the loop, as the heartbeat publishes it."""

    step: int
    """The step being worked on (1 for the first optimizer step; the step resumed from before the loop)."""
    seq: int
    """Marks since the step began: equal on ranks at the same place, lower on a rank behind."""
    phase: str
    since: float
    """When the phase was entered (Unix time)."""


class Timeline:
    """One rank's phases. Starts in `startup`, at the process's start."""

    def __init__(self, *, started: float | None = None) -> None:
        self.started = process_started() if started is None else started
        self._wall0, self._mono0 = time.time(), time.monotonic()
        self.seconds = dict.fromkeys(goodput.PHASES, 0.0)
        """Seconds in each phase until the current one was entered (see `totals` for now)."""
        self.seconds["startup"] = max(0.0, self._wall0 - self.started)
        self._phase, self._entered, self._step, self._seq = "startup", self._mono0, 0, 0
        self._outer: list[str] = []
        self._marks = {name: _Mark(self, name) for name in goodput.PHASES}
        self._step_mark = _StepMark(self, "step")
        self.done = 0
        """The last optimizer step completed (the step resumed from, before the first)."""
        self.position: tuple[int, int, str, float] = (0, 0, "startup", self._mono0)

    def phase(self, name: str) -> _Mark:
        """`with timeline.phase("eval"):` the block's time is the phase's; the outer phase goes on after it."""
        return self._marks[name]

    def step(self, step: int) -> _Mark:
        """`with timeline.step(n):` optimizer step n is being worked on; phase `step` until a mark inside."""
        self._step, self._seq = step, 0
        return self._step_mark

    def at_step(self, step: int) -> None:
        """The step the loop starts from (a resume's), before its first step begins."""
        self._step = self.done = step
        self.position = (step, self._seq, self._phase, self._entered)

    def _switch(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[self._phase] += now - self._entered
        self._phase, self._entered, self._seq = name, now, self._seq + 1
        self.position = (self._step, self._seq, name, now)

    # --- readers (any thread) -----------------------------------------------------------------------------

    def where(self) -> Position:
        step, seq, phase, entered = self.position
        return Position(step=step, seq=seq, phase=phase, since=self.wall(entered))

    def totals(self) -> dict[str, float]:
        """Seconds in each phase from the process's start until now (the current phase's so far included)."""
        _, _, phase, entered = self.position
        seconds = dict(self.seconds)
        seconds[phase] = seconds.get(phase, 0.0) + max(0.0, time.monotonic() - entered)
        return seconds

    def wall(self, monotonic: float) -> float:
        """A time of this process's monotonic clock as Unix time."""
        return self._wall0 + (monotonic - self._mono0)


class _Mark:
    """A phase's reusable context manager (one object per phase: entering one allocates nothing)."""

    __slots__ = ("_timeline", "_name")

    def __init__(self, timeline: Timeline, name: str) -> None:
        self._timeline, self._name = timeline, name

    def __enter__(self) -> None:
        timeline = self._timeline
        timeline._outer.append(timeline._phase)
        timeline._switch(self._name)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        timeline = self._timeline
        timeline._switch(timeline._outer.pop())


class _StepMark(_Mark):
    """A step's mark: a step left without an exception is done."""

    __slots__ = ()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        super().__exit__(kind, error, trace)
        if kind is None:
            self._timeline.done = self._timeline._step


def process_started() -> float:
    """When this process started (Unix time), from Linux's /proc (the age of the process subtracted from
    now, both in the kernel's boot clock); elsewhere now. Python's start and torch's import are startup too."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime (fields from 3 here)
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() - max(0.0, age)
