"""What a training job and its pods say about a run, as plain data. Pure functions: no I/O, no kubernetes.

`orch status`, `orch list`, `orch logs` and `orch wait` read the objects `orchestrator.cluster` fetched through
these. What differs between job APIs (which conditions mean what, which labels name a pod's role) comes from
the job's `JobAPI` (orchestrator/apis/); everything here is the same for all of them. The phase is
orch's own word, the same on every API: Pending, Created, Running, Restarting, Suspended, Succeeded, Failed,
and Unknown when the job's status cannot be read.

Every function here is total over JSON values: the objects come from a server, and any field may be
missing, null or of another type. Fields are read only through `dig`, `text`, `to_int` and `objects`,
which turn anything malformed into "", 0 or nothing; a malformed `status.conditions` makes the phase
Unknown. So `orch status/list/wait/logs` print what they can instead of a traceback (tests/cluster/
test_status_total.py feeds them random mutations of real objects).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator import naming
from orchestrator.redaction import shown
from orchestrator.rendering import tracking_record

if TYPE_CHECKING:
    from orchestrator.apis.base import JobAPI

PENDING = "Pending"  # no condition is True yet: the controller has not seen the job
UNKNOWN = "Unknown"  # the job's status is there but cannot be read (not a list of conditions)
FINISHED = frozenset({"Failed", "Succeeded"})
INT64_MAX = 2**63 - 1

GPU_RESOURCE = naming.GPU_RESOURCE


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
    last_termination: str  # e.g. "OOMKilled (exit 137)"; "" when the container never ended

    @property
    def label(self) -> str:
        """The `[master-0]` / `[worker-3]` prefix used by `orch logs`."""
        return f"{self.role}-{self.index}"


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

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def phase_by_precedence(job: Any, precedence: Sequence[str]) -> str:
    """The first of `precedence` with a condition whose status is "True"; Pending when none is,
    Unknown when the conditions cannot be read."""
    conditions = _conditions(job)
    if conditions is None:
        return UNKNOWN
    true_types = {text(c.get("type")) for c in conditions if c.get("status") == "True"}
    return next((p for p in precedence if p in true_types), PENDING)


def true_condition(job: Any, ctype: str) -> dict[str, Any]:
    """The last condition of type `ctype` whose status is "True" (its type, status, reason and message, as
    strings); {} when there is none."""
    matches = [c for c in _conditions(job) or [] if c.get("type") == ctype and c.get("status") == "True"]
    if not matches:
        return {}
    return {key: text(matches[-1].get(key)) for key in ("type", "status", "reason", "message")}


def replica_counts(counts: Any) -> dict[str, int]:
    return {key: to_int(dig(counts, key)) for key in ("active", "succeeded", "failed")}


def job_status(
    api: JobAPI,
    job: Any,
    pods: Sequence[Any] = (),
    events: Sequence[Any] = (),
    *,
    waiting: dict[str, Any] | None = None,
) -> JobStatus:
    condition = api.phase_condition(job, pods)
    return JobStatus(
        name=text(dig(job, "metadata", "name")),
        namespace=text(dig(job, "metadata", "namespace")),
        kind=api.resource.kind,
        phase=api.phase(job, pods),
        reason=text(condition.get("reason")),
        message=text(condition.get("message")),
        replicas={role: ReplicaStatus(**counts) for role, counts in api.replicas(job).items()},
        created=text(dig(job, "metadata", "creationTimestamp")),
        start_time=text(dig(job, "status", "startTime")),
        completion_time=text(dig(job, "status", "completionTime")),
        restarts=api.restarts(job, list(pods)),
        pods=sorted((pod_summary(api, p) for p in pods), key=lambda pod: pod_order(api, pod)),
        events=[event_summary(e) for e in warning_events(events)],
        tracking=tracking_record.describe(dig(job, "metadata", "annotations")),
        output_url=text(dig(job, "metadata", "annotations", naming.ANNOTATION_OUTPUT_URL)),
        waiting=waiting or {},
    )


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
    conditions = [condition_summary(c) for c in objects(dig(workload, "status", "conditions"))]
    admitted = any(c["type"] == "Admitted" and c["status"] == "True" for c in conditions)
    pending = dig(local_queue, "status", "pendingWorkloads")
    return {
        "scheduler": "Kueue",
        "queue": queue,
        "workload": text(dig(workload, "metadata", "name")),
        "admitted": admitted,
        "cluster_queue": text(dig(workload, "status", "admission", "clusterQueue")),
        "pending_in_queue": to_int(pending) if pending is not None else None,
        "conditions": [c for c in conditions if c["type"] in KUEUE_CONDITIONS],
    }


def podgroup_waiting(podgroup: Any) -> dict[str, Any]:
    """What Volcano says about a job's PodGroup: its phase (Pending, Inqueue, Running) and conditions, e.g.
    Unschedulable=True NotEnoughResources "2/4 tasks in gang unschedulable: pod group is not ready, 2
    Pending, 4 minAvailable" (volcano pkg/scheduler/cache/cache.go RecordJobStatusEvent)."""
    return {
        "scheduler": "Volcano",
        "podgroup": text(dig(podgroup, "metadata", "name")),
        "queue": text(dig(podgroup, "spec", "queue")),
        "phase": text(dig(podgroup, "status", "phase")),
        "conditions": [condition_summary(c) for c in objects(dig(podgroup, "status", "conditions"))],
    }


