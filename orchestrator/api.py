"""orch from Python: every operation an `orch` command performs, for notebooks, pipelines and sweeps.

    from orchestrator import api

    job = api.load_job("job.yaml", overrides=["nodes=2"])
    client = api.Client()                      # the cluster and namespace kubectl points at
    submitted = client.submit(job)             # validated, rendered once, created all or nothing
    finished = client.wait(submitted.name, timeout=3600)
    print(finished.phase)                      # Succeeded | Failed

The `orch` commands are this module with flags and printing around it. Errors are `OrchError`s
(orchestrator.errors; `SpecError` for a bad job, the `ClusterError`s of orchestrator.cluster): one line,
the same the CLI prints. An argument of the wrong type is a `TypeError` naming the call and the parameter;
a job name or namespace that breaks Kubernetes' name rules (naming.py) is a `UsageError` naming the
parameter; neither sends anything. Nothing here prints; what a command shows while it works (the API chosen, a
build's commands, warnings) comes through the `notice` and `warn` callbacks, silent by default.
Only the stdlib is imported up front; the cluster client, Jinja2 and pydantic when first used.

Over 600 lines, kept whole: it is the whole Python API, each public call with its documentation and the checks
of its arguments, at the import path docs/python-api.md documents; the work of each call is a few lines into
the modules below it (the job's image: imaging/job_image.py; the goodput journal's reading: status.py).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from orchestrator import naming
from orchestrator.errors import OrchError, UsageError

if TYPE_CHECKING:
    from orchestrator.cluster import Cluster, Job, Target
    from orchestrator.job.spec import JobSpec
    from orchestrator.local import LocalPlan
    from orchestrator.stacks import RankStack
    from orchestrator.status import JobStatus
    from orchestrator.sweep.controller import SweepResult
    from orchestrator.sweep.spec import Sweep
    from orchestrator.sweep.status import SweepStatus
    from orchestrator.top import Metrics

__all__ = [
    "Build",
    "Client",
    "LocalRun",
    "StacksByExec",
    "Submitted",
    "WaitTimeout",
    "avoid_nodes",
    "build_image",
    "load_job",
    "load_sweep",
    "local_stacks",
    "render",
    "run_local",
    "top",
    "sweep",
    "sweep_status",
    "validate",
]

Where = Literal["anywhere", "cluster", "local"]
Callback = Callable[[str], None]


def _silent(message: str) -> None:
    pass


class StacksByExec(OrchError):
    """`Client.stacks` cannot ask the job's ranks through its object store (no output.url, no rank answered):
    `commands` are the `kubectl exec` command of each running pod, which can (`orch stacks` prints them)."""

    def __init__(self, message: str, commands: Sequence[str]) -> None:
        super().__init__(message)
        self.commands = list(commands)


class WaitTimeout(OrchError):
    """`Client.wait` gave up before the job finished (`orch wait` exits 124, like timeout(1))."""

    exit_code = 124


# --- a job: load, validate, render ------------------------------------------------------------------------


def load_job(
    source: str | Path | Mapping[str, Any], overrides: Sequence[str] = (), *, where: Where = "anywhere"
) -> JobSpec:
    """A validated job from a job file (path) or its contents (a mapping), with `--set`-style overrides
    ("nodes=4", "train.optimizer.lr=1e-3"). One validation path, whatever runs the job next: the spec's
    rules, the API's (`api:`), and what tracking needs where it will run (`where`): "cluster" (render and
    submit: an image, an MLflow server named in the spec or the job's env), "local" (`orch run`: the
    tracking packages here, the server in the spec or this shell), "anywhere" (`orch validate`: what both
    of those require, the server known to either). Raises SpecError: `FILE:LINE:COL: field: problem`; its
    `errors` hold every problem found, in file order."""
    from orchestrator.job import loading

    _expect("load_job", "source", source, (str, os.PathLike, Mapping), "a path or a mapping")
    _expect_strings("load_job", "overrides", overrides)
    if where not in ("anywhere", "cluster", "local"):
        raise TypeError(f"load_job(): where must be 'anywhere', 'cluster' or 'local', not {where!r}")

    require_image, local_run = where == "cluster", where == "local"
    if isinstance(source, Mapping):
        import copy

        data = copy.deepcopy(dict(source))
        origins = loading.apply_overrides(data, overrides)
        return loading.validate(data, file="<job>", positions={}, origins=origins,
                                require_image=require_image, local_run=local_run)  # fmt: skip
    return loading.load_job(source, overrides, require_image=require_image, local_run=local_run)


def validate(source: str | Path | Mapping[str, Any], overrides: Sequence[str] = ()) -> JobSpec:
    """`load_job(..., where="anywhere")`: what `orch validate` checks."""
    return load_job(source, overrides, where="anywhere")


def render(job: JobSpec, *, api: str | None = None, name: str | None = None) -> list[dict[str, Any]]:
    """The objects `submit` would create, as plain dicts in apply order (`orch render`); no cluster is asked,
    so `api: auto` renders the first registered API. `name` renames the job (e.g. a sweep's trial)."""
    from orchestrator.rendering import render as rendering

    _expect_job("render", job)
    _expect("render", "api", api, (str, type(None)), "an API key (str) or None")
    if name is not None:
        _job_name("render", name)

    return rendering.render(job, api=api, name=name)


def avoid_nodes(job: JobSpec, nodes: Sequence[str], *, why: str = "") -> tuple[JobSpec, str | None]:
    """`job` kept off `nodes` as well (its scheduling.exclude_nodes, extended in order) and the one line
    that says which were added (None: none was new). What `Client.submit(replace=True)` does with the
    replaced job's suspected nodes (`Client.suspected_nodes`), and a sweep with a failed trial's. A name no
    kubernetes.io/hostname label can hold is left out, and the line says so. `why` ends the line."""
    from pydantic import TypeAdapter, ValidationError

    from orchestrator.job.fields import NodeHostname

    _expect_job("avoid_nodes", job)
    _expect_strings("avoid_nodes", "nodes", nodes)
    hostname: TypeAdapter[str] = TypeAdapter(NodeHostname)
    current = list(job.scheduling.exclude_nodes)
    added, unusable = [], []
    for node in dict.fromkeys(nodes):
        if node in current:
            continue
        try:
            added.append(hostname.validate_python(node))
        except ValidationError:
            unusable.append(node)
    if not added and not unusable:
        return job, None
    scheduling = job.scheduling.model_copy(update={"exclude_nodes": [*current, *added]})
    line = (
        f"scheduling.exclude_nodes: + {', '.join(added)}" if added else "scheduling.exclude_nodes: unchanged"
    )
    if unusable:
        line += f" (left out, not a hostname label: {', '.join(unusable)})"
    return job.model_copy(update={"scheduling": scheduling}), line + (f" {why}" if why else "")


# --- run on this machine --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalRun:
    """What `run_local` did: where it wrote, and the result (summary.json; None when the run failed)."""

    output_dir: Path
    summary: dict[str, Any] | None
    links: dict[str, str] = field(
        default_factory=dict
    )  # where tracking recorded the run (mlflow, tensorboard)


def run_local(
    job: JobSpec,
    *,
    procs: int | None = None,
    steps: int | None = None,
    output_dir: str | Path | None = None,
    progress_bar: bool = False,
    notice: Callable[[LocalPlan, Path], None] | None = None,
    warn: Callback = _silent,
) -> LocalRun:
    """Train `job` here (`orch run`): torchrun's launcher, gloo on CPU or one process per local GPU.
    `notice(plan, output_dir)` is called once the output dir is claimed, before training starts."""
    from orchestrator import local

    _expect_job("run_local", job)
    _expect("run_local", "procs", procs, (int, type(None)), "an int or None")
    _expect("run_local", "steps", steps, (int, type(None)), "an int or None")
    _expect("run_local", "output_dir", output_dir, (str, os.PathLike, type(None)), "a path or None")

    plan = local.plan(
        job, procs=procs, steps=steps, output_dir=None if output_dir is None else str(output_dir)
    )
    for warning in local.check_devices(plan):
        warn(warning)
    local.check_store(plan)  # an object-store output: writable, or UsageError before anything starts
    with local.claim(plan) as claimed:
        if notice is not None:
            notice(plan, claimed.output_dir)
        summary = local.run(claimed, progress_bar=progress_bar)
    tracked = job.tracking.tensorboard or job.tracking.mlflow is not None
    links = local.tracking_links(claimed.output_dir) if summary is not None and tracked else {}
    return LocalRun(claimed.output_dir, summary, links)


# --- a job's metrics --------------------------------------------------------------------------------------------


def top(
    name: str,
    *,
    prometheus: str | None = None,
    namespace: str | None = None,
    exporters: Sequence[str] = (),
    local: bool = False,
    port: int | None = None,
    worst: int = 5,
) -> Metrics:
    """Where `orch top` reads job `name`'s metrics, ready to read: `.snapshot()` (what `orch top -o json`
    prints: a row per rank and GPU, and the summary) or `.follow(interval)` (a snapshot every `interval`
    seconds). From Prometheus (`prometheus`, else $ORCH_PROMETHEUS_URL, else `prometheus_url` in orch's
    config file; only series labelled `namespace` when given), or from `exporters` (/metrics URLs) and, with
    `local`, the exporter of the live `orch run` of `name` on this machine (or `port`). UsageError when
    both or neither are given."""
    from orchestrator import top as metrics

    _job_name("top", name)  # it goes into PromQL label matchers: the name rules keep quotes and braces out
    if namespace is not None:
        _namespace("top", namespace)
    _expect("top", "prometheus", prometheus, (str, type(None)), "a URL (str) or None")
    _expect_strings("top", "exporters", exporters)
    urls = [*exporters, *([metrics.local_exporter_url(port, job=name)] if local else [])]
    return metrics.Metrics(name, prometheus=prometheus, exporters=urls, namespace=namespace, worst=worst)


# --- a sweep: many trials of one job (docs/sweeps.md) -----------------------------------------------------------


def load_sweep(path: str | Path, *, where: Literal["local", "cluster"] = "local") -> Sweep:
    """A checked sweep file and its job: every problem is a SpecError naming sweep.yaml's line (exit 2),
    found before any trial starts (parameter paths and values against the job, ranges, the metric), for
    trials run `where`: "local" (`orch run`), "cluster" (jobs, checked as `orch submit` checks them; the job
    needs output.url, where the sweep reads each trial's objective)."""
    from orchestrator.sweep.spec import load_sweep as load

    if where not in ("local", "cluster"):
        raise TypeError(f"load_sweep(): where must be 'local' or 'cluster', not {where!r}")
    return load(path, where=where)


def sweep(
    source: str | Path | Sweep,
    *,
    client: Client | None = None,
    poll_seconds: float | None = None,
    notice: Callback = _silent,
) -> SweepResult:
    """Run the sweep (`orch sweep`): each trial an `orch run` of its own in runs/NAME/trial-N beside the sweep
    file, `parallel` at once; with `client`, each trial a job on that cluster (`orch sweep --cluster`: as
    `Client.submit` creates it, labelled orch.dev/sweep and orch.dev/trial, its outputs under OUTPUT_URL/JOB).
    A sweep run before continues (finished trials are not run again; trials cut off are resumed from their
    checkpoint, or re-attached on the cluster, or asked again). `poll_seconds`: how often the trials are
    looked at (default 0.2 s here; on a cluster 5 s: one list of the sweep's jobs and one read of each running
    trial's objective). `notice` hears each trial start and end. Raises SweepFailed after max_failed failures,
    SweepInterrupted (128+signal) on SIGTERM or Ctrl-C (cluster trials go on running)."""
    from orchestrator.sweep import controller, trials

    _expect("sweep", "client", client, (Client, type(None)), "an api.Client or None")
    _expect("sweep", "poll_seconds", poll_seconds, (int, float, type(None)), "seconds or None")
    where: Literal["local", "cluster"] = "local" if client is None else "cluster"
    checked = source if not isinstance(source, (str, Path)) else load_sweep(source, where=where)
    if checked.where != where:
        raise UsageError(f"sweep {checked.name} was loaded for trials run {checked.where}, not {where}: "
                         f"api.load_sweep(path, where={where!r})")  # fmt: skip
    if client is None:
        runner: trials.TrialRunner = trials.LocalTrials(checked)
        return controller.run(
            checked, runner, notice=notice, poll_seconds=poll_seconds or controller.POLL_SECONDS
        )
    from orchestrator.sweep import cluster_trials

    every = poll_seconds or cluster_trials.POLL_SECONDS
    target = client.cluster(checked.job.namespace)  # where `submit` creates the trials' jobs
    if client.namespace != target.namespace:  # and where the sweep lists, reads and deletes them
        client = Client(kubeconfig=client.kubeconfig, context=client.context, namespace=target.namespace,
                        request_timeout=client.request_timeout)  # fmt: skip
    from orchestrator.redaction import redact_url

    place = {"server": redact_url(target.transport.host).rstrip("/"), "namespace": target.namespace,
             "shown": target.server}  # fmt: skip
    jobs = cluster_trials.ClusterTrials(
        checked, client, place=place, poll_seconds=every, avoid_nodes=avoid_nodes, notice=notice
    )
    return controller.run(checked, jobs, notice=notice, poll_seconds=min(every, controller.POLL_SECONDS))


def sweep_status(source: str | Path | Sweep, *, plot: bool = True) -> SweepStatus:
    """Every trial of the sweep, best first (number, state, parameters, objective, its run dir or its job),
    and the PNG of the objective per trial and per parameter in the sweep's folder (`orch sweep status`)."""
    from orchestrator.sweep.spec import load_sweep as load
    from orchestrator.sweep.status import status

    checked = source if not isinstance(source, (str, Path)) else load(source, where="anywhere")
    return status(checked, draw=plot)


def local_stacks(name: str) -> list[RankStack]:
    """`orch stacks NAME --local`: every rank's Python stack (all threads) of the newest live `orch run` of
    `name` on this machine (py-spy where installed, else the ranks' faulthandler; orchestrator/stacks.py)."""
    from orchestrator import local, stacks

    _job_name("stacks", name)
    runs = local.live_runs(name)
    if not runs:
        raise OrchError(f"no live `orch run` of {name} on this machine (without --local: the cluster's job)")
    found = stacks.dump(Path(runs[0]["output_dir"]))
    if not found:
        raise OrchError(f"the `orch run` of {name} (pid {runs[0]['pid']}) has no trainer ranks running now")
    return found


# --- on a cluster ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Build:
    """`submit(build=...)`: build and push the job's image first (and its workspace as a thin layer)."""

    context: str = "."  # the trainer image's build context (used when it holds a Dockerfile)
    build_args: Sequence[str] = ()  # KEY=VALUE
    tool: str | None = None  # docker | podman | buildah; None: the first one found
    job_file: str | Path = (
        "job.yaml"  # its folder is the default workspace (orchestrator/imaging/workspace.py)
    )

    def __post_init__(self) -> None:
        _expect("Build", "context", self.context, (str, os.PathLike), "a path")
        _expect_strings("Build", "build_args", self.build_args)
        _expect("Build", "tool", self.tool, (str, type(None)), "docker, podman, buildah or None")
        _expect("Build", "job_file", self.job_file, (str, os.PathLike), "a path")


@dataclass(frozen=True)
class Submitted:
    """What `Client.submit` did. `objects`: what was sent (or, on a client dry run, would be)."""

    name: str
    namespace: str
    api: str
    objects: list[dict[str, Any]]
    created: list[str] = field(default_factory=list)  # kubectl refs: pytorchjob.kubeflow.org/demo
    deleted: list[str] = field(default_factory=list)  # what `replace` deleted first
    warnings: list[str] = field(
        default_factory=list
    )  # what the job risks (partial scheduling, lost checkpoints)


class Client:
    """One cluster, chosen like kubectl does: `kubeconfig` (default $KUBECONFIG, ~/.kube/config, in-cluster),
    `context`, `namespace` (default: the job file's, else the context's, else "default"). Connects on first
    use; `request_timeout` bounds each API call, retries included (None: $ORCH_REQUEST_TIMEOUT, else 60 s)."""

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
        request_timeout: float | None = None,
    ) -> None:
        _expect("Client", "kubeconfig", kubeconfig, (str, os.PathLike, type(None)), "a path or None")
        _expect("Client", "context", context, (str, type(None)), "a str or None")
        if namespace is not None:
            _namespace("Client", namespace)
        _expect("Client", "request_timeout", request_timeout, (int, float, type(None)), "seconds or None")
        self.kubeconfig = None if kubeconfig is None else os.fspath(kubeconfig)
        self.context, self.namespace = context, namespace
        self.request_timeout = request_timeout
        self._clusters: dict[tuple[str | None, bool], Cluster] = {}
        self._connecting = threading.Lock()  # threads sharing a Client share one connection

    def cluster(self, job_namespace: str | None = None, *, lean: bool = False) -> Cluster:
        """The connection (in the job's namespace when `namespace` was not given), made once. `lean`: without
        the official client where the kubeconfig allows (status, list, logs, wait and delete ask for it;
        orchestrator/cluster/connection.py)."""
        from orchestrator import cluster

        key = (job_namespace, lean)
        with self._connecting:
            if key not in self._clusters:
                self._clusters[key] = cluster.connect(self._target(), job_namespace=job_namespace, lean=lean)
            return self._clusters[key]

    def submit(
        self,
        job: JobSpec,
        *,
        api: str | None = None,
        replace: bool = False,
        dry_run: str | None = None,
        build: Build | None = None,
        notice: Callback = _silent,
        warn: Callback = _silent,
    ) -> Submitted:
        """Create `job` on the cluster: its job object (`api`, else the job's `api:`; auto asks the cluster
        which API it serves) and what it owns; all or nothing (a failed or interrupted create deletes what
        was created). Everything is checked before anything is built or sent, and the job is rendered once,
        with the image `build` pushed. `replace` deletes a job of that name first, and keeps the new one off
        the nodes the old one suspected (`avoid_nodes`; `notice` hears which). dry_run "client" contacts
        nothing (auto: the first registered API) and returns the objects; "server" lets the API server check
        them without storing anything. `notice` hears progress (the API chosen, a build), `warn` what the
        cluster lacks (a PodMonitor CRD); what the job itself risks is in the result's `warnings`."""
        from orchestrator import apis, cluster
        from orchestrator.imaging import job_image
        from orchestrator.rendering import render as rendering

        _expect_job("Client.submit", job)
        _expect("Client.submit", "api", api, (str, type(None)), "an API key (str) or None")
        _expect("Client.submit", "replace", replace, (bool,), "a bool")
        if dry_run not in (None, "client", "server"):
            raise TypeError(f"Client.submit(): dry_run must be None, 'client' or 'server', not {dry_run!r}")
        _expect("Client.submit", "build", build, (Build, type(None)), "an api.Build or None")
        wanted = api or job.api
        chosen = rendering.check(job, api=wanted)  # a bad job stops here: nothing is asked, built or sent
        if dry_run == "client":
            namespace = cluster.resolve_namespace(self._target(), job_namespace=job.namespace)
        else:
            target_cluster = self.cluster(job.namespace)
            job_api, why = cluster.choose_api(target_cluster, wanted)
            namespace = target_cluster.namespace
            if wanted == apis.AUTO:
                notice(f"api: {job_api.key} ({why})")
            if job_api.key != chosen:
                chosen = rendering.check(job, api=job_api.key)
            if replace:
                job = self._avoid_suspected_nodes(target_cluster, job, notice)
        if build is not None:
            if dry_run != "client":  # a refusal (API not served, the name taken) costs no multi-GB build
                cluster.preflight(target_cluster, apis.by_key(chosen), job.name, replace=replace)
            image = job_image.for_submit(job, context=build.context, job_file=build.job_file,
                                         build_args=build.build_args, tool=build.tool,
                                         dry_run=dry_run == "client", notice=notice)  # fmt: skip
            job = job.model_copy(update={"image": image})
        objects = rendering.render(job, api=chosen)
        warnings = rendering.warnings(job, chosen)
        if dry_run == "client":
            return Submitted(
                job.name, namespace, chosen, cluster.prepare(objects, namespace), warnings=warnings
            )
        kinds = cluster.submittable()
        with cluster.signals_interrupt():  # SIGTERM rolls back like Ctrl-C does
            result = cluster.submit(
                target_cluster, objects, replace=replace, dry_run=dry_run == "server", warn=warn
            )
        return Submitted(
            job.name,
            namespace,
            chosen,
            result.created,
            created=[kinds[obj["kind"]].ref(obj["metadata"]["name"]) for obj in result.created],
            deleted=list(result.deleted),
            warnings=warnings,
        )

    def suspected_nodes(self, name: str) -> list[str]:
        """The nodes job `name`'s hardware failures point at (a failed pre-flight check, a CUDA error only
        bad hardware raises), as `orch status` lists them: what `avoid_nodes` takes."""
        from orchestrator import cluster

        _job_name("Client.suspected_nodes", name)
        found = cluster.suspected_nodes(self.cluster(lean=True), name)
        return list(dict.fromkeys(s.node for s in found if s.node))

    def _avoid_suspected_nodes(self, target_cluster: Cluster, job: JobSpec, notice: Callback) -> JobSpec:
        """`submit(replace=True)`: the job to be replaced's suspected nodes join the new one's exclude list."""
        from orchestrator import cluster

        try:
            found = cluster.suspected_nodes(target_cluster, job.name)
        except cluster.NotFound:
            return job  # nothing to replace
        except cluster.Forbidden as error:  # a Role that may replace the job but not list its pods
            notice(f"the replaced job's suspected nodes are not carried over: {error}")
            return job
        nodes = list(dict.fromkeys(s.node for s in found if s.node))
        job, line = avoid_nodes(job, nodes, why=f"(suspected by the replaced job: orch status {job.name})")
        if line:
            notice(line)
        return job

    def status(self, name: str) -> JobStatus:
        """The job's phase, replicas, pods and recent warnings (`orch status`), and the rank every other one
        waits for (`straggler`) where a Prometheus is configured as for `orch top` (None: none, or none
        configured or answering)."""
        import dataclasses

        from orchestrator import cluster, top

        name = _job_name("Client.status", name)
        state = cluster.job_status(self.cluster(lean=True), name)
        return dataclasses.replace(
            state, straggler=top.find_straggler(name, namespace=state.namespace), **_journal(state)
        )

    def stacks(self, name: str, *, timeout: float = 30.0) -> list[RankStack]:
        """`orch stacks NAME`: every rank's Python stack (all threads) of the running job `name` and where its
        loop is, asked through the job's object store (output.url: a request there, which each rank looks for
        every few seconds and answers; orchestrator/stacks.py), with this shell's credentials for the store
        as `orch status` reads it. A rank that did not answer within `timeout` seconds is in the list with
        `answered` False and its last heartbeat's step and phase (the hung one). OrchError, one line: the
        job not running, no output.url (then with the `kubectl exec` command of each pod), the store not
        usable, another `orch stacks` asking, no rank answering."""
        from orchestrator import cluster, stacks, status, storage
        from orchestrator.kube import read

        name = _job_name("Client.stacks", name)
        _expect("Client.stacks", "timeout", timeout, (int, float), "seconds")
        if not 0 < timeout < float("inf"):
            raise UsageError(f"timeout: {timeout:g} is not a number of seconds above 0")
        target = self.cluster(lean=True)
        job = cluster.locate(target, name)
        pods = cluster.job_pods(target, job)
        phase = job.api.phase(job.obj, pods)
        if phase != status.RUNNING:
            raise OrchError(
                f"job {name} is {phase}, not Running: orch stacks asks the ranks of a running job"
            )
        url = read.text(read.dig(job.obj, "metadata", "annotations", naming.ANNOTATION_OUTPUT_URL))
        commands = [
            f"kubectl exec -n {job.namespace} {read.text(read.dig(p, 'metadata', 'name'))} -c "
            f"{job.api.container} -- python -m orchestrator.stacks"
            for p in pods
            if read.dig(p, "status", "phase") == status.RUNNING
        ]
        if not url:
            raise StacksByExec(
                f"job {name} has no output.url, the object store through which orch stacks asks its ranks: "
                "ask each running pod with kubectl exec instead (needs pods/exec, which orch's Role leaves out)",
                commands,
            )
        try:
            found = stacks.ask_ranks(url, seconds=timeout)
        except storage.StorageError as error:
            raise OrchError(str(error)) from None
        if not found:
            raise StacksByExec(
                f"no rank of job {name} answered within {timeout:g} s through {url}/ (a trainer older than "
                "orch stacks through the store, pods that cannot reach it, or ORCH_HEARTBEAT=0): ask each "
                "running pod with kubectl exec instead",
                commands,
            )
        return found

    def list(self, *, all_namespaces: bool = False, selector: str | None = None) -> list[dict[str, Any]]:
        """The jobs orch submitted, one row each: name, namespace, api, phase, age, nodes, GPUs (`orch list`);
        only those a label `selector` selects, when given (`orch.dev/sweep=lr`: a cluster sweep's trials)."""
        import datetime

        from orchestrator import cluster, status

        _expect("Client.list", "all_namespaces", all_namespaces, (bool,), "a bool")
        _expect("Client.list", "selector", selector, (str, type(None)), "a label selector (str) or None")
        now = datetime.datetime.now(datetime.timezone.utc)
        found = cluster.list_jobs(self.cluster(lean=True), all_namespaces=all_namespaces, selector=selector)
        return [status.list_row(job.api, job.obj, now) for job in found]

    def logs(
        self,
        name: str,
        *,
        emit: Callable[[str, str], None],
        follow: bool = False,
        notice: Callback = _silent,
        **selection: Any,
    ) -> Job | None:
        """The training container's log of the job's pods as `emit(label, line)` (label: master-0, worker-2,
        node-1); with `follow`, until the job ends (returns it; None if it was deleted). `selection`: which
        pods and lines, as `orch logs` takes them (rank, ranks, pod, every, tail, since_seconds,
        max_requests; orchestrator.cluster.stream_logs)."""
        from orchestrator import cluster

        _job_name("Client.logs", name)
        _expect("Client.logs", "emit", emit, (Callable,), "a function of (label, line)")
        _expect("Client.logs", "follow", follow, (bool,), "a bool")
        for key, value in selection.items():
            if key not in LOG_SELECTION:
                raise TypeError(
                    f"Client.logs(): unexpected keyword {key!r} (takes {', '.join(LOG_SELECTION)})"
                )
            _expect("Client.logs", key, value, (*LOG_SELECTION[key][0], type(None)), LOG_SELECTION[key][1])
        return cluster.stream_logs(
            self.cluster(lean=True), name, emit=emit, notice=notice, follow=follow, **selection
        )

    def wait(self, name: str, *, timeout: float | None = None, on_phase: Callback = _silent) -> Job:
        """Block until the job Succeeded or Failed and return it (`.phase`, `.condition`); WaitTimeout after
        `timeout` seconds (None: never). `on_phase(phase)` hears every change."""
        from orchestrator import cluster

        _job_name("Client.wait", name)
        _expect("Client.wait", "timeout", timeout, (int, float, type(None)), "seconds or None")
        _expect("Client.wait", "on_phase", on_phase, (Callable,), "a function of (phase)")
        job = cluster.wait_for(self.cluster(lean=True), name, timeout=timeout, on_phase=on_phase)
        if job is None:
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for job {name}")
        return job

    def delete(self, name: str, *, wait: bool = False, timeout: float = 600) -> Job:
        """Delete the job and everything submitted with it; `wait`: return once its pods are gone."""
        from orchestrator import cluster

        _job_name("Client.delete", name)
        _expect("Client.delete", "wait", wait, (bool,), "a bool")
        _expect("Client.delete", "timeout", timeout, (int, float), "seconds")
        return cluster.delete_job(self.cluster(lean=True), name, wait=wait, timeout=timeout)

    def _target(self) -> Target:
        from orchestrator import cluster

        return cluster.Target(
            self.kubeconfig, self.context, self.namespace, request_timeout=self.request_timeout
        )


