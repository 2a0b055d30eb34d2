"""Trials as jobs on a cluster (`orch sweep --cluster`): each trial a job as `orch submit` creates it, through
orchestrator.api's Client, the only way this package reaches a cluster (api.sweep passes one in).

Trial N of sweep NAME is the job NAME-trial-N: the sweep's job with the trial's values as `--set` overrides,
its output.url moved to OUTPUT_URL/NAME-trial-N (the trial's own prefix, where it keeps its checkpoints and
what the sweep reads: sweep/store.py), ORCH_OBJECTIVE and ORCH_PRUNE_FILE (that prefix's prune.request) in
its env, and the labels orch.dev/sweep=NAME and orch.dev/trial=N on every object of it, its pods too. A job
that names a Kueue queue (scheduling.queue) waits there, suspended: the sweep counts it as running, so at most
`parallel` trials are submitted and unfinished at once, and the queue decides when each starts.

The sweep follows its trials through one list of the jobs its label selects every `poll_seconds`, and reads
each running trial's objective.json from the store as often. A job that Succeeded ended as its summary.json
and objective.json in the store say (complete, pruned, or without an objective); one that Failed is a failed
trial, with the job's condition message. A pruned trial is asked to stop through the store (the trainer
checkpoints and ends as a finished run: trainer/stop.py), and its job is deleted once it has. The jobs of
the other trials stay, as `orch submit`'s do (`orch logs`, `orch status` read them).

After a restart, a trial the study holds as running is found again by its labels: a job that still runs is
re-attached, one that ended is recorded as it ended, and one that is gone is recorded as its store says (it
ended before someone deleted it) or failed as interrupted and its values asked again. Ctrl-C and SIGTERM
leave the jobs running (they need no sweep), for `orch sweep --cluster` to re-attach. They are found in the
namespace they were created in (`-n`, else the job file's, else the context's), which the study keeps with
the cluster's API server: a sweep continued elsewhere would find none of them, so it is refused.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator import naming, outputs, runtime_env
from orchestrator.errors import SpecError, UsageError
from orchestrator.sweep.spec import TRIAL_JOB, Sweep
from orchestrator.sweep.store import TrialStore
from orchestrator.sweep.trials import Outcome, TrialPlan, Where, ended, reported_values

if TYPE_CHECKING:
    from orchestrator.job.spec import JobSpec

POLL_SECONDS = 5.0  # one list request for every trial, and one read of each running trial's objective
SUCCEEDED, FAILED = "Succeeded", "Failed"  # orch's phases (status.py)


class JobClient(Protocol):
    """What the trials ask of the cluster: orchestrator.api.Client's calls of the same names."""

    def submit(self, job: JobSpec) -> Any: ...

    def suspected_nodes(self, name: str) -> list[str]: ...  # (before `list`, which would shadow the type)

    def list(self, *, selector: str | None = None) -> list[dict[str, Any]]: ...

    def status(self, name: str) -> Any: ...

    def delete(self, name: str) -> Any: ...


# orchestrator.api.avoid_nodes: the job kept off these nodes too, and the line that says which were added
AvoidNodes = Callable[["JobSpec", Sequence[str]], tuple["JobSpec", "str | None"]]