def condition_summary(condition: dict[str, Any]) -> dict[str, str]:
    return {key: text(condition.get(key)) for key in ("type", "status", "reason", "message")}


def format_waiting(waiting: dict[str, Any]) -> list[str]:
    """The "Queue:" lines of `orch status`."""
    if not waiting:
        return []
    if waiting["scheduler"] == "Kueue":
        where = f"Kueue LocalQueue {waiting['queue']}"
        if waiting["workload"]:
            where += f", Workload {waiting['workload']}: " + (
                "admitted" if waiting["admitted"] else "not admitted"
            )
            if waiting["cluster_queue"]:
                where += f" (ClusterQueue {waiting['cluster_queue']})"
        else:
            where += ": no Workload yet (is Kueue's integration for this kind enabled?)"
        if waiting["pending_in_queue"] is not None:
            where += f"; {waiting['pending_in_queue']} workload(s) pending in the queue"
    else:
        where = f"Volcano PodGroup {waiting['podgroup']}: {waiting['phase'] or 'no phase yet'}"
        if waiting["queue"]:
            where += f" (queue {waiting['queue']})"
    lines = [f"Queue:       {where}"]
    for c in waiting["conditions"]:
        because = f" {c['reason']}" if c["reason"] else ""
        lines.append(f"  {c['type']}={c['status']}{because}" + (f": {c['message']}" if c["message"] else ""))
    return lines


def container_status(pod: Any, container: str) -> dict[str, Any]:
    """The status of the pod's container named `container`; {} before the kubelet reports it."""
    statuses = objects(dig(pod, "status", "containerStatuses"))
    return next((c for c in statuses if c.get("name") == container), {})


def pod_summary(api: JobAPI, pod: Any) -> PodSummary:
    container = container_status(pod, api.container)
    shown = text(dig(pod, "status", "phase")) or PENDING
    waiting = text(dig(container, "state", "waiting", "reason"))
    if dig(pod, "metadata", "deletionTimestamp"):
        shown = "Terminating"
    elif waiting and waiting != "ContainerCreating":
        shown = waiting  # CrashLoopBackOff, ImagePullBackOff, ...: more useful than "Pending"
    terminated = dig(container, "lastState", "terminated")
    last = ""
    if isinstance(terminated, dict) and terminated:
        code = terminated.get("exitCode")
        code_text = str(code) if isinstance(code, int) and not isinstance(code, bool) else "?"
        last = f"{text(terminated.get('reason')) or 'Terminated'} (exit {code_text})"
    role, index = api.pod_role(pod)
    return PodSummary(
        name=text(dig(pod, "metadata", "name")),
        role=role,
        index=index,
        phase=shown,
        node=text(dig(pod, "spec", "nodeName")),
        restarts=restart_count(pod, api.container),
        last_termination=last,
    )


