"""The cluster side of `orch doctor --cluster`: read-only probes through `Cluster`'s public methods, returning
plain data that orchestrator/doctor.py judges. Discovery, not CRD reads: most users may not read CRDs."""

from __future__ import annotations

from typing import Any

from orchestrator import naming, status
from orchestrator.apis import all_apis, trainjob
from orchestrator.cluster.client import Cluster
from orchestrator.cluster.errors import ClusterError, Forbidden
from orchestrator.resources import JOBSET, KUEUE_GROUP, PODMONITOR

GPU_RESOURCE = naming.GPU_RESOURCE
GPU_PRODUCT_LABEL = naming.GPU_PRODUCT_LABEL


def gather(cluster: Cluster) -> dict[str, Any]:
    """What `orch doctor --cluster` needs to know, as plain data:

    server, version, namespace; apis: {api key: {kind, group, versions (those serving the kind; [] if not
    served)}}; jobset_versions, kueue_versions (the groups' versions, [] if absent); cluster_runtimes (names of
    the ClusterTrainingRuntimes, or None with runtimes_error; only asked where TrainJob is served);
    trainer_level (the Trainer release the TrainJob CRD's schema matches, "v2.0".."v2.3", or None with
    trainer_level_error when the CRD cannot be read: it is cluster-scoped);
    monitoring_resources (monitoring.coreos.com/v1 resources); nodes ([{name, gpus, product}], or None with
    nodes_error when listing nodes is forbidden); access: {api key: {allowed, reason} or {error}} for each
    served API (the create right in this namespace).
    Raises ClusterError (ClusterUnreachable, ...) when the cluster cannot be reached at all.
    """
    groups = cluster.api_groups()
    facts: dict[str, Any] = {
        "server": cluster.server,
        "version": status.text(cluster.server_version().get("gitVersion")) or None,
        "namespace": cluster.namespace,
        "apis": {},
        "jobset_versions": groups.get(JOBSET.group, []),
        "kueue_versions": groups.get(KUEUE_GROUP, []),
        "access": {},
    }
    for api in all_apis():
        r = api.resource
        versions = [
            v for v in groups.get(r.group, []) if r.plural in (cluster.api_resources(r.group, v) or [])
        ]
        facts["apis"][api.key] = {"kind": r.kind, "group": r.group, "versions": versions}
        if not versions:
            continue
        try:
            allowed, reason = cluster.can_i("create", r)
            facts["access"][api.key] = {"allowed": allowed, "reason": reason}
        except ClusterError as e:
            facts["access"][api.key] = {"error": str(e)}
    if facts["apis"][trainjob.API.key]["versions"]:
        try:
            facts["trainer_level"] = trainjob.feature_level(cluster.crd(trainjob.CRD_NAME))
        except ClusterError as e:
            facts["trainer_level"], facts["trainer_level_error"] = None, str(e)
        try:
            runtimes = cluster.list(trainjob.CLUSTER_TRAINING_RUNTIME, all_namespaces=True)
            facts["cluster_runtimes"] = sorted(
                status.text(status.dig(r, "metadata", "name")) for r in runtimes
            )
        except ClusterError as e:
            facts["cluster_runtimes"], facts["runtimes_error"] = None, str(e)
    monitoring = cluster.api_resources(PODMONITOR.group, PODMONITOR.version) or []
    facts["monitoring_resources"] = sorted(name for name in monitoring if "/" not in name)
    try:
        facts["nodes"] = [
            {
                "name": status.text(status.dig(n, "metadata", "name")),
                "gpus": status.to_int(status.dig(n, "status", "allocatable", GPU_RESOURCE)),
                "product": status.text(status.dig(n, "metadata", "labels", GPU_PRODUCT_LABEL)) or None,
            }
            for n in cluster.nodes()
        ]
    except Forbidden as e:
        facts["nodes"], facts["nodes_error"] = None, str(e)
    return facts