def build_image(
    folder: str | Path = ".",
    *,
    job: JobSpec | None = None,
    job_file: str | Path | None = None,
    image: str | None = None,
    tag: str | None = None,
    dockerfile: str | None = None,
    build_args: Sequence[str] = (),
    base: str | None = None,
    tool: str | None = None,
    push: bool = False,
    dry_run: bool = False,
    notice: Callback = _silent,
    commands: Callback | None = None,
) -> str:
    """`orch build`: the trainer image, and the job's workspace as a thin layer over it; the reference to run.

    The trainer image: `base` when given (nothing is built for it), else `folder`'s Dockerfile (`dockerfile`,
    else FOLDER/Dockerfile), else orch's own (the top-level Dockerfile, from the build context packaged with
    orch: builder.own_context), so it builds from any folder. `image` is the repository (default: the job's
    image's, else builder.DEFAULT_REPO); the tag a content hash unless `tag`. Then, when `job` (loaded from
    `job_file`) has a workspace, its files go on top (orchestrator/imaging/workspace.py) under `workspace-<content>-
    <base>`, and that reference is returned. `dry_run`: nothing is built; each command goes to `commands`
    (default: `notice`), one argv as a shell line."""
    from orchestrator.imaging import job_image

    _expect("build_image", "folder", folder, (str, os.PathLike), "a path")
    if job is not None:
        _expect_job("build_image", job)
    for param, value in (
        ("image", image),
        ("tag", tag),
        ("dockerfile", dockerfile),
        ("base", base),
        ("tool", tool),
    ):
        if value is not None:
            _expect("build_image", param, value, (str,), "a str")
    _expect_strings("build_image", "build_args", build_args)
    return job_image.build(folder, job=job, job_file=job_file, image=image, tag=tag, dockerfile=dockerfile,
                           build_args=build_args, base=base, tool=tool, push=push, dry_run=dry_run,
                           notice=notice, commands=commands)  # fmt: skip


