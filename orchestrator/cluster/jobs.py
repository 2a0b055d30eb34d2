"""Finding a job by name on whichever API serves it, and reading it: status, list, wait, delete."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator import naming, status
from orchestrator.apis import JobAPI, all_apis
from orchestrator.cluster.client import Cluster
from orchestrator.cluster.errors import ClusterError, Forbidden, NotFound, Unauthorized
from orchestrator.kube import read
from orchestrator.kube.kinds import (
    EVENT,
    KUEUE_LOCAL_QUEUES,
    KUEUE_WORKLOADS,
    POD,
    VOLCANO_PODGROUP,
    Resource,
)


@dataclass(frozen=True)
class Job:
    """A job object as the cluster returned it, with the API that reads it."""

    api: JobAPI
    obj: dict[str, Any]
    companions: list[str] = field(default_factory=list)  # what `delete_job` deleted beside it (kubectl refs)
    unchecked: list[str] = field(default_factory=list)  # kinds `delete_job` could not look through (why)

    @property
    def name(self) -> str:
        return read.text(read.dig(self.obj, "metadata", "name"))

    @property
    def namespace(self) -> str:
        return read.text(read.dig(self.obj, "metadata", "namespace"))

    @property
    def phase(self) -> str:
        return self.api.phase(self.obj)

    @property
    def condition(self) -> dict[str, Any]:
        return self.api.phase_condition(self.obj)

    @property
    def ref(self) -> str:
        """kubectl's name for it: pytorchjob.kubeflow.org/demo."""
        return self.api.resource.ref(self.name)


def locate(cluster: Cluster, name: str, apis: tuple[JobAPI, ...] | None = None) -> Job:
    """The job called `name`, asking each API in turn. A 404 means: not a job of that API, or the API is not
    served; a 403 may mean the same to a user whose Role covers only the other API (the API server checks
    access before it looks the resource up), so it is reported only if no API has the job."""
    apis = apis or all_apis()
    missing: NotFound | None = None
    forbidden: Forbidden | None = None
    for api in apis:
        try:
            return Job(api, cluster.get(api.resource, name))
        except NotFound as e:
            missing = missing or e
        except Unauthorized:
            raise
        except Forbidden as e:
            forbidden = forbidden or e
    if forbidden is not None:
        raise forbidden
    if len(apis) == 1 and missing is not None:
        raise missing
    kinds = " or ".join(str(api.resource) for api in apis)
    raise NotFound(f'job {name} not found in namespace "{cluster.namespace}" (no {kinds} of that name)')


def refresh(cluster: Cluster, job: Job) -> Job:
    return Job(job.api, cluster.get(job.api.resource, job.name))


def job_pods(cluster: Cluster, job: Job) -> list[dict[str, Any]]:
    return cluster.list(POD, selector=job.api.pod_selector(job.name))


def job_status(cluster: Cluster, name: str) -> status.JobStatus:
    job = locate(cluster, name)
    pods = job_pods(cluster, job)
    mine = job.api.related_names(job.obj, pods)
    events = [e for e in cluster.list(EVENT) if read.text(read.dig(e, "involvedObject", "name")) in mine]
    workloads = kueue_workloads(cluster, job)
    finished = job.api.phase(job.obj, pods) in status.FINISHED
    waiting = {} if finished else why_waiting(cluster, job, pods, workloads=workloads)
    return status.job_status(job.api, job.obj, pods, events, waiting=waiting, workloads=workloads or [])


def suspected_nodes(cluster: Cluster, name: str) -> list[status.SuspectedNode]:
    """What the hardware failures of job `name` point at, from its pods' termination messages (two
    requests: the job, its pods; `job_status` reads events and queues too)."""
    job = locate(cluster, name)
    return status.suspected_nodes(job.api, job.obj, job_pods(cluster, job))


def kueue_workloads(cluster: Cluster, job: Job) -> list[dict[str, Any]] | None:
    """The Kueue Workloads of a job with a queue label (found by the label kueue.x-k8s.io/job-uid Kueue puts on
    them, pkg/controller/constants); None when it has no queue, or the user may not read them."""
    if not read.text(read.dig(job.obj, "metadata", "labels", naming.LABEL_KUEUE_QUEUE)):
        return None
    uid = read.text(read.dig(job.obj, "metadata", "uid"))
    return _readable(
        lambda r: cluster.list(r, selector=f"{naming.LABEL_KUEUE_JOB_UID}={uid}"), KUEUE_WORKLOADS
    )


