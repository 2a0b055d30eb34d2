"""The cluster side of `orch doctor --cluster`: read-only probes through `Cluster`'s public methods, returning
plain data that orchestrator/doctor.py judges. Discovery, not CRD reads: most users may not read CRDs."""

from __future__ import annotations

from typing import Any

from orchestrator.cluster.apis import pytorchjob
from orchestrator.cluster.client import Cluster
from orchestrator.cluster.errors import ClusterError, Forbidden
from orchestrator.cluster.resources import PODMONITOR

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by NVIDIA GPU feature discovery


def gather(cluster: Cluster) -> dict[str, Any]:
    """What `orch doctor --cluster` needs to know, as plain data:

    server, version, namespace; pytorchjob_versions (kubeflow.org versions that serve pytorchjobs);
    monitoring_resources (monitoring.coreos.com/v1 resources); nodes ([{name, gpus, product}], or None
    with nodes_error when listing nodes is forbidden); can_create_pytorchjobs (True/False, or None with
    access_error) and access_reason.
    Raises ClusterError (ClusterUnreachable, ...) when the cluster cannot be reached at all.
    """
    facts: dict[str, Any] = {
        "server": cluster.server,
        "version": cluster.server_version().get("gitVersion"),
        "namespace": cluster.namespace,
    }
    # Training Operator v1 is the only API that serves kubeflow.org pytorchjobs (Trainer v2 has TrainJob).
    facts["pytorchjob_versions"] = ["v1"] if cluster.served(pytorchjob.RESOURCE) else []
    monitoring = cluster.api_resources(PODMONITOR.group, PODMONITOR.version) or []
    facts["monitoring_resources"] = sorted(name for name in monitoring if "/" not in name)
    try:
        facts["nodes"] = [
            {
                "name": n["metadata"]["name"],
                "gpus": int(((n.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, 0)),
                "product": (n["metadata"].get("labels") or {}).get(GPU_PRODUCT_LABEL),
            }
            for n in cluster.nodes()
        ]
    except Forbidden as e:
        facts["nodes"], facts["nodes_error"] = None, str(e)
    try:
        facts["can_create_pytorchjobs"], facts["access_reason"] = cluster.can_i("create", pytorchjob.RESOURCE)
    except ClusterError as e:
        facts["can_create_pytorchjobs"], facts["access_error"] = None, str(e)
    return facts