def pod_order(api: JobAPI, pod: PodSummary) -> tuple[int, int, str]:
    """The order pods are listed in: the API's display order (a master or launcher first, then by replica
    index), then by name. Not rank order (`orch logs --rank` asks `api.node_rank`)."""
    return (*api.display_order(pod.role, pod.index), pod.name)


def container_started(pod: Any, container: str) -> bool:
    """Whether the container has (or had) a log to read: running or terminated, now or before."""
    found = container_status(pod, container)
    return bool(
        dig(found, "state", "running")
        or dig(found, "state", "terminated")
        or dig(found, "lastState", "terminated")
    )


def restart_count(pod: Any, container: str) -> int:
    return to_int(container_status(pod, container).get("restartCount"))


def container_running(pod: Any, container: str) -> bool:
    return bool(dig(container_status(pod, container), "state", "running"))


def container_waiting_reason(pod: Any, container: str) -> str:
    """Why the container waits (CrashLoopBackOff, ImagePullBackOff, ...); "" when it does not."""
    return text(dig(container_status(pod, container), "state", "waiting", "reason"))


def warning_events(events: Sequence[Any]) -> list[dict[str, Any]]:
    """Warning events, oldest first (the last ones are the most recent)."""
    warnings = [e for e in events if isinstance(e, dict) and e.get("type") == "Warning"]
    return sorted(warnings, key=lambda e: text(e.get("lastTimestamp")) or text(e.get("eventTime")))


def event_summary(event: dict[str, Any]) -> dict[str, str]:
    return {
        "time": text(event.get("lastTimestamp")) or text(event.get("eventTime")),
        "object": f"{text(dig(event, 'involvedObject', 'kind'))}/{text(dig(event, 'involvedObject', 'name'))}",
        "reason": text(event.get("reason")),
        "message": text(event.get("message")),
    }


# --- `orch list` -------------------------------------------------------------------------------------------


def template_gpus(template: Any, container: str) -> int:
    """The GPUs a pod template's `container` asks for (its limit)."""
    for c in objects(dig(template, "spec", "containers")):
        if c.get("name") == container:
            return to_int(dig(c, "resources", "limits", GPU_RESOURCE))
    return 0


def list_row(api: JobAPI, job: Any, now: datetime.datetime) -> dict[str, Any]:
    nodes, gpus = api.nodes_and_gpus(job)
    condition = api.phase_condition(job)
    created = text(dig(job, "metadata", "creationTimestamp"))
    return {
        "name": text(dig(job, "metadata", "name")),
        "namespace": text(dig(job, "metadata", "namespace")),
        "kind": api.resource.kind,
        "phase": api.phase(job),
        "age": age(created, now),
        "nodes": nodes,
        "gpus_per_node": gpus,
        "reason": text(condition.get("reason")),
        "created": created,
    }


