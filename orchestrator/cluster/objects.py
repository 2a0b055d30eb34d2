"""Submitting rendered objects: the job first, then the objects it owns; all of them or none.

All or none holds whatever ends a submit midway: an API error, Ctrl-C, SIGTERM (`signals_interrupt`), or a
bug. What was created is deleted again (newest first), including an object whose create was in flight when
the submit was interrupted, if the server has it. If the rollback itself fails, the message lists exactly
what was left and the kubectl command that removes it.

Every object of one submit carries the annotation `orch.dev/submission` with the same random id. A create
that the server stored but answered too late (a client timeout) is retried by the client and answered
"already exists": an object with our id is our own and the submit carries on; anything else is not taken
over.
"""

from __future__ import annotations

import contextlib
import copy
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator import naming
from orchestrator.apis import AUTO, JobAPI, all_apis, by_key
from orchestrator.cluster import jobs
from orchestrator.cluster.client import Cluster
from orchestrator.cluster.errors import (
    AlreadyExists,
    ClusterError,
    ClusterUnreachable,
    Interrupted,
    NotFound,
    OperatorNotInstalled,
    UnknownFields,
)
from orchestrator.cluster.session import poll_seconds
from orchestrator.kube.kinds import CONFIGMAP, PODMONITOR, Resource


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
        "uid": _uid(job) or "",
        "controller": True,
        "blockOwnerDeletion": block,
    }


@dataclass
class Submission:
    created: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)  # kubectl refs of what --replace deleted (or would)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)  # the orch.dev/submission annotation


class Signalled(BaseException):
    """SIGTERM/SIGHUP as an exception, the way Ctrl-C is KeyboardInterrupt: rollbacks and `finally` run."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within: SIGTERM and SIGHUP raise `Signalled` (only the main thread can install handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Signalled(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[list[int]]:
    """Within: SIGINT/SIGTERM/SIGHUP are noted, not acted on (a second Ctrl-C must not stop a rollback)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in signals}
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def job_api_of(objects: Sequence[dict[str, Any]]) -> tuple[JobAPI, dict[str, Any]]:
    """The one job among the rendered objects, and its API."""
    found = [(api, o) for o in objects for api in all_apis() if o.get("kind") == api.resource.kind]
    if len(found) != 1:
        kinds = " or ".join(api.resource.kind for api in all_apis())
        raise ClusterError(f"expected exactly one {kinds} to submit, got {len(found)}")
    return found[0]


def preflight(cluster: Cluster, api: JobAPI, name: str, *, replace: bool = False) -> None:
    """What `submit` would refuse, asked first: the job's API is served and no job of that name exists
    (unless `replace`). `orch submit --build` calls it before it builds and pushes a multi-GB image."""
    if not cluster.served(api.resource):
        raise OperatorNotInstalled(not_installed_message(api, cluster.server))
    if not replace and cluster.find(api.resource, name) is not None:
        raise AlreadyExists(_exists_message(name, cluster.namespace))


def _exists_message(name: str, namespace: str) -> str:
    return (
        f'job {name} already exists in namespace "{namespace}"; use --replace to delete '
        f"it and submit again, or `orch delete {name}` first"
    )


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

    existing = cluster.find(api.resource, name)
    if existing is not None:
        if not replace:
            raise AlreadyExists(_exists_message(name, cluster.namespace))
        if dry_run:  # the server checks the delete too; the creates below then meet the old objects
            cluster.delete(api.resource, name, propagation="Foreground", dry_run=True)
        else:
            with cluster.patiently():
                jobs.delete(cluster, api, name, wait=True, timeout=replace_timeout)
                _wait_gone(cluster, [(kinds[o["kind"]], o) for o in objects if kinds[o["kind"]] in api.before],
                           timeout=replace_timeout)  # fmt: skip
        result.deleted.append(api.resource.ref(name))
    replaced_uid = _uid(existing) if dry_run else None

    for obj in objects:
        obj["metadata"].setdefault("annotations", {})[naming.ANNOTATION_SUBMISSION] = result.id
    # ...and the job's own pod templates (a PyTorchJob's): orchestrator.launch keeps its exit-code start count
    # per submission.
    for template in api.pod_templates(job):
        metadata = template.setdefault("metadata", {})
        metadata.setdefault("annotations", {})[naming.ANNOTATION_SUBMISSION] = result.id
    # What the job refers to (a TrainJob's TrainingRuntime) must exist first; it is owned once the job exists.
    first = [o for o in objects if kinds[o["kind"]] in api.before]
    after = [o for o in objects if o is not job and o not in first]
    in_flight: tuple[Resource, str] | None = None  # sent, not answered (yet): the server may have it

    def create(obj: dict[str, Any]) -> dict[str, Any]:
        nonlocal in_flight
        in_flight = (kinds[obj["kind"]], obj["metadata"]["name"])
        created = _create(
            cluster, in_flight[0], obj, result, dry_run=dry_run, replaced_uid=replaced_uid,
            api=api if obj is job else None,
        )  # fmt: skip
        result.created.append(created)
        in_flight = None
        return created

    try:
        for obj in first:
            create(obj)
        created_job = create(job)
        owner = owner_reference(api, created_job)
        # Not blocking: Trainer < v2.3 keeps a finalizer on a runtime while a TrainJob refers to it, so a
        # foreground deletion of the TrainJob that waited for its runtime would wait forever.
        referred = owner_reference(api, created_job, block=False)
        for obj in first:
            if not dry_run:
                changes = {"metadata": {"ownerReferences": [referred]}}
                cluster.patch(kinds[obj["kind"]], obj["metadata"]["name"], changes)
        for obj in after:
            obj["metadata"]["ownerReferences"] = [owner]
            create(obj)
    except BaseException as e:
        if dry_run and isinstance(e, ClusterError):
            raise  # nothing was stored
        _roll_back(cluster, result, in_flight, e)
        raise
    return result


