"""Experiment tracking: where rank 0 records a run besides stdout and Prometheus (MLflow, TensorBoard).

Sinks in the torchtitan style: a `NullTracker` that does nothing (every rank but 0, or tracking off), one class
per backend, and `Trackers` that fans out to several. The loop calls the same four methods whatever is on:

    tracker.start(saved=..., step=...)       after the resume: continue the checkpoint's MLflow run, if any
    tracker.log_metrics(step, {"train/loss": ...})   at log steps and evaluations
    tracker.log_artifacts([summary.json, model.pt])  at the end
    tracker.close(failed=...)                in the entrypoint's `finally`

Tracking never takes training down, and never blocks a collective path. MLflow calls run on a background
thread: a server that does not answer costs the loop nothing, is one warning, and what it missed is kept and
sent again later (every `retry_seconds`, and once more at the end); what still could not be sent is said when
the run closes, which waits at most `close_seconds` ($ORCH_TRACKING_CLOSE_SECONDS). A checkpoint never waits
for the server (rank 0 would hold the other ranks in the checkpoint's collectives): it records the run's key, a
random id drawn when the training run starts and tagged on the MLflow run when it is created, and the run's id
once known; a resume from a checkpoint taken before the run existed finds it by that tag. An error that trying again cannot fix (a refused request, a store MLflow will not
open) is said once, in full, and MLflow is switched off for the run. A TensorBoard writer that fails (a full
disk) is one warning and is switched off.

mlflow and tensorboard are optional (`pip install 'orch-trainer[tracking]'`) and imported only when used.
"""

from __future__ import annotations

import json
import os
import queue
import re
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import outputs
from orchestrator.redaction import redact, redact_url
from orchestrator.runtime_env import PIP_LINE, TrackingSettings, missing_requirements

if TYPE_CHECKING:
    pass

# Tags on the MLflow run. `mlflow.source.git.commit` is MLflow's own (its UI shows it as the run's source).
TAG_JOB, TAG_NAMESPACE, TAG_API_KIND = "orch.job", "orch.namespace", "orch.api_kind"
TAG_GIT_COMMIT = "mlflow.source.git.commit"
TAG_PARENT_RUN = "mlflow.parentRunId"  # MLflow's own: its UI nests the run under that one (an `orch sweep`'s)
# The training run's key, kept in its checkpoints: how a resume finds an MLflow run its checkpoint cannot name.
TAG_RUN_KEY = "orch.run_key"
# MLflow's REST limits per log_batch request.
MAX_METRICS_PER_BATCH, MAX_PARAMS_PER_BATCH = 1000, 100
# Our own HTTP budget for one MLflow call (the client's defaults retry for minutes). Environment wins.
MLFLOW_HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",  # orch says where the run is, once, at the end
    # `file:` stores (and plain paths) work: MLflow 3 refuses them unless told (its filesystem backend is in
    # maintenance mode, not removed); a local `orch run` with `tracking_uri: file:./mlruns` is a fair use.
    "MLFLOW_ALLOW_FILE_STORE": "true",
}
DEFAULT_RETRY_SECONDS = 30.0
DEFAULT_CLOSE_SECONDS = 120.0
CLOSE_SECONDS_ENV = "ORCH_TRACKING_CLOSE_SECONDS"  # how long the end of a run waits for MLflow
# --- sinks ------------------------------------------------------------------------------------------------


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
        # Imported here, not on the thread, for the reason _import_mlflow gives.
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


@dataclass
class _Pending:
    """What the MLflow thread has yet to send, in order."""

    params: dict[str, str] = field(default_factory=dict)
    metrics: list[tuple[str, float, int, int]] = field(default_factory=list)  # key, value, ms, step
    artifacts: list[Path] = field(default_factory=list)
    status: str | None = None


