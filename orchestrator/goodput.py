"""Goodput: the share of a job's wall time spent in training steps that count toward its final model, and
where the rest went (badput, by cause). The accounting of Google's ml-goodput-measurement, over orch's own
journal (docs/decisions.md says why not the library itself).

The journal lives in the run's output, OUT/goodput/ (outputs.GOODPUT), or under the object store's URL when
the run keeps its results there, so a pod's death loses none of it:
- `job.json`: when the job started, as its launcher knows it (`orch run`'s start; on a cluster `orch status`
  takes the job object's creation instead);
- one record per attempt (a start of the trainer's processes: the first, an elastic or whole-job restart, a
  resume), written by that attempt's rank 0 only (orchestrator/trainer/journal.py), rewritten as it runs:
  the seconds rank 0 spent in each phase of the trainer's timeline (orchestrator/trainer/timeline.py) and a
  snapshot of them at each checkpoint. The next attempt resumes from one checkpoint; what its predecessor
  did after that snapshot was redone, so it is wasted, and the time from its last record to the next
  attempt's start was spent restarting.

The causes are ml-goodput-measurement's BadputType buckets, lower-cased, plus orch's `queued` (a cluster
job waiting for its queue's admission) and `eval` (the library's custom badput event for evaluation).
Stdlib only: `orch run`, `orch status` and the trainer read it.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# --- the trainer's phases and the cause each one's time is charged to --------------------------------------

PRODUCTIVE = "productive"
"""A phase of a training step: its time is goodput when the step counts toward the final model."""

PHASES: dict[str, str] = {
    "startup": "program_startup",  # the process's start, imports, joining the process group (rendezvous)
    "setup": "training_prep",  # task, data, model, optimizer, schedule
    "checkpoint_load": "unproductive_checkpoint_restore_time",
    "data": "data_loading_sync",  # waiting for the next micro-batch
    "forward": PRODUCTIVE,
    "backward": PRODUCTIVE,  # with DDP/FSDP: the gradient reduction too
    "optimizer": PRODUCTIVE,
    "step": PRODUCTIVE,  # the rest of a step: its counters, log line and the ranks' stop agreement
    "eval": "eval",
    "checkpoint_save": "unproductive_checkpoint_save_time",  # and the run's end: final checkpoint, model.pt
}
"""Every phase the timeline marks, in the order a step passes through them (a stall names one)."""

CAUSES: tuple[str, ...] = (
    "queued",  # a cluster job created but not yet admitted by its queue (Kueue)
    "program_startup",  # to the first step: pods scheduled, images pulled, processes started, rendezvous
    "training_prep",
    "unproductive_checkpoint_restore_time",
    "data_loading_sync",
    "eval",
    "unproductive_checkpoint_save_time",
    "wasted_progress_from_disruption",  # steps (and their evals, saves) done again after a restart
    "infrastructure_recovery_from_disruption",  # from an attempt's end to the next attempt's start
)
"""Badput causes, as `orch_badput_seconds_total{cause=}` and summary.json's `goodput.badput_seconds` name them."""

WASTED, RECOVERY, QUEUED, STARTUP = CAUSES[7], CAUSES[8], CAUSES[0], CAUSES[1]
_BEFORE_THE_LOOP = ("startup", "setup", "checkpoint_load")  # never redone work: their own cause always

JOB_RECORD = "job.json"  # in outputs.GOODPUT
ATTEMPT_PREFIX = "attempt-"  # attempt-<start, ms>-<pid>.json in outputs.GOODPUT


def attempt_name(started: float, pid: int) -> str:
    """The attempt's record: named by its start, so that a listing sorts attempts in order."""
    return f"{ATTEMPT_PREFIX}{int(started * 1000):015d}-{pid}.json"


