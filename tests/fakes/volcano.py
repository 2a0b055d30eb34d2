"""Plays Volcano's podgroup controller for one pod (nothing of Volcano runs here): which queue the pod is
scheduled from.

Read from volcano-sh/volcano pkg/controllers/podgroup/pg_controller_handler.go: a pod whose schedulerName is
volcano and that names no PodGroup (annotation `scheduling.k8s.io/group-name`, set by the operators that make
one) gets a PodGroup of its own, whose `spec.queue` is the pod's annotation `scheduling.volcano.sh/queue-name`
when present; the scheduler then puts a PodGroup without a queue in the queue "default".
"""

from __future__ import annotations

from typing import Any

GROUP_NAME = "scheduling.k8s.io/group-name"
QUEUE_NAME = "scheduling.volcano.sh/queue-name"
DEFAULT_QUEUE = "default"


def queue_of(pod_template: dict[str, Any], podgroup_queues: dict[str, str] | None = None) -> str:
    """The queue a pod made from `pod_template` waits in. `podgroup_queues`: the queues of the PodGroups an
    operator created, by name (a gang's)."""
    metadata = pod_template.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    assert (pod_template.get("spec") or {}).get("schedulerName") == "volcano", "not a pod Volcano schedules"
    if GROUP_NAME in annotations:
        return (podgroup_queues or {}).get(annotations[GROUP_NAME]) or DEFAULT_QUEUE
    return annotations.get(QUEUE_NAME) or DEFAULT_QUEUE