def age(timestamp: str, now: datetime.datetime) -> str:
    """kubectl-style age: 45s, 12m, 3h, 5d. "" when the timestamp is missing or unreadable."""
    when = parse_time(timestamp)
    if when is None:
        return ""
    seconds = max(0, int((now - when).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def parse_time(timestamp: Any) -> datetime.datetime | None:
    """An RFC 3339 time as an aware datetime (UTC when it names no zone); None if it is not one."""
    try:
        parsed = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except (ValueError, AttributeError, TypeError):
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=datetime.timezone.utc)


# --- text tables -------------------------------------------------------------------------------------------


def table(rows: list[list[str]]) -> str:
    """Left-aligned columns separated by three spaces, like kubectl."""
    if not rows:
        return ""
    rows = [[shown(str(cell)) for cell in row] for row in rows]  # a cell is one line, whatever it holds
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def format_status(status: JobStatus) -> str:
    lines = [
        f"Name:        {status.name}",
        f"Namespace:   {status.namespace}",
        f"Kind:        {status.kind}",
        f"Phase:       {status.phase}" + (f" ({status.reason})" if status.reason else ""),
    ]
    if status.message:
        lines.append(f"Message:     {status.message}")
    lines += [f"Started:     {status.start_time or '-'}", f"Completed:   {status.completion_time or '-'}"]
    lines.append(f"Restarts:    {status.restarts}")
    lines += format_waiting(status.waiting)
    lines += [f"Tracking:    {sink} {where}" for sink, where in status.tracking.items()]
    if status.output_url:
        lines.append(f"Output:      {status.output_url} (checkpoints, model.pt, summary.json)")
    if status.replicas:
        lines += ["", "Replicas:"]
        rows = [["ROLE", "ACTIVE", "SUCCEEDED", "FAILED"]]
        rows += [
            [role, str(r.active), str(r.succeeded), str(r.failed)] for role, r in status.replicas.items()
        ]
        lines += ["  " + line for line in table(rows).splitlines()]
    lines += ["", "Pods:"]
    if status.pods:
        rows = [["POD", "ROLE", "PHASE", "NODE", "RESTARTS", "LAST TERMINATION"]]
        rows += [
            [p.name, p.label, p.phase, p.node or "-", str(p.restarts), p.last_termination or "-"]
            for p in status.pods
        ]
        lines += ["  " + line for line in table(rows).splitlines()]
    else:
        lines.append("  (none yet)")
    if status.events:
        lines += ["", "Warning events:"]
        rows = [["TIME", "OBJECT", "REASON", "MESSAGE"]]
        rows += [[e["time"], e["object"], e["reason"], e["message"]] for e in status.events[-10:]]
        lines += ["  " + line for line in table(rows).splitlines()]
    # Each entry is one line: what the server or the job's free text holds cannot add lines (or colours).
    return "\n".join(shown(line) for line in lines)


def format_list(rows: list[dict[str, Any]], *, wide: bool = False, all_namespaces: bool = False) -> str:
    header = (["NAMESPACE"] if all_namespaces else []) + ["NAME", "KIND", "PHASE", "AGE", "NODES x GPUS"]
    if wide:
        header += ["REASON", "CREATED"]
    out = [header]
    for r in rows:
        line = ([r["namespace"]] if all_namespaces else []) + [
            r["name"],
            r["kind"],
            r["phase"],
            r["age"] or "-",
            f"{r['nodes']} x {r['gpus_per_node']}",
        ]
        if wide:
            line += [r["reason"] or "-", r["created"] or "-"]
        out.append(line)
    return table(out)


# --- reading JSON from a server: total accessors ---------------------------------------------------------


def dig(value: Any, *keys: str) -> Any:
    """`value[k1][k2]...` through mappings; None where a key is missing or a value is not a mapping."""
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def text(value: Any) -> str:
    """A string field: the string, else "" (a number or list where a name belongs is not shown)."""
    return value if isinstance(value, str) else ""


def to_int(value: Any) -> int:
    """A count: a whole number (or a string of digits) from 0 to int64's max, else 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, float):
        value = int(value) if math.isfinite(value) and value.is_integer() else 0
    elif isinstance(value, str):
        value = int(value) if value.isascii() and value.isdigit() and len(value) <= 19 else 0
    return value if isinstance(value, int) and 0 <= value <= INT64_MAX else 0


def objects(value: Any) -> list[dict[str, Any]]:
    """The mappings of a list field (other items skipped); [] if it is not a list."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _conditions(job: Any) -> list[dict[str, Any]] | None:
    """The readable conditions; None when `status.conditions` is there but not a list (the phase is Unknown)."""
    status = dig(job, "status")
    if status is not None and not isinstance(status, dict):
        return None
    conditions = dig(status, "conditions")
    if conditions is None:
        return []
    return objects(conditions) if isinstance(conditions, list) else None
