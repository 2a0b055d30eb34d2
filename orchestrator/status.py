"""What a training job and its pods say about a run, as plain data. Pure functions: no I/O, no kubernetes.

`orch status`, `orch list`, `orch logs` and `orch wait` read the objects `orchestrator.cluster` fetched through
these. What differs between job APIs (which conditions mean what, which labels name a pod's role) comes from
the job's `JobAPI` (orchestrator/cluster/apis/); everything here is the same for all of them. The phase is
orch's own word, the same on every API: Pending, Created, Running, Restarting, Suspended, Succeeded, Failed.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.cluster.apis import JobAPI

PENDING = "Pending"  # no condition is True yet: the controller has not seen the job
FINISHED = frozenset({"Failed", "Succeeded"})

GPU_RESOURCE = "nvidia.com/gpu"


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

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def phase_by_precedence(job: dict[str, Any], precedence: Sequence[str]) -> str:
    """The first of `precedence` with a condition whose status is "True"; Pending when none is."""
    true_types = {c.get("type") for c in _conditions(job) if c.get("status") == "True"}
    return next((p for p in precedence if p in true_types), PENDING)


def true_condition(job: dict[str, Any], ctype: str) -> dict[str, Any]:
    """The last condition of type `ctype` whose status is "True"; {} when there is none."""
    matches = [c for c in _conditions(job) if c.get("type") == ctype and c.get("status") == "True"]
    return matches[-1] if matches else {}


def replica_counts(counts: dict[str, Any]) -> dict[str, int]:
    return {key: int(counts.get(key) or 0) for key in ("active", "succeeded", "failed")}


def job_status(
    api: JobAPI,
    job: dict[str, Any],
    pods: Sequence[dict[str, Any]] = (),
    events: Sequence[dict[str, Any]] = (),
) -> JobStatus:
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    condition = api.phase_condition(job)
    return JobStatus(
        name=meta.get("name", ""),
        namespace=meta.get("namespace", ""),
        kind=api.resource.kind,
        phase=api.phase(job),
        reason=condition.get("reason", ""),
        message=condition.get("message", ""),
        replicas={role: ReplicaStatus(**counts) for role, counts in api.replicas(job).items()},
        created=meta.get("creationTimestamp", ""),
        start_time=status.get("startTime", ""),
        completion_time=status.get("completionTime", ""),
        restarts=api.restarts(job, list(pods)),
        pods=sorted((pod_summary(api, p) for p in pods), key=pod_order),
        events=[event_summary(e) for e in warning_events(events)],
    )


def container_status(pod: dict[str, Any], container: str) -> dict[str, Any]:
    """The status of the pod's container named `container`; {} before the kubelet reports it."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((c for c in statuses if c.get("name") == container), {})


def pod_summary(api: JobAPI, pod: dict[str, Any]) -> PodSummary:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    container = container_status(pod, api.container)
    shown = status.get("phase") or PENDING
    waiting = (container.get("state") or {}).get("waiting") or {}
    if meta.get("deletionTimestamp"):
        shown = "Terminating"
    elif waiting.get("reason") and waiting["reason"] != "ContainerCreating":
        shown = waiting["reason"]  # CrashLoopBackOff, ImagePullBackOff, ...: more useful than "Pending"
    terminated = (container.get("lastState") or {}).get("terminated") or {}
    last = ""
    if terminated:
        last = f"{terminated.get('reason') or 'Terminated'} (exit {terminated.get('exitCode', '?')})"
    role, index = api.pod_role(pod)
    return PodSummary(
        name=meta.get("name", ""),
        role=role,
        index=index,
        phase=shown,
        node=spec.get("nodeName") or "",
        restarts=restart_count(pod, api.container),
        last_termination=last,
    )


def pod_order(pod: PodSummary) -> tuple[int, int, str]:
    """Master first, then workers by index: the order ranks are numbered in."""
    return (0 if pod.role == "master" else 1, pod.index, pod.name)


def container_started(pod: dict[str, Any], container: str) -> bool:
    """Whether the container has (or had) a log to read: running or terminated, now or before."""
    found = container_status(pod, container)
    state, last = found.get("state") or {}, found.get("lastState") or {}
    return bool(state.get("running") or state.get("terminated") or last.get("terminated"))


def restart_count(pod: dict[str, Any], container: str) -> int:
    return int(container_status(pod, container).get("restartCount") or 0)


def container_running(pod: dict[str, Any], container: str) -> bool:
    return bool((container_status(pod, container).get("state") or {}).get("running"))


def warning_events(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Warning events, oldest first (the last ones are the most recent)."""
    warnings = [e for e in events if e.get("type") == "Warning"]
    return sorted(warnings, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


def event_summary(event: dict[str, Any]) -> dict[str, str]:
    obj = event.get("involvedObject") or {}
    return {
        "time": event.get("lastTimestamp") or event.get("eventTime") or "",
        "object": f"{obj.get('kind', '')}/{obj.get('name', '')}",
        "reason": event.get("reason", ""),
        "message": event.get("message", ""),
    }


# --- `orch list` -------------------------------------------------------------------------------------------


def template_gpus(template: dict[str, Any] | None, container: str) -> int:
    """The GPUs a pod template's `container` asks for (its limit)."""
    for c in ((template or {}).get("spec") or {}).get("containers") or []:
        if c.get("name") == container:
            return to_int(((c.get("resources") or {}).get("limits") or {}).get(GPU_RESOURCE))
    return 0


def list_row(api: JobAPI, job: dict[str, Any], now: datetime.datetime) -> dict[str, Any]:
    meta = job.get("metadata") or {}
    nodes, gpus = api.nodes_and_gpus(job)
    condition = api.phase_condition(job)
    return {
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "kind": api.resource.kind,
        "phase": api.phase(job),
        "age": age(meta.get("creationTimestamp", ""), now),
        "nodes": nodes,
        "gpus_per_node": gpus,
        "reason": condition.get("reason", ""),
        "created": meta.get("creationTimestamp", ""),
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


def parse_time(timestamp: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None


# --- text tables -------------------------------------------------------------------------------------------


def table(rows: list[list[str]]) -> str:
    """Left-aligned columns separated by three spaces, like kubectl."""
    if not rows:
        return ""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
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
    return "\n".join(lines)


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


def _conditions(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list((job.get("status") or {}).get("conditions") or [])


def to_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
