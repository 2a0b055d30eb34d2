"""What a training job and its pods say about a run, as plain data: the job's status model. Pure functions:
no I/O, no kubernetes.

`orch status`, `orch list`, `orch logs` and `orch wait` read the objects `orchestrator.cluster` fetched through
these (and print them through orchestrator/commands/tables.py). What differs between job APIs (which
conditions mean what, which labels name a pod's role) comes from the job's `JobAPI` (orchestrator/apis/);
everything here is the same for all of them. The phase is orch's own word, the same on every API: Pending,
Created, Running, Restarting, Suspended, Succeeded, Failed, and Unknown when the job's status cannot be read.

Every function here is total over JSON values: fields are read only through orchestrator/kube/read.py, so a
malformed object gives "", 0 or nothing, and a malformed `status.conditions` makes the phase Unknown
(tests/cluster/test_status_total.py feeds them random mutations of real objects).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator import hardware, naming
from orchestrator.kube import read
from orchestrator.rendering import tracking_record

if TYPE_CHECKING:
    from orchestrator.apis.base import JobAPI

PENDING = "Pending"  # no condition is True yet: the controller has not seen the job
RUNNING = "Running"  # its ranks run (what `orch stacks` asks)
UNKNOWN = "Unknown"  # the job's status is there but cannot be read (not a list of conditions)
FINISHED = frozenset({"Failed", "Succeeded"})


@dataclass(frozen=True)
class ReplicaStatus:
    active: int = 0
    succeeded: int = 0
    failed: int = 0


@dataclass(frozen=True)
class PodSummary:
    name: str
    role: str  # master | worker
    index: int
    phase: str  # the pod phase, or the waiting/terminating reason that explains it (CrashLoopBackOff, ...)
    node: str
    restarts: int
    last_termination: str  # e.g. "OOMKilled (exit 137)": its end, or its last one; "" when it never ended

    @property
    def label(self) -> str:
        """The `[master-0]` / `[worker-3]` prefix used by `orch logs`."""
        return f"{self.role}-{self.index}"


@dataclass(frozen=True)
class Straggler:
    """The rank every other one waits for: its time to the gradient reduction is far above the job's median
    (the OrchStraggler alert's rule, on the last values; orchestrator/top.py asks Prometheus)."""

    rank: str
    node_rank: str
    pod: str
    hostname: str
    seconds: float
    median_seconds: float


@dataclass(frozen=True)
class SuspectedNode:
    """A node a hardware failure of the job points at: a rank that failed the pre-flight check or died of a
    CUDA error only bad hardware raises, as a pod's launcher recorded it in its termination message
    (orchestrator/hardware.py; docs/cluster.md, "Suspected nodes")."""

    node: str  # the Kubernetes node: spec.nodeName of the rank's pod; "" when no pod of the job shows it
    pod: str  # the rank's pod, "" when not found
    rank: int  # -1: not known
    node_rank: int
    gpu: str  # "cuda:1 GPU-..." where known
    reason: str
    reported_by: str  # the pod whose termination message says so


@dataclass(frozen=True)
class JobStatus:
    name: str
    namespace: str
    kind: str  # PyTorchJob | TrainJob
    phase: str
    reason: str
    message: str
    replicas: dict[str, ReplicaStatus]
    created: str
    start_time: str
    completion_time: str
    restarts: int  # whole-job restarts (TrainJob: JobSet recreated every pod); PyTorchJob: most of one pod
    pods: list[PodSummary] = field(default_factory=list)
    events: list[dict[str, str]] = field(default_factory=list)
    tracking: dict[str, str] = field(
        default_factory=dict
    )  # {"mlflow": ..., "tensorboard": ...} (render's annotation)
    output_url: str = ""  # output.url: the object store that keeps the checkpoints (render's annotation)
    waiting: dict[str, Any] = field(
        default_factory=dict
    )  # what its queue says (kueue_waiting, podgroup_waiting)
    straggler: Straggler | None = None  # where Prometheus is configured and one rank holds the others
    suspected_nodes: list[SuspectedNode] = field(default_factory=list)  # what its hardware failures point at
    milestones: dict[str, str] = field(
        default_factory=dict
    )  # created, admitted (its queue), pods_ready, first_step: where the time before training went (#31)
    goodput: dict[str, Any] | None = None  # goodput.Goodput.to_dict(), read from the journal (output.url)
    goodput_note: str = ""  # why there is no goodput: no output.url, or the store could not be read
    hang: dict[str, Any] | None = None  # the hang verdict a rank wrote (output.url/hang.json), if any

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED

    @property
    def suspected_node_names(self) -> list[str]:
        """The Kubernetes nodes to keep the job off (scheduling.exclude_nodes), each once, in order."""
        return list(dict.fromkeys(s.node for s in self.suspected_nodes if s.node))

    def to_dict(self) -> dict[str, Any]:
        """As `orch status -o json` prints it: `straggler` only when there is one."""
        document = asdict(self)
        if self.straggler is None:
            del document["straggler"]
        return document


def phase_by_precedence(job: Any, precedence: Sequence[str]) -> str:
    """The first of `precedence` with a condition whose status is "True"; Pending when none is,
    Unknown when the conditions cannot be read."""
    conditions = read.conditions(job)
    if conditions is None:
        return UNKNOWN
    true_types = {read.text(c.get("type")) for c in conditions if c.get("status") == "True"}
    return next((p for p in precedence if p in true_types), PENDING)


def replica_counts(counts: Any) -> dict[str, int]:
    return {key: read.to_int(read.dig(counts, key)) for key in ("active", "succeeded", "failed")}


def job_status(
    api: JobAPI,
    job: Any,
    pods: Sequence[Any] = (),
    events: Sequence[Any] = (),
    *,
    waiting: dict[str, Any] | None = None,
    workloads: Sequence[Any] = (),
) -> JobStatus:
    condition = api.phase_condition(job, pods)
    return JobStatus(
        name=read.text(read.dig(job, "metadata", "name")),
        namespace=read.text(read.dig(job, "metadata", "namespace")),
        kind=api.resource.kind,
        phase=api.phase(job, pods),
        reason=read.text(condition.get("reason")),
        message=read.text(condition.get("message")),
        replicas={role: ReplicaStatus(**counts) for role, counts in api.replicas(job).items()},
        created=read.text(read.dig(job, "metadata", "creationTimestamp")),
        start_time=read.text(read.dig(job, "status", "startTime")),
        completion_time=read.text(read.dig(job, "status", "completionTime")),
        restarts=api.restarts(job, list(pods)),
        pods=sorted((pod_summary(api, p) for p in pods), key=lambda pod: pod_order(api, pod)),
        events=[event_summary(e) for e in warning_events(events)],
        tracking=tracking_record.describe(read.dig(job, "metadata", "annotations")),
        output_url=read.text(read.dig(job, "metadata", "annotations", naming.ANNOTATION_OUTPUT_URL)),
        waiting=waiting or {},
        suspected_nodes=suspected_nodes(api, job, pods),
        milestones=milestones(job, pods, workloads),
    )


# --- suspected nodes: what the pods' launchers recorded (orchestrator/hardware.py) ---------------------------


def suspected_nodes(api: JobAPI, job: Any, pods: Sequence[Any]) -> list[SuspectedNode]:
    """The suspects in the termination messages of the job's pods (the training container's current and
    last state), each resolved to its pod and node: the recording pod itself when the suspect is its own
    host, else a pod of that host name (one that recorded a failure too, first: the Job controller keeps a
    failed pod beside its replacement of the same host name), else the pod of that node rank."""
    pods = [p for p in pods if isinstance(p, dict)]
    recorded: list[tuple[dict[str, Any], hardware.Record]] = []
    for each in pods:
        container = read.container_status(each, api.container)
        for state in ("state", "lastState"):
            record = hardware.read_record(read.dig(container, state, "terminated", "message"))
            if record is not None:
                recorded.append((each, record))
    failed = {id(each) for each, _ in recorded}
    by_rank = {api.node_rank(job, *api.pod_role(p)): p for p in pods}
    found: dict[tuple[str, int, str], SuspectedNode] = {}
    for reporter, record in recorded:
        for suspect in record.suspects:
            if suspect.host in _hosts(reporter):
                pod: dict[str, Any] | None = reporter
            else:
                named = sorted(
                    (p for p in pods if suspect.host in _hosts(p)), key=lambda p: id(p) not in failed
                )
                pod = (
                    named[0] if named else by_rank.get(suspect.node_rank) if suspect.node_rank >= 0 else None
                )
            node = read.text(read.dig(pod, "spec", "nodeName")) if pod is not None else ""
            key = (node or f"host {suspect.host}", suspect.rank, suspect.device)
            found.setdefault(key, SuspectedNode(
                node=node,
                pod=read.text(read.dig(pod, "metadata", "name")) if pod is not None else "",
                rank=suspect.rank,
                node_rank=suspect.node_rank,
                gpu=" ".join(part for part in (suspect.device, suspect.gpu_uuid) if part),
                reason=suspect.reason,
                reported_by=read.text(read.dig(reporter, "metadata", "name")),
            ))  # fmt: skip
    return sorted(found.values(), key=lambda s: (s.node_rank, s.rank, s.node))


def _hosts(pod: Any) -> set[str]:
    """The host names a pod's processes see: its spec.hostname (JobSet's pods), else its name."""
    return {name for name in (read.text(read.dig(pod, "spec", "hostname")),
                              read.text(read.dig(pod, "metadata", "name"))) if name}  # fmt: skip


def milestones(job: Any, pods: Sequence[Any], workloads: Sequence[Any] = ()) -> dict[str, str]:
    """When the job was created, admitted by its queue (its Kueue Workload's Admitted=True condition) and had
    every pod ready (the latest Ready=True among its current pods: after a whole-job restart, the new
    pods'), RFC 3339; a step not taken yet (or not known) is left out. Where a job's time went before the
    trainer ran: the goodput record's start."""
    found = {"created": read.text(read.dig(job, "metadata", "creationTimestamp"))}
    for workload in workloads:
        for condition in read.conditions(workload) or []:
            if condition.get("type") == "Admitted" and condition.get("status") == "True":
                found["admitted"] = read.text(condition.get("lastTransitionTime"))
    ready = [
        read.text(c.get("lastTransitionTime"))
        for pod in pods
        for c in read.conditions(pod) or []
        if c.get("type") == "Ready" and c.get("status") == "True"
    ]
    times = [t for t in map(read.parse_time, ready) if t is not None]
    if pods and len(times) == len(pods):
        found["pods_ready"] = max(times).isoformat().replace("+00:00", "Z")
    return {key: value for key, value in found.items() if read.parse_time(value) is not None}


def journal_fields(state: JobStatus, files: dict[str, str]) -> dict[str, Any]:
    """The job's goodput, hang verdict and first step (JobStatus's goodput, goodput_note, hang, milestones)
    from the files of its journal in output.url (`files`: hang.json and goodput/*, by their path there); the
    accounting starts at the job's creation, its queue's admission from the Workload."""
    import json

    from orchestrator import goodput, outputs

    journal = {name.removeprefix(f"{outputs.GOODPUT}/"): text for name, text in files.items()}
    _, attempts = goodput.read_records(journal)

    def unix(stamp: str | None) -> float | None:
        parsed = read.parse_time(stamp)
        return parsed.timestamp() if parsed is not None else None

    result = goodput.account(attempts, job_started=unix(state.milestones.get("created")),
                             admitted=unix(state.milestones.get("admitted")))  # fmt: skip
    hang = None
    if outputs.HANG in files:
        try:
            hang = json.loads(files[outputs.HANG])
        except ValueError:
            hang = None
    reached = dict(state.milestones)
    firsts = [a.kept[0]["at"] for a in attempts if a.kept]
    if firsts:
        reached["first_step"] = _stamp(min(firsts))
    return {
        "goodput": result.to_dict() if result is not None else None,
        "goodput_note": ""
        if result is not None
        else f"no attempt has written to {state.output_url}/goodput/ yet",
        "hang": hang if isinstance(hang, dict) and isinstance(hang.get("line"), str) else None,
        "milestones": reached,
    }


def _stamp(unix: float) -> str:
    return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


# --- why a job waits: its queue (Kueue) or gang scheduler (Volcano) ----------------------------------------

KUEUE_CONDITIONS = (
    "QuotaReserved",
    "Admitted",
    "Evicted",
    "Preempted",
)  # apis/kueue/v1beta2/workload_types.go


def kueue_waiting(queue: str, workloads: Sequence[Any], local_queue: Any) -> dict[str, Any]:
    """What Kueue says about a job in LocalQueue `queue`: its Workload's conditions (QuotaReserved=False with
    the scheduler's message, e.g. "couldn't assign flavors to pod set node: insufficient unused quota for
    nvidia.com/gpu in flavor a100, 8 more needed"), whether it is admitted, its ClusterQueue once quota is
    reserved, and how many workloads wait in the LocalQueue (status.pendingWorkloads)."""
    workload = next((w for w in workloads if isinstance(w, dict)), {})
    conditions = [read.condition_summary(c) for c in read.objects(read.dig(workload, "status", "conditions"))]
    admitted = any(c["type"] == "Admitted" and c["status"] == "True" for c in conditions)
    pending = read.dig(local_queue, "status", "pendingWorkloads")
    return {
        "scheduler": "Kueue",
        "queue": queue,
        "workload": read.text(read.dig(workload, "metadata", "name")),
        "admitted": admitted,
        "cluster_queue": read.text(read.dig(workload, "status", "admission", "clusterQueue")),
        "pending_in_queue": read.to_int(pending) if pending is not None else None,
        "conditions": [c for c in conditions if c["type"] in KUEUE_CONDITIONS],
    }


def podgroup_waiting(podgroup: Any) -> dict[str, Any]:
    """What Volcano says about a job's PodGroup: its phase (Pending, Inqueue, Running) and conditions, e.g.
    Unschedulable=True NotEnoughResources "2/4 tasks in gang unschedulable: pod group is not ready, 2
    Pending, 4 minAvailable" (volcano pkg/scheduler/cache/cache.go RecordJobStatusEvent)."""
    return {
        "scheduler": "Volcano",
        "podgroup": read.text(read.dig(podgroup, "metadata", "name")),
        "queue": read.text(read.dig(podgroup, "spec", "queue")),
        "phase": read.text(read.dig(podgroup, "status", "phase")),
        "conditions": [
            read.condition_summary(c) for c in read.objects(read.dig(podgroup, "status", "conditions"))
        ],
    }


# --- pods and events ---------------------------------------------------------------------------------------


def pod_summary(api: JobAPI, pod: Any) -> PodSummary:
    container = read.container_status(pod, api.container)
    shown = read.text(read.dig(pod, "status", "phase")) or PENDING
    waiting = read.text(read.dig(container, "state", "waiting", "reason"))
    if read.dig(pod, "metadata", "deletionTimestamp"):
        shown = "Terminating"
    elif waiting and waiting != "ContainerCreating":
        shown = waiting  # CrashLoopBackOff, ImagePullBackOff, ...: more useful than "Pending"
    # The container's own end when it has ended (a Failed pod that is not restarted: OOMKilled is why), else
    # the end before its current run (a restarted container).
    terminated = read.dig(container, "state", "terminated") or read.dig(container, "lastState", "terminated")
    last = ""
    if isinstance(terminated, dict) and terminated:
        code = terminated.get("exitCode")
        code_text = str(code) if isinstance(code, int) and not isinstance(code, bool) else "?"
        last = f"{read.text(terminated.get('reason')) or 'Terminated'} (exit {code_text})"
    role, index = api.pod_role(pod)
    return PodSummary(
        name=read.text(read.dig(pod, "metadata", "name")),
        role=role,
        index=index,
        phase=shown,
        node=read.text(read.dig(pod, "spec", "nodeName")),
        restarts=read.restart_count(pod, api.container),
        last_termination=last,
    )


def pod_order(api: JobAPI, pod: PodSummary) -> tuple[int, int, str]:
    """The order pods are listed in: the API's display order (a master or launcher first, then by replica
    index), then by name. Not rank order (`orch logs --rank` asks `api.node_rank`)."""
    return (*api.display_order(pod.role, pod.index), pod.name)


def warning_events(events: Sequence[Any]) -> list[dict[str, Any]]:
    """Warning events, oldest first (the last ones are the most recent)."""
    warnings = [e for e in events if isinstance(e, dict) and e.get("type") == "Warning"]
    return sorted(warnings, key=lambda e: read.text(e.get("lastTimestamp")) or read.text(e.get("eventTime")))


def event_summary(event: dict[str, Any]) -> dict[str, str]:
    involved = f"{read.text(read.dig(event, 'involvedObject', 'kind'))}/{read.text(read.dig(event, 'involvedObject', 'name'))}"
    return {
        "time": read.text(event.get("lastTimestamp")) or read.text(event.get("eventTime")),
        "object": involved,
        "reason": read.text(event.get("reason")),
        "message": read.text(event.get("message")),
    }


# --- `orch list` -------------------------------------------------------------------------------------------


def list_row(api: JobAPI, job: Any, now: datetime.datetime) -> dict[str, Any]:
    nodes, gpus = api.nodes_and_gpus(job)
    condition = api.phase_condition(job)
    created = read.text(read.dig(job, "metadata", "creationTimestamp"))
    return {
        "name": read.text(read.dig(job, "metadata", "name")),
        "namespace": read.text(read.dig(job, "metadata", "namespace")),
        "kind": api.resource.kind,
        "phase": api.phase(job),
        "age": age(created, now),
        "nodes": nodes,
        "gpus_per_node": gpus,
        "reason": read.text(condition.get("reason")),
        "created": created,
    }


def age(timestamp: str, now: datetime.datetime) -> str:
    """kubectl-style age: 45s, 12m, 3h, 5d. "" when the timestamp is missing or unreadable."""
    when = read.parse_time(timestamp)
    if when is None:
        return ""
    seconds = max(0, int((now - when).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