# --- the accounting ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Goodput:
    """A job's time from its start to `as_of`, split into goodput and badput by cause."""

    started: float
    """The job's start (Unix time): job.json, the cluster object's creation, or the first attempt's start."""
    as_of: float
    """The end of what the journal knows: the last attempt's last record (or its end)."""
    goodput_seconds: float
    badput_seconds: dict[str, float] = field(default_factory=dict)
    """Every cause of CAUSES, 0.0 where none was seen."""
    attempts: int = 1
    lost_steps: int = 0
    """Optimizer steps done and then done again after a restart (not kept by a checkpoint)."""
    step: int = 0
    """The newest step the journal knows of."""

    @property
    def wall_seconds(self) -> float:
        return max(0.0, self.as_of - self.started)

    @property
    def ratio(self) -> float:
        """Goodput over wall time, 0-1."""
        return self.goodput_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """summary.json's and `orch status -o json`'s `goodput`."""
        return {
            "ratio": round(self.ratio, 6),
            "goodput_seconds": round(self.goodput_seconds, 3),
            "wall_seconds": round(self.wall_seconds, 3),
            "badput_seconds": {cause: round(seconds, 3) for cause, seconds in self.badput_seconds.items()},
            "attempts": self.attempts,
            "lost_steps": self.lost_steps,
            "started": self.started,
            "as_of": self.as_of,
        }

    def line(self) -> str:
        return line(self.to_dict())


def line(goodput: Mapping[str, Any]) -> str:
    """A goodput (`Goodput.to_dict()`, as summary.json holds it) in one line: the ratio, the largest causes
    of badput (5% of the wall time or more), the restarts and the steps they redid."""
    wall = float(goodput.get("wall_seconds") or 0.0)
    badput = goodput.get("badput_seconds") or {}
    worst = sorted(
        ((float(s), c) for c, s in badput.items() if float(s) > 0 and float(s) >= 0.05 * wall), reverse=True
    )
    causes = ", ".join(f"{CAUSE_WORDS.get(c, c)} {share(s, wall)}" for s, c in worst[:3])
    attempts = int(goodput.get("attempts") or 1)
    restarts = (
        f"; {attempts - 1} restart{'s' * (attempts != 2)}, {goodput.get('lost_steps', 0)} steps redone"
        if attempts > 1
        else ""
    )
    text = f"goodput {share(float(goodput.get('goodput_seconds') or 0.0), wall)} of {wall:.0f} s"
    return text + (f" (badput: {causes})" if causes else "") + restarts


CAUSE_WORDS = {
    "queued": "queued",
    "program_startup": "startup",
    "training_prep": "setup",
    "unproductive_checkpoint_restore_time": "checkpoint load",
    "data_loading_sync": "data",
    "eval": "eval",
    "unproductive_checkpoint_save_time": "checkpoint save",
    "wasted_progress_from_disruption": "work redone",
    "infrastructure_recovery_from_disruption": "restarting",
}
"""How a cause reads in one line (the JSON keeps CAUSES' names)."""


def share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "n/a"


@dataclass(frozen=True)
class Attempt:
    """One attempt's record, as its rank 0 last wrote it."""

    started: float
    updated: float
    phases: dict[str, float]
    """Seconds in each phase from `started` to `updated`."""
    kept: list[dict[str, Any]]
    """Snapshots {step, at, phases}: at the first step (the state resumed) and at each checkpoint."""
    step: int = 0
    resumed_from: int | None = None
    ended: float | None = None
    outcome: str = "running"

    @property
    def end(self) -> float:
        return self.ended if self.ended is not None else self.updated

    @classmethod
    def read(cls, record: Mapping[str, Any]) -> Attempt | None:
        """From a record's JSON; None when it is not one (a journal is read defensively)."""
        try:
            attempt = cls(
                started=_time(record["started"]),
                updated=_time(record["updated"]),
                phases=_seconds(record.get("phases")),
                kept=[
                    {"step": int(k["step"]), "at": _time(k["at"]), "phases": _seconds(k.get("phases"))}
                    for k in record.get("kept") or []
                ],
                step=int(record.get("step") or 0),
                resumed_from=None if record.get("resumed_from") is None else int(record["resumed_from"]),
                ended=None if record.get("ended") is None else _time(record["ended"]),
                outcome=str(record.get("outcome") or "running"),
            )
        except (KeyError, TypeError, ValueError):
            return None
        return attempt


def _time(value: Any) -> float:
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(value)
    return number