def why_waiting(
    cluster: Cluster, job: Job, pods: list[dict[str, Any]], *, workloads: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """What the job's queue or gang scheduler says about it: Kueue's Workload (`kueue_workloads`) and
    LocalQueue for a job with a queue label; Volcano's PodGroup (named like the job by the v1 operator and
    Trainer v2's volcano plugin) for a job whose pods Volcano schedules. {} when there is none, or the user
    may not read it."""
    queue = read.text(read.dig(job.obj, "metadata", "labels", naming.LABEL_KUEUE_QUEUE))
    if queue:
        local_queue = _readable(lambda r: [cluster.get(r, queue)], KUEUE_LOCAL_QUEUES) or [{}]
        return status.kueue_waiting(queue, workloads or [], local_queue[0])
    volcano_pods = any(read.dig(p, "spec", "schedulerName") == naming.SCHEDULER_VOLCANO for p in pods)
    if volcano_pods or _volcano_job(job):
        podgroup = _readable(lambda r: [cluster.get(r, job.name)], (VOLCANO_PODGROUP,))
        return status.podgroup_waiting(podgroup[0]) if podgroup else {}
    return {}


def _volcano_job(job: Job) -> bool:
    """A job whose own pod templates name Volcano (its pods may not exist yet)."""
    templates = job.api.pod_templates(job.obj)
    return any(read.dig(t, "spec", "schedulerName") == naming.SCHEDULER_VOLCANO for t in templates)


def _readable(
    fetch: Callable[[Resource], list[dict[str, Any]]], versions: tuple[Resource, ...]
) -> list[dict[str, Any]] | None:
    """The answer of the first of `versions` the cluster serves; None when none is served or the user may not
    read it (a Role without Kueue's or Volcano's kinds: the status is still shown)."""
    for resource in versions:
        try:
            return fetch(resource)
        except NotFound:
            continue
        except Forbidden:
            return None
    return None


def list_jobs(cluster: Cluster, *, all_namespaces: bool = False, selector: str | None = None) -> list[Job]:
    """orch's jobs (by its managed-by label) of every API the cluster serves, by namespace and name; only
    those `selector` (a label selector, `orch.dev/sweep=lr`) also selects, when given."""
    jobs, refused, answered = [], [], 0
    selected = naming.MANAGED_SELECTOR + (f",{selector}" if selector else "")
    for api in all_apis():
        try:
            found = cluster.list(api.resource, selector=selected, all_namespaces=all_namespaces)
        except NotFound:  # this API is not installed
            continue
        except Unauthorized:
            raise
        except Forbidden as e:  # not installed, or not granted: see locate()
            refused.append(e)
            continue
        jobs += [Job(api, obj) for obj in found]
        answered += 1
    if refused and not answered:  # no API answered: the refusal is the answer
        raise refused[0]
    return sorted(jobs, key=lambda j: (j.namespace, j.name, j.api.key))


def wait_for(
    cluster: Cluster,
    name: str,
    *,
    timeout: float | None = None,
    on_phase: Callable[[str], None] = lambda phase: None,
) -> Job | None:
    """Watch the job until it Succeeded or Failed; returns it, or None if `timeout` seconds passed first.

    One watch of the job (resumed from its resourceVersion, listed again on 410 Gone): the requests do not
    grow with the job's pods or with how long it runs (one every `WATCH_SECONDS`)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    seen = None
    job = locate(cluster, name)
    with cluster.patiently():
        for _, _, current in cluster.observe(job.api.resource, name=name, until=deadline):
            if name not in current:
                raise NotFound(f"job {name} was deleted")
            job = Job(job.api, current[name])
            if job.phase != seen:
                on_phase(job.phase)
                seen = job.phase
            if job.phase in status.FINISHED:
                return job
    return None


def delete_job(cluster: Cluster, name: str, *, wait: bool = False, timeout: float = 600) -> Job:
    """Delete the job; its pods and the objects submitted with it go too: those `orch submit` created through
    their ownerReferences (the garbage collector), those `orch render | kubectl apply` created (no
    ownerReferences) by their `orch.dev/job` label, here.

    With `wait`, deletion is Foreground (the job disappears only after its pods did) and this returns once
    it is gone, so a new job of the same name cannot meet the old pods.
    """
    job = locate(cluster, name)
    delete(cluster, job.api, name, wait=wait, timeout=timeout)
    delete_companions(cluster, job)
    return job


def delete_companions(cluster: Cluster, job: Job) -> None:
    """Delete the objects rendered with `job` that nothing else deletes: of the kinds its API renders beside
    it, those with the job's label (and orch's managed-by label) and the same `orch.dev/submission`
    annotation as the job (both absent after `kubectl apply`), that no ownerReference ties to the job (the
    garbage collector takes those). Another job's objects carry another label; a kind the cluster does not
    serve has none. Their kubectl refs go to `job.companions`; a kind the user may not list (a Role older than
    manifests/rbac.yaml's) to `job.unchecked`: the job itself is deleted by then, and what `orch submit`
    created goes with it anyway."""
    selector = f"{naming.job_selector(job.name)},{naming.MANAGED_SELECTOR}"
    submission = _submission(job.obj)
    uid = read.dig(job.obj, "metadata", "uid")
    for resource in job.api.owned:
        try:
            found = cluster.list(resource, selector=selector)
        except NotFound:  # not served (no Prometheus operator)
            continue
        except Unauthorized:
            raise
        except Forbidden as e:
            job.unchecked.append(f"{resource}: {e}")
            continue
        for obj in found:
            owners = read.objects(read.dig(obj, "metadata", "ownerReferences"))
            if _submission(obj) != submission or any(o.get("uid") == uid for o in owners):
                continue
            name = read.text(read.dig(obj, "metadata", "name"))
            try:
                cluster.delete(resource, name)
            except NotFound:
                continue  # gone meanwhile
            job.companions.append(resource.ref(name))


def _submission(obj: dict[str, Any]) -> str | None:
    value = read.dig(obj, "metadata", "annotations", naming.ANNOTATION_SUBMISSION)
    return value if isinstance(value, str) else None


def delete(cluster: Cluster, api: JobAPI, name: str, *, wait: bool = False, timeout: float = 600) -> None:
    cluster.delete(api.resource, name, propagation="Foreground" if wait else "Background")
    if not wait:
        return
    deadline = time.monotonic() + timeout
    with cluster.patiently():  # watched, not polled: the next change after the list says it is gone
        for _, _, current in cluster.observe(api.resource, name=name, until=deadline):
            if name not in current:
                return
    raise ClusterError(f"job {name} was still being deleted after {timeout:.0f}s")