def choose_api(cluster: Cluster, wanted: str) -> tuple[JobAPI, str]:
    """The API a submit uses, and why: `wanted` itself, or for "auto" the one API discovery says is served
    (PyTorchJob when both are: the jobs orch already runs there keep their API)."""
    if wanted != AUTO:
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


def _create(
    cluster: Cluster,
    resource: Resource,
    obj: dict[str, Any],
    result: Submission,
    *,
    dry_run: bool,
    replaced_uid: str | None,
    api: JobAPI | None = None,
) -> dict[str, Any]:
    """Create `obj`; an "already exists" answer for an object of this very submission is success. `api`: the
    job's API when `obj` is the job (its webhooks' transient denials are retried, unknown fields explained)."""
    name = obj["metadata"]["name"]
    try:
        transient = api.transient_denial if api is not None else None
        answer = cluster.create(resource, obj, dry_run=dry_run, transient_denial=transient)
    except UnknownFields as e:
        explained = [line for line in map(api.unknown_field, e.fields) if line] if api is not None else []
        if not explained:
            raise
        raise UnknownFields("; ".join(explained), fields=e.fields) from e
    except AlreadyExists as e:
        found = cluster.find(resource, name)
        if found is not None and _annotation(found) == result.id:
            return _as_created(obj, found)  # our create was stored, its answer lost; the retry met it
        if dry_run and found is not None and replaced_uid and replaced_uid in (_uid(found), *_owners(found)):
            return obj  # validated; it would be created once the replaced job and what it owns are gone
        job = _job_label(obj)
        if api is not None or (found is not None and _annotation(found) and _job_label(found) == job):
            # the job, or what another submit of the same job created first (two at once: one wins)
            raise AlreadyExists(_exists_message(job or name, cluster.namespace)) from e
        raise AlreadyExists(
            f"{e} and was not created by this submit; remove it "
            f"({cluster.kubectl('delete', resource.ref(name))}) or choose another job name"
        ) from e
    return _as_created(obj, answer)


def _as_created(sent: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """What was sent, with the uid the server gave it (only that is read from the answer)."""
    uid = _uid(answer)
    return {**sent, "metadata": {**sent["metadata"], **({"uid": uid} if uid else {})}}


def _annotation(obj: dict[str, Any]) -> Any:
    annotations = (obj.get("metadata") or {}).get("annotations")
    return annotations.get(naming.ANNOTATION_SUBMISSION) if isinstance(annotations, dict) else None


def _job_label(obj: dict[str, Any]) -> str | None:
    labels = (obj.get("metadata") or {}).get("labels")
    job = labels.get(naming.LABEL_JOB) if isinstance(labels, dict) else None
    return job if isinstance(job, str) else None


def _uid(obj: dict[str, Any] | None) -> str | None:
    uid = ((obj or {}).get("metadata") or {}).get("uid")
    return uid if isinstance(uid, str) and uid else None


def _owners(obj: dict[str, Any]) -> list[str]:
    refs = (obj.get("metadata") or {}).get("ownerReferences")
    return (
        [r["uid"] for r in refs if isinstance(r, dict) and isinstance(r.get("uid"), str)]
        if isinstance(refs, list)
        else []
    )


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


def _roll_back(
    cluster: Cluster, result: Submission, in_flight: tuple[Resource, str] | None, cause: BaseException
) -> None:
    """Delete what this submit created (newest first), then raise `cause` (or `Interrupted`) saying so."""
    kinds = submittable()
    doomed = [(kinds[o["kind"]], o["metadata"]["name"]) for o in reversed(result.created)]
    undone: list[str] = []
    left: list[str] = []
    with _signals_deferred():
        cluster.renew_deadline()  # the cause may have been the deadline: the rollback gets its own
        answered = isinstance(cause, ClusterError) and not isinstance(cause, ClusterUnreachable)
        if in_flight is not None and not answered:  # sent, never answered: the server may have stored it
            try:
                found = cluster.find(*in_flight)
                if found is not None and _annotation(found) == result.id:
                    doomed.insert(0, in_flight)
            except ClusterError:
                doomed.insert(0, in_flight)  # cannot tell: try the delete (a 404 is fine)
        for resource, name in doomed:
            try:
                cluster.delete(resource, name)
                undone.append(resource.ref(name))
            except NotFound:
                if (resource, name) != in_flight:
                    undone.append(resource.ref(name))
            except ClusterError:
                left.append(resource.ref(name))
    notes = [f"rolled back: deleted {', '.join(undone)}"] if undone else []
    if left:
        them = "them" if len(left) > 1 else "it"
        notes.append(
            f"rollback FAILED: left {', '.join(left)} in namespace {cluster.namespace}; "
            f"remove {them} with: {cluster.kubectl('delete', *left)}"
        )
    note = "; ".join(notes) or "nothing was created"
    if isinstance(cause, ClusterError):
        if not notes:
            raise cause  # the first create failed: the error says all
        raise type(cause)(f"{cause} ({note})") from cause
    if isinstance(cause, KeyboardInterrupt):
        raise Interrupted(f"interrupted (SIGINT); {note}", signum=signal.SIGINT) from None
    if isinstance(cause, Signalled):
        raise Interrupted(f"interrupted ({cause}); {note}", signum=cause.signum) from None
    # a bug: its traceback follows; say first what the rollback did
    sys.stderr.write(f"orch: {note}\n")
