"""The cluster side of `orch doctor --cluster`: read-only probes through `Cluster`'s public methods, returning
plain data that orchestrator/doctor.py judges. Discovery, not CRD reads: most users may not read CRDs.

A server that answers has been reached, whatever it refuses: a read it refuses (403: RBAC) or does not serve
(404) is a fact with the server's words (`refused`), and the other probes go on. Only no answer at all
(`ClusterUnreachable`) or rejected credentials (`Unauthorized`: every read would be) end the gathering."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from orchestrator import naming
from orchestrator.apis import JobAPI, all_apis
from orchestrator.cluster.client import Cluster
from orchestrator.cluster.errors import ClusterError, Forbidden, NotFound, Unauthorized
from orchestrator.cluster.failures import status_message
from orchestrator.kube import read
from orchestrator.kube.kinds import KUEUE_GROUP, PODMONITOR

T = TypeVar("T")
GPU_RESOURCE = naming.GPU_RESOURCE
GPU_PRODUCT_LABEL = naming.GPU_PRODUCT_LABEL


def gather(cluster: Cluster) -> dict[str, Any]:
    """What `orch doctor --cluster` needs to know, as plain data:

    server, version, namespace; apis: {api key: {kind, group, versions (those serving the kind; [] if not
    served), and for a served API setup: what its `setup_reads` found (see `_setup`)}}; kueue_versions (the
    group's versions, [] if absent); monitoring_resources (monitoring.coreos.com/v1 resources); nodes
    ([{name, gpus, product}], or None when they cannot be listed); access: {api key: {allowed, reason} or
    {error}} for each served API (the create right in this namespace); refused: {what: {status (403 or 404),
    said (the server's words), error (orch's line)}} for each of "version", "discovery" (the group list: the
    apis are then unknown, {}) and "nodes" that the server answered with a refusal.
    Raises ClusterError (ClusterUnreachable, Unauthorized, ...) when the cluster cannot be reached at all.
    """
    refused: dict[str, dict[str, Any]] = {}
    no_version: dict[str, Any] = {}
    no_groups: dict[str, list[str]] = {}
    version = _answered(refused, "version", cluster.server_version, no_version)
    groups = _answered(refused, "discovery", cluster.api_groups, no_groups)
    facts: dict[str, Any] = {
        "server": cluster.server,
        "version": read.text(version.get("gitVersion")) or None,
        "namespace": cluster.namespace,
        "apis": {},
        "kueue_versions": groups.get(KUEUE_GROUP, []),
        "access": {},
        "refused": refused,
    }
    if "discovery" in refused:
        facts["monitoring_resources"], facts["nodes"] = [], _nodes(cluster, refused)
        return facts
    for api in all_apis():
        r = api.resource
        versions = [
            v for v in groups.get(r.group, []) if r.plural in (cluster.api_resources(r.group, v) or [])
        ]
        facts["apis"][api.key] = {"kind": r.kind, "group": r.group, "versions": versions}
        if not versions:
            continue
        facts["apis"][api.key]["setup"] = _setup(cluster, api, groups)
        try:
            allowed, reason = cluster.can_i("create", r)
            facts["access"][api.key] = {"allowed": allowed, "reason": reason}
        except ClusterError as e:
            facts["access"][api.key] = {"error": str(e)}
    monitoring = cluster.api_resources(PODMONITOR.group, PODMONITOR.version) or []
    facts["monitoring_resources"] = sorted(name for name in monitoring if "/" not in name)
    facts["nodes"] = _nodes(cluster, refused)
    return facts


def _nodes(cluster: Cluster, refused: dict[str, dict[str, Any]]) -> list[dict[str, Any]] | None:
    listed = _answered(refused, "nodes", cluster.nodes, None)
    if listed is None:
        return None
    return [
        {
            "name": read.text(read.dig(n, "metadata", "name")),
            "gpus": read.to_int(read.dig(n, "status", "allocatable", GPU_RESOURCE)),
            "product": read.text(read.dig(n, "metadata", "labels", GPU_PRODUCT_LABEL)) or None,
        }
        for n in listed
    ]


def _answered(refused: dict[str, dict[str, Any]], what: str, ask: Callable[[], T], default: T) -> T:
    """`ask()`, or `default` when the server refused it (403, not 401) or does not serve it (404): noted in
    `refused[what]` with the server's own words."""
    try:
        return ask()
    except Unauthorized:
        raise
    except (Forbidden, NotFound) as e:
        status = 403 if isinstance(e, Forbidden) else 404
        said = status_message(e.__cause__) if e.__cause__ is not None else str(e)
        refused[what] = {"status": status, "said": said, "error": str(e)}
        return default


def _setup(cluster: Cluster, api: JobAPI, groups: dict[str, list[str]]) -> dict[str, Any]:
    """What `api.setup_reads` names: crd (the CRD, or None with crd_error: it is cluster-scoped, most users
    may not read it), lists ({kind: sorted names, or None with list_errors[kind]}), groups ({group: versions,
    [] if absent})."""
    reads = api.setup_reads
    found: dict[str, Any] = {"groups": {g: groups.get(g, []) for g in reads.groups}, "lists": {}}
    if reads.crd is not None:
        try:
            found["crd"] = cluster.crd(reads.crd)
        except ClusterError as e:
            found["crd"], found["crd_error"] = None, str(e)
    for resource in reads.cluster_lists:
        try:
            objects = cluster.list(resource, all_namespaces=True)
            found["lists"][resource.kind] = sorted(
                read.text(read.dig(o, "metadata", "name")) for o in objects
            )
        except ClusterError as e:
            found["lists"][resource.kind] = None
            found.setdefault("list_errors", {})[resource.kind] = str(e)
    return found