def _journal(state: JobStatus) -> dict[str, Any]:
    """What the job's goodput journal and hang verdict in output.url say (status.journal_fields): read with
    this shell's credentials for the store (AWS_*, as `orch run` reads them), within ~15 s. A journal that
    cannot be read is a note, never a failed `orch status`."""
    from orchestrator import outputs, status, storage

    if not state.output_url:
        return {
            "goodput_note": "the goodput journal is in the pods' output folder: set output.url to see it here"
        }
    try:
        files = storage.small_files(state.output_url, (outputs.HANG,), under=outputs.GOODPUT)
    except storage.StorageError as error:
        return {"goodput_note": f"goodput unknown: {error}"}
    return status.journal_fields(state, files)


# --- what the calls take: checked before anything is read or sent ---------------------------------------------

# Client.logs' selection keywords: the types each takes (or None), and how an error says it.
LOG_SELECTION: dict[str, tuple[tuple[type, ...], str]] = {
    "rank": ((int,), "a node rank (int)"),
    "ranks": ((set, frozenset), "a set of node ranks"),
    "pod": ((str,), "a pod name (str)"),
    "every": ((bool,), "a bool"),
    "tail": ((int,), "a number of lines (int)"),
    "since_seconds": ((int,), "seconds (int)"),
    "max_requests": ((int,), "a number of streams (int)"),
}


