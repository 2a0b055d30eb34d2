"""Reading the JSON of a Kubernetes object, whatever the server sent: every function here is total.

The objects come from a server, and any field may be missing, null or of another type. Fields are read only
through `dig`, `text`, `to_int` and `objects`, which turn anything malformed into "", 0 or nothing, so that
what reads a job, a pod or an event (orchestrator/apis/, orchestrator/status.py, orchestrator/cluster/)
prints what it can instead of a traceback (tests/cluster/test_status_total.py feeds them random mutations
of real objects). Pure functions: no I/O, no kubernetes.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from orchestrator import naming

INT64_MAX = 2**63 - 1


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


def parse_time(timestamp: Any) -> datetime.datetime | None:
    """An RFC 3339 time as an aware datetime (UTC when it names no zone); None if it is not one."""
    try:
        parsed = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except (ValueError, AttributeError, TypeError):
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=datetime.timezone.utc)


# --- conditions --------------------------------------------------------------------------------------------


def conditions(obj: Any) -> list[dict[str, Any]] | None:
    """The readable `status.conditions`; None when they are there but not a list (or `status` is not a
    mapping): a state nobody can read, which the job's phase calls Unknown."""
    status = dig(obj, "status")
    if status is not None and not isinstance(status, dict):
        return None
    found = dig(status, "conditions")
    if found is None:
        return []
    return objects(found) if isinstance(found, list) else None


def condition_summary(condition: dict[str, Any]) -> dict[str, str]:
    """A condition's type, status, reason and message, as strings."""
    return {key: text(condition.get(key)) for key in ("type", "status", "reason", "message")}


def true_condition(obj: Any, ctype: str) -> dict[str, str]:
    """The last condition of type `ctype` whose status is "True" (`condition_summary`); {} when there is
    none."""
    matches = [c for c in conditions(obj) or [] if c.get("type") == ctype and c.get("status") == "True"]
    return condition_summary(matches[-1]) if matches else {}


# --- pods and their containers -----------------------------------------------------------------------------


def container_status(pod: Any, container: str) -> dict[str, Any]:
    """The status of the pod's container named `container`; {} before the kubelet reports it."""
    statuses = objects(dig(pod, "status", "containerStatuses"))
    return next((c for c in statuses if c.get("name") == container), {})


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


def template_gpus(template: Any, container: str) -> int:
    """The GPUs a pod template's `container` asks for (its limit)."""
    for c in objects(dig(template, "spec", "containers")):
        if c.get("name") == container:
            return to_int(dig(c, "resources", "limits", naming.GPU_RESOURCE))
    return 0
