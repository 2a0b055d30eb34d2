"""`MlflowTracker`: one MLflow run per job, continued on resume; every network call on a background thread,
what a server that does not answer missed kept and sent again, an error trying again cannot fix said once
(the package's docstring has the whole contract)."""

from __future__ import annotations

import os
import queue
import re
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.redaction import redact_url
from orchestrator.trainer.tracking.sinks import DEFAULT_CLOSE_SECONDS, NullTracker, warn

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
