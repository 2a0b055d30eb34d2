"""Queues, gangs and nodes, as every job API reads them from the spec: Kueue's queue and labels, which
scheduler gang-schedules the pods, Kueue's topology annotations, the nodes the pods keep off. Each API
module translates these into its own fields (PyTorchJob runPolicy.schedulingPolicy, TrainJob
podGroupPolicy); the node affinity goes into the one pod template (rendering/pod.py). Pure functions.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator import naming

if TYPE_CHECKING:
    from orchestrator.job.spec import JobSpec


def kueue_queue(spec: JobSpec) -> str | None:
    """The Kueue LocalQueue: scheduling.queue, unless Volcano schedules the job (then it is Volcano's queue)."""
    if spec.scheduling.scheduler == naming.SCHEDULER_VOLCANO:
        return None
    return spec.scheduling.queue


def gang_scheduler(spec: JobSpec) -> str | None:
    """ "volcano" or "coscheduling" when a PodGroup gang-schedules the pods, else None."""
    if not spec.gang:
        return None
    return {
        naming.SCHEDULER_VOLCANO: "volcano",
        naming.SCHEDULER_COSCHEDULING: "coscheduling",
    }.get(spec.scheduling.scheduler or "")


def kueue_labels(spec: JobSpec) -> dict[str, str]:
    """On the job object: Kueue creates one Workload for it and admits all its pods at once."""
    queue = kueue_queue(spec)
    if queue is None:
        return {}
    labels = {naming.LABEL_KUEUE_QUEUE: queue}
    if spec.scheduling.priority:
        labels[naming.LABEL_KUEUE_PRIORITY] = spec.scheduling.priority
    return labels


def topology_annotations(spec: JobSpec, name: str, *, group_pod_sets: bool) -> dict[str, str]:
    """Kueue topology-aware scheduling, on every pod template. A job of several PodSets (`group_pod_sets`:
    a PyTorchJob with a Master and Workers) gets one podset-group-name: Kueue places them in one domain."""
    topology = spec.scheduling.topology
    if topology is None or kueue_queue(spec) is None:
        return {}
    if topology.required:
        annotations = {naming.ANNOTATION_KUEUE_REQUIRED_TOPOLOGY: topology.required}
        if group_pod_sets:
            annotations[naming.ANNOTATION_KUEUE_PODSET_GROUP] = name
        return annotations
    return {naming.ANNOTATION_KUEUE_PREFERRED_TOPOLOGY: str(topology.preferred)}


def volcano_queue_annotation(spec: JobSpec) -> dict[str, str]:
    """On every pod template when Volcano schedules the job in a queue. A pod without a PodGroup of its own
    (one-pod jobs, `gang: false`) gets one from Volcano's podgroup controller, whose queue is this pod
    annotation, else "default" (volcano pkg/controllers/podgroup/pg_controller_handler.go); the queue of a
    gang's PodGroup comes from the job (schedulingPolicy / the runtime's template annotation)."""
    if spec.scheduling.scheduler != naming.SCHEDULER_VOLCANO or not spec.scheduling.queue:
        return {}
    return {naming.ANNOTATION_VOLCANO_QUEUE: spec.scheduling.queue}


def excluding_nodes(affinity: dict[str, Any] | None, nodes: Sequence[str]) -> dict[str, Any] | None:
    """`affinity` (a pod's, as the Kubernetes API spells it) with a required node affinity that keeps the
    pods off `nodes` (scheduling.exclude_nodes): `kubernetes.io/hostname NotIn nodes`. A node must match one
    of the required nodeSelectorTerms, and every expression of that term (k8s.io/api core/v1 types.go,
    NodeSelector), so the NotIn joins each term that has expressions or fields; without any, it is the one
    term. An empty term matches no node and stays so; preferred terms and pod (anti-)affinity are kept.
    Idempotent: a term that already holds this expression is left alone. `affinity` is not changed."""
    if not nodes:
        return affinity
    expression = {"key": naming.LABEL_HOSTNAME, "operator": "NotIn", "values": list(dict.fromkeys(nodes))}
    merged = copy.deepcopy(affinity) if affinity else {}
    node_affinity = merged.get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    joined = []
    for term in required.get("nodeSelectorTerms") or []:
        expressions = list(term.get("matchExpressions") or [])
        if (expressions or term.get("matchFields")) and expression not in expressions:
            term = {**term, "matchExpressions": [*expressions, expression]}
        joined.append(term)
    if not joined:
        joined = [{"matchExpressions": [expression]}]
    required = {**required, "nodeSelectorTerms": joined}
    merged["nodeAffinity"] = {**node_affinity, "requiredDuringSchedulingIgnoredDuringExecution": required}
    return merged
