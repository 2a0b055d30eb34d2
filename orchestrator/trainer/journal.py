"""The goodput journal's writer: rank 0's record of this attempt (orchestrator/goodput.py says the format and
does the accounting).

Rank 0 writes its attempt's record into OUT/goodput/ and, when the run keeps its results in an object store,
under the store's URL too (a pod's OUT dies with it): at the first step, after each checkpoint (a snapshot
of the phases: what a later attempt resuming there keeps), every few seconds from the heartbeat's thread
(what a killed attempt did until its last write), and when it ends. Every other rank gets a journal that
does nothing, so the loop never asks who it is.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator import goodput, outputs
from orchestrator.trainer.timeline import Timeline

log = logging.getLogger(__name__)

KEPT_SNAPSHOTS = 16  # a resume starts from one of the last few checkpoints (train.checkpoint.keep)
REMOTE_EVERY_SECONDS = 30.0  # how often the store's copy is rewritten between checkpoints (one PUT)


class NullJournal:
    """What every rank but 0 gets."""

    def begin(self, *, resumed_from: int | None) -> None:
        pass

    def kept(self, step: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def end(self, outcome: str) -> None:
        pass

    def account(self) -> goodput.Goodput | None:
        return None


class Journal(NullJournal):
    """Rank 0's record of this attempt, in `places` (OUT/goodput/, and the store's goodput/ prefix)."""

    def __init__(self, timeline: Timeline, *, places: list[Any], job_started: float | None) -> None:
        self.timeline, self.places = timeline, places
        self.name = goodput.attempt_name(timeline.started, os.getpid())
        self.resumed_from: int | None = None
        self.snapshots: list[dict[str, Any]] = []
        self.outcome = "running"
        self.ended: float | None = None
        self._lock = threading.Lock()  # the loop and the heartbeat's thread both write
        self._remote_written = 0.0
        self._upload_lock = threading.Lock()
        self._uploading = False
        self._uploaded = 0.0
        self._failed: set[str] = set()
        self._job_started = job_started
        self._previous: list[goodput.Attempt] = []
        self._job_record: float | None = None

    def begin(self, *, resumed_from: int | None) -> None:
        """The first step is next: read the earlier attempts (the store's journal, else OUT's), write the
        job's start when this is its first attempt, and the first record (the state resumed)."""
        self.resumed_from = resumed_from
        try:
            self._job_record, found = goodput.read_journal(self.places[-1])
        except Exception as error:  # the store unreachable: goodput of this attempt alone, said once
            log.warning("goodput: cannot read the journal in %s (%s)", self.places[-1], error)
            found = []
        self._previous = [a for a in found if a.started < self.timeline.started]
        if self._job_record is None:
            self._job_record = self._job_started or self.timeline.started
            for place in self.places:
                self._write(place, goodput.JOB_RECORD, {"started": self._job_record})
        self.kept(resumed_from or 0)

    def kept(self, step: int) -> None:
        """A checkpoint of `step` was just written (or the loop starts at `step`): a resume there keeps
        everything until now."""
        with self._lock:
            self.snapshots = [
                *self.snapshots[-(KEPT_SNAPSHOTS - 1) :],
                {"step": step, "at": time.time(), "phases": self.timeline.totals()},
            ]
        self.flush(remote=True)

    def end(self, outcome: str) -> None:
        """The attempt is over: "finished" (summary written), "stopped" (a signal, checkpoint written) or
        "failed"."""
        if self.ended is None:
            self.outcome, self.ended = outcome, time.time()
            self.flush(remote=True)

    def record(self) -> dict[str, Any]:
        now = time.time() if self.ended is None else self.ended
        return {
            "started": self.timeline.started,
            "updated": now,
            "ended": self.ended,
            "outcome": self.outcome,
            "pid": os.getpid(),
            "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
            "resumed_from": self.resumed_from,
            "step": self.timeline.done,
            "phases": self.timeline.totals(),
            "kept": self.snapshots,
        }

    def flush(self, *, remote: bool = False) -> None:
        """Write the record: OUT's copy now; the store's now when `remote` (a checkpoint, the end), else at
        most every REMOTE_EVERY_SECONDS from a thread of its own, so a slow store never holds the heartbeat
        (whose thread calls this) nor the loop."""
        with self._lock:
            record = self.record()
            self._write(self.places[0], self.name, record)
        if len(self.places) == 1:
            return
        if remote:
            self._upload(record)
        elif time.monotonic() - self._remote_written >= REMOTE_EVERY_SECONDS and not self._uploading:
            self._remote_written, self._uploading = time.monotonic(), True
            threading.Thread(target=self._upload, args=(record,), name="orch-journal", daemon=True).start()

    def _upload(self, record: dict[str, Any]) -> None:
        """The store's copy; one upload at a time, and never an older record over a newer one."""
        with self._upload_lock:
            if record["updated"] >= self._uploaded:
                for place in self.places[1:]:
                    self._write(place, self.name, record)
                self._uploaded = record["updated"]
            self._uploading = False

    def account(self) -> goodput.Goodput | None:
        """The job's goodput until now: the earlier attempts' records and this one's, live."""
        current = goodput.Attempt.read(self.record())
        attempts = [*self._previous, *([current] if current else [])]
        return goodput.account(attempts, job_started=self._job_record)

    def _write(self, place: Any, name: str, record: dict[str, Any]) -> None:
        try:
            if isinstance(place, Path):
                place.mkdir(parents=True, exist_ok=True)
                outputs.write_json(place / name, record)
            else:  # an object store: one PUT replaces the object whole
                import json

                (place / name).write_text(json.dumps(record) + "\n")
        except Exception as error:  # the journal must never take training down; said once per place
            if str(place) not in self._failed:
                self._failed.add(str(place))
                log.warning("goodput: cannot write %s in %s (%s)", name, place, error)


def build(
    timeline: Timeline, *, enabled: bool, output_dir: Path, kept: Any, job_started: float | None
) -> NullJournal:
    """Rank 0's journal (`enabled`), in OUT/goodput/ and, when `kept` is an object store, there too."""
    if not enabled:
        return NullJournal()
    places = [output_dir / outputs.GOODPUT]
    if not isinstance(kept, Path):
        places.append(kept / outputs.GOODPUT)
    return Journal(timeline, places=places, job_started=job_started)
