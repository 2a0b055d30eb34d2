"""Submitting rendered objects: the job first, then the objects it owns; all of them or none."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.cluster import jobs
from orchestrator.cluster.apis import JobAPI, all_apis, by_key
from orchestrator.cluster.client import Cluster, poll_seconds
from orchestrator.cluster.errors import AlreadyExists, ClusterError, NotFound, OperatorNotInstalled
from orchestrator.cluster.resources import CONFIGMAP, PODMONITOR, Resource


def submittable() -> dict[str, Resource]:
    """kind -> resource of everything `orch render` may emit for some API."""
    kinds = {r.kind: r for r in (CONFIGMAP, PODMONITOR)}
    for api in all_apis():
        kinds.update({r.kind: r for r in (api.resource, *api.owned)})
    return kinds


def prepare(objects: Sequence[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """The rendered objects as they will be sent: copies, each in `namespace`. (`--dry-run=client` prints
    these; at submit time the other objects also get an ownerReference to the created job.)"""
    kinds = submittable()
    prepared = []
    for obj in objects:
        if obj.get("kind") not in kinds:
            raise ClusterError(f"orch cannot submit a {obj.get('kind')} (only {', '.join(kinds)})")
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {})["namespace"] = namespace
        prepared.append(obj)
    return prepared


def owner_reference(api: JobAPI, job: dict[str, Any], *, block: bool = True) -> dict[str, Any]:
    """Makes the garbage collector delete the objects submitted with the job together with it. `block`: a
    foreground deletion of the job waits for this object to be gone first."""
    return {
        "apiVersion": api.resource.api_version,
        "kind": api.resource.kind,
        "name": job["metadata"]["name"],
        "uid": job["metadata"].get("uid") or "",
        "controller": True,
        "blockOwnerDeletion": block,
    }


@dataclass
class Submission:
    created: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def job_api_of(objects: Sequence[dict[str, Any]]) -> tuple[JobAPI, dict[str, Any]]:
    """The one job among the rendered objects, and its API."""
    found = [(api, o) for o in objects for api in all_apis() if o.get("kind") == api.resource.kind]
    if len(found) != 1:
        kinds = " or ".join(api.resource.kind for api in all_apis())
        raise ClusterError(f"expected exactly one {kinds} to submit, got {len(found)}")
    return found[0]


def submit(
    cluster: Cluster,
    objects: Sequence[dict[str, Any]],
    *,
    replace: bool = False,
    dry_run: bool = False,
    warn: Callable[[str], None] = lambda message: None,
    replace_timeout: float = 600,
) -> Submission:
    """Create the job, then the other objects owned by it; all of them or none.

    Order: the job first, because its uid is what the ownerReferences name. The pods may start before
    their ConfigMap exists; the kubelet retries the mount, so they wait a moment instead of failing.
    `dry_run` asks the API server to validate everything without persisting it (dryRun=All).
    """
    objects = prepare(objects, cluster.namespace)
    api, job = job_api_of(objects)
    name = job["metadata"]["name"]
    kinds = submittable()

    if not cluster.served(api.resource):
        raise OperatorNotInstalled(not_installed_message(api, cluster.server))
    result = Submission()
    if any(o["kind"] == PODMONITOR.kind for o in objects) and not cluster.served(PODMONITOR):
        warn(
            f"the PodMonitor CRD ({PODMONITOR.api_version} {PODMONITOR.plural}) is not installed, so Prometheus "
            "will not scrape this job's metrics; skipping the PodMonitor (install the Prometheus operator, "
            "e.g. kube-prometheus-stack, to get them)"
        )
        result.skipped.append(f"{PODMONITOR.kind}/{name}")
        objects = [o for o in objects if o["kind"] != PODMONITOR.kind]

    if cluster.find(api.resource, name) is not None:
        if not replace:
            raise AlreadyExists(
                f'job {name} already exists in namespace "{cluster.namespace}"; use --replace to delete '
                f"it and submit again, or `orch delete {name}` first"
            )
        if not dry_run:
            jobs.delete(cluster, api, name, wait=True, timeout=replace_timeout)
            _wait_gone(cluster, [(kinds[o["kind"]], o) for o in objects if kinds[o["kind"]] in api.before],
                       timeout=replace_timeout)  # fmt: skip

    # What the job refers to (a TrainJob's TrainingRuntime) must exist first; it is owned once the job exists.
    first = [o for o in objects if kinds[o["kind"]] in api.before]
    after = [o for o in objects if o is not job and o not in first]
    try:
        for obj in first:
            result.created.append(cluster.create(kinds[obj["kind"]], obj, dry_run=dry_run))
        created_job = cluster.create(api.resource, job, dry_run=dry_run)
        result.created.append(created_job)
        owner = owner_reference(api, created_job if created_job.get("metadata") else job)
        # Not blocking: Trainer < v2.3 keeps a finalizer on a runtime while a TrainJob refers to it, so a
        # foreground deletion of the TrainJob that waited for its runtime would wait forever.
        referred = owner_reference(api, created_job if created_job.get("metadata") else job, block=False)
        for obj in first:
            if not dry_run:
                changes = {"metadata": {"ownerReferences": [referred]}}
                cluster.patch(kinds[obj["kind"]], obj["metadata"]["name"], changes)
        for obj in after:
            obj["metadata"]["ownerReferences"] = [owner]
            result.created.append(cluster.create(kinds[obj["kind"]], obj, dry_run=dry_run))
    except ClusterError as e:
        if dry_run or not result.created:
            raise
        _roll_back(cluster, result.created, e)
    return result


def choose_api(cluster: Cluster, wanted: str) -> tuple[JobAPI, str]:
    """The API a submit uses, and why: `wanted` itself, or for "auto" the one API discovery says is served
    (PyTorchJob when both are: the jobs orch already runs there keep their API)."""
    if wanted != "auto":
        return by_key(wanted), "as asked"
    served = [api for api in all_apis() if cluster.served(api.resource)]
    if not served:
        installs = "; or ".join(f"{api.operator}: {api.install}" for api in reversed(all_apis()))
        kinds = " nor ".join(f"{api.resource.kind} ({api.resource.api_version})" for api in all_apis())
        raise OperatorNotInstalled(f"{cluster.server} serves neither {kinds}. Install {installs}")
    if len(served) > 1:
        kinds = " and ".join(a.resource.kind for a in served)
        return served[
            0
        ], f"the cluster serves {kinds}; auto picks {served[0].resource.kind} (--api to choose)"
    return served[0], f"the cluster serves {served[0].resource.kind} only"


def not_installed_message(api: JobAPI, server: str) -> str:
    r = api.resource
    return (
        f"{api.operator} ({r.kind} CRD) is not installed in this cluster ({server} does not serve "
        f"{r.api_version} {r.plural}). Install it: {api.install}"
    )


def _wait_gone(cluster: Cluster, objects: list[tuple[Resource, dict[str, Any]]], *, timeout: float) -> None:
    """After a replaced job is gone, wait for the objects it referred to (not blocking its deletion)."""
    deadline = time.monotonic() + timeout
    for resource, obj in objects:
        while cluster.find(resource, obj["metadata"]["name"]) is not None:
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{resource} {obj['metadata']['name']} was still being deleted after {timeout:.0f}s"
                )
            time.sleep(poll_seconds())


def _roll_back(cluster: Cluster, created: list[dict[str, Any]], cause: ClusterError) -> None:
    """Delete what this submit created (newest first), then re-raise `cause` saying so."""
    kinds = submittable()
    undone, left = [], []
    for obj in reversed(created):
        resource, name = kinds[obj["kind"]], obj["metadata"]["name"]
        try:
            cluster.delete(resource, name)
            undone.append(f"{resource.kind.lower()}/{name}")
        except NotFound:
            undone.append(f"{resource.kind.lower()}/{name}")
        except ClusterError:
            left.append(f"{resource.kind.lower()}/{name}")
    note = f"rolled back: deleted {', '.join(undone)}" if undone else "nothing was created"
    if left:
        note += f"; could NOT delete {', '.join(left)}: delete by hand"
    raise type(cause)(f"{cause} ({note})") from cause