class ClusterTrials:
    """Trials as jobs on the cluster `client` reaches (its namespace: the job file's, else the context's)."""

    where: Where = "cluster"

    def __init__(
        self,
        sweep: Sweep,
        client: JobClient,
        *,
        place: dict[str, str],
        poll_seconds: float = POLL_SECONDS,
        avoid_nodes: AvoidNodes | None = None,
        notice: Callable[[str], None] = lambda message: None,
    ) -> None:
        """`client` in the namespace the trials' jobs are created in; `place`: that namespace and the
        cluster's API server, as the study keeps them (sweep/study.py's CLUSTER). `avoid_nodes` (api.avoid_nodes): how a trial's job is kept off the nodes earlier trials'
        failures pointed at; None: they are not avoided."""
        output = sweep.job.output
        assert output is not None and output.url, "load_sweep(where='cluster') requires output.url"
        self.sweep, self.client, self.poll_seconds, self.notice = sweep, client, poll_seconds, notice
        self.place = place
        self.avoid_nodes = avoid_nodes
        self.base_url = output.url.rstrip("/")
        self.selector = f"{naming.LABEL_SWEEP}={sweep.name}"
        self._jobs: dict[str, dict[str, Any]] = {}  # the sweep's jobs by name, as last listed
        self._listed = -math.inf
        self._warned: set[str] = set()

    def prepare(self) -> None:
        """Before any trial: the store takes writes from this shell (its credentials and AWS_ENDPOINT_URL, as
        for `orch run --out s3://`), where the sweep reads the objectives and writes prune requests; else one
        line, UsageError (exit 2)."""
        from orchestrator import storage

        try:
            storage.check_writable(self.base_url)
        except storage.StorageError as error:
            raise UsageError(f"{error} (the sweep reads its trials' objectives there)") from None

    # --- what the controller asks ------------------------------------------------------------------------

    def run_name(self, number: int) -> str:
        return TRIAL_JOB.format(sweep=self.sweep.name, number=number)

    def describe(self, plan: TrialPlan) -> str:
        return f"job {plan.run} ({self.url(plan)}/)"

    def start(self, plan: TrialPlan) -> ClusterTrial:
        from orchestrator.cluster.errors import AlreadyExists

        try:
            job = self.trial_job(plan)
        except SpecError as error:  # a combination of values the job refuses (the extremes alone passed)
            return ClusterTrial(self, plan, refused=Outcome("failed", exit_class="invalid", error=str(error)))
        store = TrialStore(self.url(plan))
        if not store.is_empty():  # resuming another run's checkpoints would mix two trials into one
            raise UsageError(
                f"{store.url}/ already holds a run's outputs (an earlier sweep named {self.sweep.name}, whose "
                f"study is not this one): delete them, or give this sweep another name: in {self.sweep.file}"
            )
        try:
            submitted = self.client.submit(job)
        except AlreadyExists:
            raise UsageError(
                f"job {plan.run} already exists: an earlier sweep named {self.sweep.name} ran here (`orch list -l "
                f"{self.selector}`); delete its jobs, or give this sweep another name: in {self.sweep.file}"
            ) from None
        for warning in getattr(submitted, "warnings", ()):
            if warning not in self._warned:  # every trial's job would say it: once
                self._warned.add(warning)
                self.notice(f"warning: {warning}")
        self._jobs[plan.run] = {
            "name": plan.run,
            "phase": "Pending",
        }  # there now, whatever the last list said
        return ClusterTrial(self, plan)

    def reconcile(self, plan: TrialPlan) -> ClusterTrial | Outcome | None:
        trial = ClusterTrial(self, plan)
        if self.job(plan.run) is None:
            return trial.gone(cut_off=True)
        return trial.poll() or trial

    # --- the trial's job ------------------------------------------------------------------------------------

    def url(self, plan: TrialPlan) -> str:
        """The trial's prefix in the store: OUTPUT_URL/JOB."""
        return f"{self.base_url}/{plan.run}"

    def trial_job(self, plan: TrialPlan) -> JobSpec:
        """The sweep's job with the trial's values, name, prefix, environment and labels (SpecError when the
        job refuses this combination of values)."""
        from orchestrator.job import loading

        env = {
            runtime_env.OBJECTIVE: self.sweep.metric,
            runtime_env.PRUNE_FILE: f"{self.url(plan)}/{outputs.PRUNE_REQUEST}",
            **plan.env,
        }
        overrides = [
            *self.sweep.overrides(plan.params),
            f"name={plan.run}",
            f"output.url={json.dumps(self.url(plan))}",
            *(f"env.{name}={json.dumps(value)}" for name, value in env.items()),
        ]
        job = loading.load_job(self.sweep.job_file, overrides, require_image=True)
        labels = {**job.labels, naming.LABEL_SWEEP: self.sweep.name, naming.LABEL_TRIAL: str(plan.number)}
        job = job.model_copy(update={"labels": labels})
        if plan.avoid_nodes and self.avoid_nodes is not None:
            why = "(suspected by earlier trials' failures: orch sweep status)"
            job, line = self.avoid_nodes(job, plan.avoid_nodes)
            if line is not None and line not in self._warned:  # said once, and again when it grows
                self._warned.add(line)
                self.notice(f"trial {plan.number} and later: {line} {why}")
        return job

    def job(self, name: str) -> dict[str, Any] | None:
        """The sweep's job `name` as the last list saw it (listed again when older than poll_seconds)."""
        if time.monotonic() - self._listed >= self.poll_seconds:
            self._listed = time.monotonic()
            self._jobs = {row["name"]: row for row in self.client.list(selector=self.selector)}
        return self._jobs.get(name)