class MlflowTracker(NullTracker):
    """One MLflow run per job, continued on resume. All network calls happen on a background thread."""

    def __init__(
        self,
        *,
        tracking_uri: str | None,
        experiment: str,
        run_name: str,
        tags: Mapping[str, str],
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
        close_seconds: float = DEFAULT_CLOSE_SECONDS,
    ) -> None:
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.tags = dict(tags)
        self.retry_seconds, self.close_seconds = retry_seconds, close_seconds
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self._resume_id: str | None = None
        self.run_key = ""  # drawn at start, or the checkpoint's
        self._find_by_key = False  # the checkpoint has the key but not the run id: look for the tagged run
        self._resumed = False
        self._client: Any = None
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._pending = _Pending()
        self._warned = False
        self._last_error: str | None = None
        self._next_try = 0.0
        self._thread: threading.Thread | None = None
        self._gave_up = False  # a permanent error: nothing more is sent

    # --- the loop's side: never blocks on the network -----------------------------------------------------

    def start(self, *, saved: Mapping[str, Any] | None = None, step: int = 0) -> None:
        saved = saved or {}
        self._resume_id = saved.get("mlflow_run_id")
        self.run_key = saved.get("mlflow_run_key") or uuid.uuid4().hex
        self._find_by_key = self._resume_id is None and "mlflow_run_key" in saved
        for name, value in MLFLOW_HTTP_DEFAULTS.items():
            os.environ.setdefault(name, value)
        _import_mlflow()
        self._thread = threading.Thread(target=self._serve, name="orch-mlflow", daemon=True)
        self._thread.start()

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._inbox.put(("params", {k: str(v) for k, v in params.items()}))

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        self._inbox.put(("metrics", [(k, float(v), now, step) for k, v in metrics.items()]))

    def log_artifacts(self, paths: list[Path]) -> None:
        self._inbox.put(("artifacts", list(paths)))

    def state(self) -> dict[str, Any]:
        # Never waits for the run to be created: the key finds it at resume when the id is not known yet.
        run_id = self.run_id or self._resume_id
        return {"mlflow_run_key": self.run_key, **({"mlflow_run_id": run_id} if run_id else {})}

    def links(self) -> dict[str, str]:
        if self.run_id is None:
            return {}
        return {"mlflow": run_url(self.tracking_uri or _default_uri(), self.experiment_id, self.run_id)}

    def close(self, *, failed: bool = False) -> list[str]:
        if self._thread is None:
            return []
        self._inbox.put(("close", "FAILED" if failed else "FINISHED"))
        self._thread.join(timeout=self.close_seconds)
        pending = self._pending
        unsent = len(pending.metrics) + len(pending.params) + len(pending.artifacts)
        if not unsent and self.run_id is not None and not self._thread.is_alive():
            return []
        what = ", ".join(
            f"{n} {noun}"
            for n, noun in (
                (len(pending.metrics), "metric values"),
                (len(pending.params), "params"),
                (len(pending.artifacts), "artifacts"),
            )
            if n
        )
        where = self.tracking_uri or _default_uri()
        return [
            f"MLflow: not sent to {where}: {what or 'the run itself'} ({self._last_error or 'timed out'})"
        ]

    # --- the thread's side -------------------------------------------------------------------------------

    def _serve(self) -> None:
        closing = False
        while not closing:
            # Idle: sleep until something arrives. Behind: wake up when the next attempt is due.
            wait = max(0.0, self._next_try - time.monotonic()) if self._has_pending() else None
            items = []
            try:
                items.append(self._inbox.get(timeout=wait))
                while True:  # drain whatever else is waiting: one request for many log steps
                    items.append(self._inbox.get_nowait())
            except queue.Empty:
                pass
            for kind, payload in items:
                self._take(kind, payload)
                closing = closing or kind == "close"
            if self._gave_up:
                continue
            if closing or time.monotonic() >= self._next_try:
                self._flush()

    def _has_pending(self) -> bool:
        pending = self._pending
        if self._gave_up:
            return False  # sleep until the next item (or close) arrives
        return bool(
            pending.metrics or pending.params or pending.artifacts or pending.status or not self.run_id
        )

    def _take(self, kind: str, payload: Any) -> None:
        pending = self._pending
        if kind == "params":
            pending.params.update(payload)
        elif kind == "metrics":
            pending.metrics.extend(payload)
        elif kind == "artifacts":
            pending.artifacts.extend(payload)
        elif kind == "close":
            pending.status = payload

    def _flush(self) -> None:
        try:
            self._ensure_run()
            self._send()
        except Exception as error:
            if not transient(error):  # a refused request, a store MLflow will not open: the same every time
                self._last_error = f"{type(error).__name__}: {_first_line(error, limit=None)}"
                self._next_try = float("inf")
                self._give_up()
                warn(
                    f"MLflow at {self.tracking_uri or _default_uri()} refused the run ({self._last_error}); "
                    "training goes on without MLflow"
                )
                return
            # unreachable, timed out, 5xx: keep everything, say it once, try again later
            self._last_error = f"{type(error).__name__}: {_first_line(error)}"
            self._next_try = time.monotonic() + self.retry_seconds
            if not self._warned:
                self._warned = True
                warn(
                    f"MLflow at {self.tracking_uri or _default_uri()} did not answer ({self._last_error}); "
                    f"training goes on, and what it missed is sent again every {self.retry_seconds:g} s"
                )

    def _give_up(self) -> None:
        """Stop trying: what is queued now or later stays unsent (close() says so)."""
        self._gave_up = True

    def _ensure_run(self) -> None:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        if self.run_id is not None:
            return
        client = self._client
        if self._resume_id is not None:
            from mlflow.exceptions import MlflowException

            try:
                run = client.get_run(self._resume_id)
            except MlflowException as error:
                if getattr(error, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
                    raise
                warn(
                    f"MLflow run {self._resume_id} of the checkpoint is not on this server: starting a new run"
                )
                self._resume_id = None
            else:
                self._continue(run)
                return
        experiment = client.get_experiment_by_name(self.experiment)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(self.experiment)
        if self._find_by_key and experiment is not None:
            tagged = f"tags.`{TAG_RUN_KEY}` = '{self.run_key}'"
            for run in client.search_runs([experiment_id], filter_string=tagged, max_results=1):
                self._continue(run)
                return
        run = client.create_run(
            experiment_id, run_name=self.run_name, tags={**self.tags, TAG_RUN_KEY: self.run_key}
        )
        self.experiment_id, self.run_id = experiment_id, run.info.run_id

    def _continue(self, run: Any) -> None:
        """Go on with an earlier attempt's run (found by its id or by the run key): RUNNING again."""
        self._client.update_run(run.info.run_id, status="RUNNING")
        self.experiment_id, self.run_id, self._resumed = run.info.experiment_id, run.info.run_id, True

    def _send(self) -> None:
        from mlflow.entities import Metric, Param

        client, pending, run_id = self._client, self._pending, self.run_id
        if pending.params:
            params = pending.params
            if self._resumed:  # params are immutable: a resumed run adds the ones it does not have yet
                known = client.get_run(run_id).data.params
                params = {k: v for k, v in params.items() if k not in known}
            items = [Param(k, v) for k, v in params.items()]
            for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
                client.log_batch(run_id, params=items[i : i + MAX_PARAMS_PER_BATCH])
            pending.params = {}
        while pending.metrics:
            batch = pending.metrics[:MAX_METRICS_PER_BATCH]
            client.log_batch(run_id, metrics=[Metric(k, v, ms, step) for k, v, ms, step in batch])
            del pending.metrics[: len(batch)]
        while pending.artifacts:
            client.log_artifact(run_id, str(pending.artifacts[0]))
            pending.artifacts.pop(0)
        if pending.status:
            client.set_terminated(run_id, status=pending.status)
            pending.status = None


_MLFLOW_IMPORT = threading.Lock()


def _import_mlflow() -> None:
    """Imports MLflow's client here, on the caller's thread, before the tracker's thread starts.

    mlflow's modules import each other in a cycle (through mlflow.protos.databricks_pb2): two threads importing
    it at once, from two entry points (the tracker's thread and the user's code, or two trackers), fail with
    "partially initialized module" or a _DeadlockError. Loaded whole first, the thread's imports find it done.
    It costs no wall time the thread would have saved: the import holds the GIL either way."""
    with _MLFLOW_IMPORT:
        import mlflow.entities  # noqa: F401
        import mlflow.exceptions  # noqa: F401
        import mlflow.tracking  # noqa: F401


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


def build(
    settings: TrackingSettings, *, enabled: bool, job_name: str, output_dir: Path, **mlflow_options: Any
) -> NullTracker:
    """The trackers a job asked for, on the rank that logs (`enabled`); a NullTracker anywhere else."""
    if not enabled or not settings.enabled:
        return NullTracker()
    if missing := missing_requirements(settings):
        raise RuntimeError(f"tracking needs {' and '.join(missing)}, not installed here: {PIP_LINE}")
    trackers: list[NullTracker] = []
    if settings.mlflow:
        tags = {
            TAG_JOB: job_name,
            TAG_NAMESPACE: settings.namespace,
            TAG_API_KIND: settings.api_kind,
            TAG_GIT_COMMIT: settings.git_commit,
            TAG_PARENT_RUN: settings.mlflow_parent_run_id,
        }
        trackers.append(
            MlflowTracker(
                tracking_uri=settings.mlflow_tracking_uri,
                experiment=settings.mlflow_experiment or job_name,
                run_name=settings.mlflow_run_name or job_name,
                tags={k: v for k, v in tags.items() if v},
                **{
                    "close_seconds": float(os.environ.get(CLOSE_SECONDS_ENV, DEFAULT_CLOSE_SECONDS)),
                    **mlflow_options,
                },
            )
        )
    if settings.tensorboard_dir:
        close_seconds = float(os.environ.get(CLOSE_SECONDS_ENV, DEFAULT_CLOSE_SECONDS))
        trackers.append(
            TensorBoardTracker(output_dir / settings.tensorboard_dir, close_seconds=close_seconds)
        )
    return trackers[0] if len(trackers) == 1 else Trackers(trackers)


# --- what the loop hands over ---------------------------------------------------------------------------


def job_params(train: Mapping[str, Any], world: Any, settings: TrackingSettings) -> dict[str, Any]:
    """The run's params: the train section as the trainer got it, flattened, plus where it ran."""
    gpus = world.local_world_size if world.device.type == "cuda" else 0
    where = {
        "nodes": world.world_size // world.local_world_size,
        "gpus_per_node": gpus,
        "procs_per_node": world.local_world_size,
        "world_size": world.world_size,
        "image": settings.image or "(none: orch run)",
    }
    return {**flatten(train), **where}


def step_metrics(stats: Any) -> dict[str, float]:
    """orch's numbers of a log step (a report.StepStats after Progress.log), as the reporter shows them."""
    return {
        "loss": stats.loss,
        "lr": stats.lr,
        "grad_norm": stats.grad_norm,
        "samples_per_second": stats.samples_per_second or 0.0,
    }


def hook_scalars(values: Any, hook: str) -> dict[str, Any]:
    """What a task's on_log / on_eval returned, checked where it enters: None (nothing), or a dict of
    non-empty string names to numbers or strings (strings show on the log line and in the events; everything
    downstream may rely on that). Anything else is a TypeError naming the hook and the entry."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise TypeError(
            f"Task.{hook} must return a dict of name -> number or string (or None), not {_cut(values)}"
        )
    for name, value in values.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"Task.{hook} returned the name {_cut(name)}: names are non-empty strings")
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise TypeError(f"Task.{hook} returned {name!r}: {_cut(value)}, not a number or a string")
    return dict(values)


def _cut(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:75]}...{text[-2:]}"


def numeric(values: Mapping[str, Any]) -> dict[str, float]:
    """The entries that are numbers (bools excluded): what MLflow, TensorBoard and Prometheus can take."""
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def prefixed(prefix: str, values: Mapping[str, Any]) -> dict[str, float]:
    """Metric names as the trackers show them: train/loss, eval/accuracy."""
    return {f"{prefix}/{k}": v for k, v in numeric(values).items()}


def finish(tracker: NullTracker, output_dir: Path, *, failed: bool) -> None:
    """Close the run; say what could not be recorded; leave the links in tracking.json for `orch run`."""
    for line in tracker.close(failed=failed):
        print(f"tracking: {redact(line)}", file=sys.stderr, flush=True)
    if links := tracker.links():
        try:
            outputs.write_json(output_dir / outputs.LINKS, dict(links))
        except OSError as error:
            warn(f"cannot write {output_dir / outputs.LINKS}: {error}")


# --- helpers ----------------------------------------------------------------------------------------------


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys: {"optimizer": {"lr": 0.1}} -> {"optimizer.lr": 0.1}.
    Lists stay one value (JSON); an empty mapping is kept as "{}" so every setting shows."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, (Mapping, list, tuple)):
            flat[name] = json.dumps(value)
        else:
            flat[name] = value
    return flat


def run_url(tracking_uri: str, experiment_id: str | None, run_id: str) -> str:
    """The run's page in the MLflow UI, or `run ID at URI` when the store is not a web server; without
    credentials (the link is stored in tracking.json and printed by `orch run`)."""
    tracking_uri = redact_url(tracking_uri)
    if tracking_uri.startswith(("http://", "https://")):
        return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return f"run {run_id} at {tracking_uri}"


def _default_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or "the default MLflow tracking URI"


def _first_line(error: BaseException, limit: int | None = 200) -> str:
    """The gist of an error: the OS's reason when the connection failed, else its text, shortened to `limit`
    (None: whole, on one line: a permanent error's text usually says the fix)."""
    text = str(error).strip()
    if cause := re.search(r"\[Errno -?\d+\] [^'\")\]]+", text):
        return cause.group(0)
    if not text:
        return type(error).__name__
    return " ".join(text.split()) if limit is None else text.splitlines()[0][:limit]


def transient(error: BaseException) -> bool:
    """Whether trying again later may succeed: the server could not be reached or timed out (an OSError,
    which requests' errors are, anywhere in the chain: MLflow wraps them), or it answered 5xx or 429. A 4xx
    answer (bad request, unauthorised, forbidden) or an error raised before any request (a store MLflow
    refuses to open, a missing package) is permanent."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError):
            return True
        seen = seen.__cause__ or seen.__context__
    status = getattr(error, "get_http_status_code", None)
    if type(error).__name__ == "RestException" and callable(status):
        code = status()
        return bool(code >= 500 or code == 429)
    # MLflow's own words for an answer it could not parse (no JSON body): "... failed with error code 503"
    return bool(re.search(r"failed with error code (5\d\d|429)\b", str(error)))


def warn(message: str) -> None:
    print(f"warning: {redact(message)}", file=sys.stderr, flush=True)
