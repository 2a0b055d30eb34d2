"""The trackers' contract and the sinks without a network: `NullTracker` (what every rank but 0 gets, and what
tracking off is), `Trackers` (several at once), `TensorBoardTracker` (event files written from a thread)."""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.redaction import redact

DEFAULT_CLOSE_SECONDS = 120.0
CLOSE_SECONDS_ENV = "ORCH_TRACKING_CLOSE_SECONDS"  # how long the end of a run waits for MLflow


class NullTracker:
    """Tracker that does nothing: every rank but 0, and jobs without a `tracking:` section."""

    def start(self, *, saved: Mapping[str, Any] | None = None, step: int = 0) -> None:
        """Begin, or continue what a checkpoint's state() saved, at `step`."""

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        pass

    def log_artifacts(self, paths: list[Path]) -> None:
        pass

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps so that a resumed job continues the same run."""
        return {}

    def links(self) -> dict[str, str]:
        """Where to look at the run: {"mlflow": run URL, "tensorboard": log dir}."""
        return {}

    def close(self, *, failed: bool = False) -> list[str]:
        """Finish the run; returns what could not be recorded (one line each), empty when all went through."""
        return []


class TensorBoardTracker(NullTracker):
    """Scalars as TensorBoard event files under `log_dir`, written by torch's SummaryWriter on a background
    thread: a stalled volume (an NFS server that hangs) holds the writer, never the loop (rank 0 would hold
    the other ranks in their next collective). close() waits for it at most `close_seconds`."""

    def __init__(self, log_dir: Path, *, close_seconds: float = DEFAULT_CLOSE_SECONDS) -> None:
        self.log_dir = log_dir
        self.close_seconds = close_seconds
        self.writer: Any = None
        self.failed: str | None = None
        self.dropped = 0
        self._inbox: queue.Queue[tuple[int, Mapping[str, float]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._writing = 0  # values of the write in progress

    def start(self, *, saved: Mapping[str, Any] | None = None, step: int = 0) -> None:
        # Imported here, not on the thread, for the reason mlflow_tracker._import_mlflow gives.
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self._thread = threading.Thread(
            target=self._serve, args=(SummaryWriter, step), name="orch-tensorboard", daemon=True
        )
        self._thread.start()

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._inbox.put((step, dict(metrics)))

    def _serve(self, writer_class: Any, resumed_at: int) -> None:
        # purge_step: a resumed run first drops the steps after its checkpoint that the previous attempt
        # wrote (TensorBoard's reader honours it), so the curves do not fold back on themselves.
        purge = resumed_at + 1 if resumed_at else None
        self._guard(lambda: setattr(self, "writer", writer_class(str(self.log_dir), purge_step=purge)))
        while (item := self._inbox.get()) is not None:
            step, metrics = item

            def write(step: int = step, metrics: Mapping[str, float] = metrics) -> None:
                for name, value in metrics.items():
                    self.writer.add_scalar(name, value, global_step=step)
                self.writer.flush()  # an event file a reader sees whole at every log step

            self._writing = len(metrics)
            if not self._guard(write):
                self.dropped += len(metrics)
            self._writing = 0
        if self.writer is not None:
            self._guard(self.writer.close)

    def links(self) -> dict[str, str]:
        return {"tensorboard": str(self.log_dir)}

    def close(self, *, failed: bool = False) -> list[str]:
        if self._thread is not None:
            self._inbox.put(None)
            self._thread.join(timeout=self.close_seconds)
            if self._thread.is_alive():  # stalled: what is still queued is not written
                waiting = self._writing
                while not self._inbox.empty():
                    item = self._inbox.get_nowait()
                    waiting += len(item[1]) if item else 0
                return [
                    f"TensorBoard: {self.dropped + waiting} values not written to {self.log_dir} (timed out)"
                ]
        if self.failed:
            return [f"TensorBoard: {self.dropped} values not written to {self.log_dir} ({self.failed})"]
        return []

    def _guard(self, action: Any) -> bool:
        if self.failed:
            return False
        try:
            action()
            return True
        except Exception as error:  # a full disk, a read-only volume: warn once and stop writing
            self.failed = f"{type(error).__name__}: {error}"
            warn(f"TensorBoard: cannot write to {self.log_dir} ({self.failed}); training goes on without it")
            return False


class Trackers(NullTracker):
    """Fan-out to several trackers (MLflow and TensorBoard together)."""

    def __init__(self, trackers: list[NullTracker]) -> None:
        self.trackers = trackers

    def start(self, *, saved: Mapping[str, Any] | None = None, step: int = 0) -> None:
        for tracker in self.trackers:
            tracker.start(saved=saved, step=step)

    def log_params(self, params: Mapping[str, Any]) -> None:
        for tracker in self.trackers:
            tracker.log_params(params)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        for tracker in self.trackers:
            tracker.log_metrics(step, metrics)

    def log_artifacts(self, paths: list[Path]) -> None:
        for tracker in self.trackers:
            tracker.log_artifacts(paths)

    def state(self) -> dict[str, Any]:
        return {k: v for tracker in self.trackers for k, v in tracker.state().items()}

    def links(self) -> dict[str, str]:
        return {k: v for tracker in self.trackers for k, v in tracker.links().items()}

    def close(self, *, failed: bool = False) -> list[str]:
        return [line for tracker in self.trackers for line in tracker.close(failed=failed)]


def warn(message: str) -> None:
    print(f"warning: {redact(message)}", file=sys.stderr, flush=True)
