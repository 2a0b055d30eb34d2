"""What a PyTorchJob and its pods say about a run, as plain data. Pure functions: no I/O, no kubernetes.

`orch status`, `orch list` and `orch wait` read the objects `orchestrator.cluster` fetched through these.
The operator's conditions are a history, not a state: `kubectl get`'s `conditions[-1].type` may be a
condition whose status is "False" (Suspended=False after a resume, Running=False after success). So the
phase is the highest-precedence condition whose status is "True" (see `PHASE_PRECEDENCE`).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator import naming

# Highest first. Once Failed=True the operator stops updating conditions, so it wins over everything.
PHASE_PRECEDENCE = ("Failed", "Succeeded", "Suspended", "Restarting", "Running", "Created")
PENDING = "Pending"  # no condition is True yet: the operator has not seen the job
FINISHED = frozenset({"Failed", "Succeeded"})

CONTAINER = naming.CONTAINER_NAME  # the operator requires this name; its exit code decides the job
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
    phase: str
    reason: str
    message: str
    replicas: dict[str, ReplicaStatus]
    created: str
    start_time: str
    completion_time: str
    pods: list[PodSummary] = field(default_factory=list)
    events: list[dict[str, str]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def phase(job: dict[str, Any]) -> str:
    """The job's phase: the first of `PHASE_PRECEDENCE` with a condition whose status is "True"."""
    true_types = {c.get("type") for c in _conditions(job) if c.get("status") == "True"}
    return next((p for p in PHASE_PRECEDENCE if p in true_types), PENDING)


def phase_condition(job: dict[str, Any]) -> dict[str, Any]:
    """The True condition that decided the phase (its reason and message explain it); {} when Pending."""
    current = phase(job)
    matches = [c for c in _conditions(job) if c.get("type") == current and c.get("status") == "True"]
    return matches[-1] if matches else {}


def job_status(
    job: dict[str, Any], pods: Sequence[dict[str, Any]] = (), events: Sequence[dict[str, Any]] = ()
) -> JobStatus:
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    condition = phase_condition(job)
    replicas = {
        role: ReplicaStatus(
            active=int(counts.get("active") or 0),
            succeeded=int(counts.get("succeeded") or 0),
            failed=int(counts.get("failed") or 0),
        )
        for role, counts in sorted((status.get("replicaStatuses") or {}).items())
    }
    return JobStatus(
        name=meta.get("name", ""),
        namespace=meta.get("namespace", ""),
        phase=phase(job),
        reason=condition.get("reason", ""),
        message=condition.get("message", ""),
        replicas=replicas,
        created=meta.get("creationTimestamp", ""),
        start_time=status.get("startTime", ""),
        completion_time=status.get("completionTime", ""),
        pods=sorted((pod_summary(p) for p in pods), key=pod_order),
        events=[event_summary(e) for e in warning_events(events)],
    )


def pod_summary(pod: dict[str, Any]) -> PodSummary:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    container = next(
        (c for c in status.get("containerStatuses") or [] if c.get("name") == CONTAINER),
        {},
    )
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
    return PodSummary(
        name=meta.get("name", ""),
        role=labels.get(naming.LABEL_REPLICA_TYPE, "?"),
        index=_int(labels.get(naming.LABEL_REPLICA_INDEX)),
        phase=shown,
        node=spec.get("nodeName") or "",
        restarts=int(container.get("restartCount") or 0),
        last_termination=last,
    )


def pod_order(pod: PodSummary) -> tuple[int, int, str]:
    """Master first, then workers by index: the order ranks are numbered in."""
    return (0 if pod.role == "master" else 1, pod.index, pod.name)


def pod_label(pod: dict[str, Any]) -> str:
    return pod_summary(pod).label


def pod_finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def container_started(pod: dict[str, Any]) -> bool:
    """Whether the `pytorch` container has (or had) a log to read: running or terminated, now or before."""
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if c.get("name") == CONTAINER:
            state, last = c.get("state") or {}, c.get("lastState") or {}
            return bool(state.get("running") or state.get("terminated") or last.get("terminated"))
    return False


def restart_count(pod: dict[str, Any]) -> int:
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if c.get("name") == CONTAINER:
            return int(c.get("restartCount") or 0)
    return 0


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


def nodes_and_gpus(job: dict[str, Any]) -> tuple[int, int]:
    """(pods, GPUs per pod) from the job's spec: Master + Worker replicas, the `pytorch` container's GPUs."""
    replica_specs = (job.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    nodes = sum(int(r.get("replicas") or 0) for r in replica_specs.values())
    gpus = 0
    for replica in replica_specs.values():
        containers = ((replica.get("template") or {}).get("spec") or {}).get("containers") or []
        for c in containers:
            if c.get("name") == CONTAINER:
                limits = (c.get("resources") or {}).get("limits") or {}
                gpus = max(gpus, _int(limits.get(GPU_RESOURCE)))
    return nodes, gpus


def list_row(job: dict[str, Any], now: datetime.datetime) -> dict[str, Any]:
    meta = job.get("metadata") or {}
    nodes, gpus = nodes_and_gpus(job)
    condition = phase_condition(job)
    return {
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "phase": phase(job),
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
        f"Phase:       {status.phase}" + (f" ({status.reason})" if status.reason else ""),
    ]
    if status.message:
        lines.append(f"Message:     {status.message}")
    lines += [f"Started:     {status.start_time or '-'}", f"Completed:   {status.completion_time or '-'}"]
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
    header = (["NAMESPACE"] if all_namespaces else []) + ["NAME", "PHASE", "AGE", "NODES x GPUS"]
    if wide:
        header += ["REASON", "CREATED"]
    out = [header]
    for r in rows:
        line = ([r["namespace"]] if all_namespaces else []) + [
            r["name"],
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


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