class ClusterTrial:
    """One trial's job, followed through the sweep's list of its jobs and the trial's prefix in the store."""

    def __init__(self, trials: ClusterTrials, plan: TrialPlan, *, refused: Outcome | None = None) -> None:
        self.trials, self.plan, self.refused = trials, plan, refused
        self.store = TrialStore(trials.url(plan))
        self._values: list[tuple[int, float]] = []
        self._read = -math.inf
        self._interrupted = False
        self._pruned = False

    def values(self) -> list[tuple[int, float]]:
        if self.refused is None and time.monotonic() - self._read >= self.trials.poll_seconds:
            self._read = time.monotonic()
            self._values = reported_values(self.store.read_json(outputs.OBJECTIVE))
        return self._values

    def prune(self) -> None:
        """The trainer sees the request within trainer/stop.py's STORE_POLL_SECONDS and ends as pruned."""
        self.store.write(outputs.PRUNE_REQUEST, b"pruned by orch sweep\n")
        self._pruned = True

    def interrupt(self, signum: int) -> None:
        self._interrupted = True  # the job goes on: the next `orch sweep --cluster` re-attaches it

    def kill(self) -> None:
        self._interrupted = True

    def poll(self) -> Outcome | None:
        if self.refused is not None:
            return self.refused
        if self._interrupted:
            return Outcome("interrupted", exit_class="interrupted")
        job = self.trials.job(self.plan.run)
        if job is None:
            return self.gone(cut_off=False)
        if job.get("phase") == FAILED:
            state = self.trials.client.status(self.plan.run)
            message = getattr(state, "message", "") or getattr(state, "reason", "") or "its job failed"
            error = f"job {self.plan.run}: {message}"
            if nodes := self._suspected_nodes():  # its values did not fail it: asked again, elsewhere
                return Outcome("retry", exit_class="hardware", error=error, nodes=nodes)
            return Outcome("failed", exit_class="failed", error=error)
        if job.get("phase") != SUCCEEDED:
            return None
        outcome = self._ended()
        if outcome.state == "pruned" or self._pruned:
            self._delete()
        return outcome

    def gone(self, *, cut_off: bool) -> Outcome:
        """Its job is not there: it ended before it was deleted (its store says so), or it was deleted while
        running: by someone else while the sweep watched (`stopped`, a failure), or while none did (`cut_off`:
        interrupted, its values asked again)."""
        summary = self.store.read_json(outputs.SUMMARY)
        if summary or self.store.read_json(outputs.OBJECTIVE).get("final") is not None:
            return self._ended(summary)
        if cut_off:
            return Outcome("interrupted", exit_class="interrupted", error=f"its job {self.plan.run} is gone")
        return Outcome("failed", exit_class="stopped", error=f"its job {self.plan.run} was deleted")

    def _ended(self, summary: dict[str, Any] | None = None) -> Outcome:
        objective = self.store.read_json(outputs.OBJECTIVE)
        if summary is None:
            summary = self.store.read_json(outputs.SUMMARY)
        return ended(objective, summary, self.trials.sweep.metric)

    def _suspected_nodes(self) -> list[str]:
        """The nodes the failed job's pods name in their termination messages (hardware; orchestrator.hardware);
        none where the pods cannot be read (a Role without pods: the trial is then a plain failure)."""
        from orchestrator.cluster.errors import ClusterError

        try:
            return list(self.trials.client.suspected_nodes(self.plan.run))
        except ClusterError:
            return []

    def _delete(self) -> None:
        from orchestrator.cluster.errors import NotFound

        with contextlib.suppress(NotFound):  # gone already
            self.trials.client.delete(self.plan.run)