def _seconds(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): max(0.0, _time(v)) for k, v in value.items() if str(k) in PHASES}


def account(
    attempts: Iterable[Attempt],
    *,
    job_started: float | None = None,
    admitted: float | None = None,
) -> Goodput | None:
    """The job's goodput from its attempts (any order). `job_started`: the job's start (default: the first
    attempt's); `admitted`: when its queue admitted it (a cluster's Workload), the time before that is
    `queued`. None when there is no attempt."""
    ordered = sorted(attempts, key=lambda a: a.started)
    if not ordered:
        return None
    first = ordered[0]
    started = min(job_started, first.started) if job_started is not None else first.started
    badput = dict.fromkeys(CAUSES, 0.0)
    admitted = min(max(admitted, started), first.started) if admitted is not None else started
    badput[QUEUED] = admitted - started
    badput[STARTUP] += first.started - admitted  # pods, images, the launcher: before any trainer ran
    goodput = 0.0
    lost_steps = 0
    for attempt, following in zip(ordered, [*ordered[1:], None], strict=True):
        counted = dict(attempt.phases)
        # A finished attempt that another follows was extended (more steps): nothing of it is redone.
        if following is not None and attempt.outcome != "finished":
            counted = _kept_part(attempt, following.resumed_from or 0)
            lost_steps += max(0, attempt.step - (following.resumed_from or 0))
        wasted = max(0.0, sum(attempt.phases.values()) - sum(counted.values()))
        if following is not None:  # clocks of two hosts disagree: the record outlasts the next start
            wasted = max(0.0, wasted - max(0.0, attempt.end - following.started))
        badput[WASTED] += wasted
        for phase, seconds in counted.items():
            cause = PHASES[phase]
            if cause == PRODUCTIVE:
                goodput += seconds
            else:
                badput[cause] += seconds
        if following is not None:
            badput[RECOVERY] += max(0.0, following.started - attempt.end)
    last = ordered[-1]
    return Goodput(
        started=started,
        as_of=max(last.end, started),
        goodput_seconds=goodput,
        badput_seconds=badput,
        attempts=len(ordered),
        lost_steps=lost_steps,
        step=last.step,
    )


def _kept_part(attempt: Attempt, resumed_from: int) -> dict[str, float]:
    """What of `attempt` the next one kept, resuming at step `resumed_from`: the phases up to its newest
    snapshot at or before that step; the setup before its first step is never redone work."""
    snapshots = [k for k in attempt.kept if k["step"] <= resumed_from]
    kept: dict[str, float] = dict(max(snapshots, key=lambda k: k["at"])["phases"]) if snapshots else {}
    for phase in _BEFORE_THE_LOOP:
        kept[phase] = max(kept.get(phase, 0.0), attempt.phases.get(phase, 0.0))
    return kept


# --- reading a journal ---------------------------------------------------------------------------------------


def read_journal(folder: Any) -> tuple[float | None, list[Attempt]]:
    """The job's start (job.json; None without one) and the attempts of the journal in `folder` (a Path, or
    a UPath in an object store). A record that cannot be read is left out; a missing folder is no journal.
    Errors of the store itself (unreachable, denied) are the caller's to report."""
    try:
        names = sorted(p.name for p in folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return None, []
    texts = {name: _read(folder / name) for name in names}
    return read_records({name: text for name, text in texts.items() if text is not None})


def read_records(texts: Mapping[str, str]) -> tuple[float | None, list[Attempt]]:
    """`read_journal` of the journal's files given as {name: text} (an object store's, read by the caller)."""
    job_started = None
    attempts = []
    for name, text in sorted(texts.items()):
        try:
            record = json.loads(text)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if name == JOB_RECORD:
            with contextlib.suppress(TypeError, ValueError):
                job_started = _time(record.get("started"))
        elif name.startswith(ATTEMPT_PREFIX) and name.endswith(".json"):
            attempt = Attempt.read(record)
            if attempt is not None:
                attempts.append(attempt)
    return job_started, attempts


def _read(path: Any) -> str | None:
    try:
        return str(path.read_text())
    except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError):
        return None