def _expect(call: str, param: str, value: Any, types: tuple[Any, ...], what: str) -> None:
    """TypeError naming the call and the parameter unless `value` is one of `types` (a bool is no number)."""
    if isinstance(value, types) and not (isinstance(value, bool) and bool not in types):
        return
    raise TypeError(f"{call}(): {param} must be {what}, not {type(value).__name__}")


def _expect_strings(call: str, param: str, value: Any) -> None:
    """A sequence of str; a lone str (which would be read letter by letter) is refused."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(f"{call}(): {param} must be a list of str, not {type(value).__name__}")
    for item in value:
        if not isinstance(item, str):
            raise TypeError(f"{call}(): {param} must be a list of str, not one holding {type(item).__name__}")


def _expect_job(call: str, job: Any) -> None:
    from orchestrator.job.spec import JobSpec

    _expect(call, "job", job, (JobSpec,), "a JobSpec (api.load_job makes one from a file or a dict)")


def _job_name(call: str, name: Any) -> str:
    """`name` as a job name: a str (TypeError) that obeys the job file's `name:` rule (UsageError)."""
    _expect(call, "name", name, (str,), "a job name (str)")
    if problem := naming.job_name_problem(name):
        raise UsageError(f"name: {problem}")
    return str(name)


def _namespace(call: str, namespace: Any) -> str:
    _expect(call, "namespace", namespace, (str,), "a namespace (str) or None")
    if problem := naming.namespace_problem(namespace):
        raise UsageError(f"namespace: {problem}")
    return str(namespace)
