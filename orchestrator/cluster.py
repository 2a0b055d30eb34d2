"""Everything orch says to a Kubernetes cluster, through the official `kubernetes` client.

This is the only module that imports `kubernetes`, and only inside functions: importing it costs ~0.4 s,
which `orch --help` and `orch render` must not pay. The client is injectable (`Cluster(api_client, ...)`),
so tests point it at an API emulator over real HTTP.

- Connection works like kubectl: `--kubeconfig`, else `$KUBECONFIG`, else `~/.kube/config`, else the
  in-cluster service account; `--context` picks a context; the namespace is `-n`, else the job's
  `namespace`, else the context's namespace, else `default`.
- Every call is retried a bounded number of times with exponential backoff on 429, 5xx and connection
  errors (`Retry-After` is honoured). Anything that still fails becomes a `ClusterError` (exit 1) whose
  message names the verb and resource, chained `from` the client's exception.
- Reads ask for the raw JSON (`_preload_content=False`) so every object stays a plain dict, the same shape
  `orch render` prints and `orchestrator.status` reads; no generated model classes in between.
"""

from __future__ import annotations

import copy
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator import naming, status
from orchestrator.errors import OrchError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

RBAC_HINT = "manifests/rbac.yaml has a Role with what orch needs; ask a cluster admin to bind it to you"
OPERATOR_DOCS = "https://www.kubeflow.org/docs/components/trainer/legacy-v1/"
OPERATOR_INSTALL = 'kubectl apply --server-side -k "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.4"'
DEFAULT_NAMESPACE = "default"
IN_CLUSTER_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
REQUEST_TIMEOUT = (10, 60)  # seconds (connect, read) for ordinary calls
FOLLOW_READ_TIMEOUT = 300  # seconds a followed log may stay silent before orch reconnects

# Tunables, from the environment so tests (and impatient users) can shorten them.
POLL_SECONDS_ENV = "ORCH_POLL_SECONDS"  # how often wait/logs -f/status re-read the job and its pods
RETRIES_ENV = "ORCH_API_RETRIES"  # retries of one API call on 429/5xx/connection errors
BACKOFF_ENV = "ORCH_API_BACKOFF_SECONDS"  # first retry delay; doubles each time, capped at MAX_BACKOFF
MAX_BACKOFF = 30.0


def poll_seconds() -> float:
    return float(os.environ.get(POLL_SECONDS_ENV, "2"))


# --- errors ------------------------------------------------------------------------------------------------


class ClusterError(OrchError):
    """The cluster refused or failed a request (exit 1)."""


class KubeconfigError(ClusterError):
    """No usable kubeconfig or context: nothing was sent (exit 2, like a usage error)."""

    exit_code = 2


class ClusterUnreachable(ClusterError):
    """The API server could not be reached (after retries)."""


class Forbidden(ClusterError):
    """401/403: the credentials were rejected or lack a permission."""


class NotFound(ClusterError):
    pass


class AlreadyExists(ClusterError):
    pass


class OperatorNotInstalled(ClusterError):
    """The API server does not serve kubeflow.org/v1 pytorchjobs."""


# --- what orch talks to ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core API
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:  # how kubectl and RBAC name it: pytorchjobs.kubeflow.org, configmaps
        return f"{self.plural}.{self.group}" if self.group else self.plural


CONFIGMAP = Resource("", "v1", "configmaps", "ConfigMap")
POD = Resource("", "v1", "pods", "Pod")
POD_LOG = Resource("", "v1", "pods/log", "Pod")
EVENT = Resource("", "v1", "events", "Event")
PYTORCHJOB = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
PODMONITOR = Resource("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor")
SUBMITTABLE = {r.kind: r for r in (CONFIGMAP, PYTORCHJOB, PODMONITOR)}


# --- connecting --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Which cluster and namespace to talk to, as the user chose them (kubectl's flags)."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None


def connect(target: Target, *, job_namespace: str | None = None) -> Cluster:
    """A `Cluster` for `target`: kubeconfig like kubectl, namespace -n > job's > context's > default."""
    from kubernetes import client, config

    path = _kubeconfig_path(target.kubeconfig)
    configuration = client.Configuration()
    if path is None:
        if target.context:
            raise KubeconfigError(f"--context {target.context} needs a kubeconfig, and none was found")
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as e:
            raise KubeconfigError(
                "no kubeconfig found (looked at --kubeconfig, $KUBECONFIG, ~/.kube/config) "
                "and not running inside a cluster"
            ) from e
        context_namespace = _read_file(IN_CLUSTER_NAMESPACE_FILE)
        where = "in-cluster service account"
    else:
        context_namespace, context_name = _context_namespace(path, target.context)
        try:
            config.load_kube_config(
                config_file=path,
                context=target.context,
                client_configuration=configuration,
                persist_config=False,
            )
        except (config.ConfigException, OSError, ValueError) as e:
            raise KubeconfigError(f"cannot use kubeconfig {path} (context {context_name}): {e}") from e
        where = f"context {context_name}"
    # orch retries itself (with backoff and a clear final message); urllib3's silent retries would stack.
    configuration.retries = 0
    namespace = target.namespace or job_namespace or context_namespace or DEFAULT_NAMESPACE
    return Cluster(client.ApiClient(configuration), namespace, server=f"{configuration.host} ({where})")


def resolve_namespace(target: Target, *, job_namespace: str | None = None) -> str:
    """The namespace `connect` would use, without contacting the cluster (for `--dry-run=client`)."""
    if target.namespace or job_namespace:
        return target.namespace or job_namespace or DEFAULT_NAMESPACE
    path = _kubeconfig_path(target.kubeconfig)
    if path is None:
        return _read_file(IN_CLUSTER_NAMESPACE_FILE) or DEFAULT_NAMESPACE
    return _context_namespace(path, target.context)[0] or DEFAULT_NAMESPACE


def _kubeconfig_path(explicit: str | None) -> str | None:
    """kubectl's order. $KUBECONFIG may list several files (merged); missing ones are skipped."""
    if explicit:
        if not os.path.exists(os.path.expanduser(explicit)):
            raise KubeconfigError(f"kubeconfig {explicit} does not exist")
        return os.path.expanduser(explicit)
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    existing = [os.path.expanduser(p) for p in listed if os.path.exists(os.path.expanduser(p))]
    if existing:
        return os.pathsep.join(existing)
    if listed:
        raise KubeconfigError(f"none of the files in $KUBECONFIG exist: {os.environ['KUBECONFIG']}")
    default = os.path.expanduser("~/.kube/config")
    return default if os.path.exists(default) else None


def _context_namespace(path: str, context: str | None) -> tuple[str | None, str]:
    from kubernetes import config

    try:
        contexts, current = config.list_kube_config_contexts(path)
    except (config.ConfigException, OSError, ValueError) as e:
        raise KubeconfigError(f"cannot read kubeconfig {path}: {e}") from e
    by_name = {c["name"]: c for c in contexts or []}
    name = context or (current or {}).get("name")
    if name not in by_name:
        available = ", ".join(sorted(by_name)) or "none"
        which = f"context {name!r} is" if context else "no current-context is"
        raise KubeconfigError(
            f"{which} not in kubeconfig {path} (contexts: {available}); pick one with --context"
        )
    return (by_name[name].get("context") or {}).get("namespace"), name


def _read_file(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


# --- the client --------------------------------------------------------------------------------------------


class Cluster:
    """One namespace of one cluster. Methods return plain dicts and raise `ClusterError`s."""

    def __init__(
        self,
        api_client: ApiClient,
        namespace: str = DEFAULT_NAMESPACE,
        *,
        server: str = "",
        retries: int | None = None,
        backoff: float | None = None,
    ) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.namespace = namespace
        self.server = server or api_client.configuration.host
        self.retries = int(os.environ.get(RETRIES_ENV, "5")) if retries is None else retries
        self.backoff = float(os.environ.get(BACKOFF_ENV, "0.5")) if backoff is None else backoff
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    # Each public method is one API call: `_call(verb, resource, name, fn, ...)` retries and translates.

    def served(self, resource: Resource) -> bool:
        """Whether API discovery lists `resource` (users often may not read CRDs; discovery is open)."""
        try:
            if resource.group:
                raw = self._call(
                    "get", resource, None, self.custom.get_api_resources, resource.group, resource.version
                )
            else:
                raw = self._call("get", resource, None, self.core.get_api_resources)
        except NotFound:
            return False
        return any(r.get("name") == resource.plural for r in _json(raw).get("resources") or [])

    def create(self, obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        resource = SUBMITTABLE[obj["kind"]]
        name = obj["metadata"]["name"]
        options = {"dry_run": "All"} if dry_run else {}
        if resource is CONFIGMAP:
            fn: Callable[..., Any] = self.core.create_namespaced_config_map
            raw = self._call("create", resource, name, fn, self.namespace, obj, **options)
        else:
            fn = self.custom.create_namespaced_custom_object
            args = (resource.group, resource.version, self.namespace, resource.plural, obj)
            raw = self._call("create", resource, name, fn, *args, **options)
        return _json(raw)

    def get(self, resource: Resource, name: str) -> dict[str, Any]:
        """One custom object (orch reads single objects of its CRDs only; pods come from `list`)."""
        args = (resource.group, resource.version, self.namespace, resource.plural, name)
        return _json(self._call("get", resource, name, self.custom.get_namespaced_custom_object, *args))

    def find(self, resource: Resource, name: str) -> dict[str, Any] | None:
        try:
            return self.get(resource, name)
        except NotFound:
            return None

    def list(
        self, resource: Resource, *, selector: str | None = None, all_namespaces: bool = False
    ) -> list[dict[str, Any]]:
        options = {"label_selector": selector} if selector else {}
        if resource is POD:
            raw = self._call("list", resource, None, self.core.list_namespaced_pod, self.namespace, **options)
        elif resource is EVENT:
            # Only warnings are shown; the field selector saves the transfer where the server supports it.
            fn = self.core.list_namespaced_event
            raw = self._call("list", resource, None, fn, self.namespace, field_selector="type=Warning")
        elif all_namespaces:
            fn = self.custom.list_cluster_custom_object
            raw = self._call(
                "list", resource, None, fn, resource.group, resource.version, resource.plural, **options
            )
        else:
            fn = self.custom.list_namespaced_custom_object
            args = (resource.group, resource.version, self.namespace, resource.plural)
            raw = self._call("list", resource, None, fn, *args, **options)
        return list(_json(raw).get("items") or [])

    def delete(self, resource: Resource, name: str, *, propagation: str = "Background") -> None:
        if resource is CONFIGMAP:
            fn: Callable[..., Any] = self.core.delete_namespaced_config_map
            self._call("delete", resource, name, fn, name, self.namespace, propagation_policy=propagation)
        else:
            fn = self.custom.delete_namespaced_custom_object
            args = (resource.group, resource.version, self.namespace, resource.plural, name)
            self._call("delete", resource, name, fn, *args, propagation_policy=propagation)

    def log_lines(
        self,
        pod: str,
        *,
        follow: bool = False,
        tail: int | None = None,
        since_seconds: int | None = None,
        timestamps: bool = False,
    ) -> Iterator[str]:
        """The `pytorch` container's log, line by line; with `follow`, until the container stops."""
        options: dict[str, Any] = {
            "container": naming.CONTAINER_NAME,
            "follow": follow,
            "timestamps": timestamps,
        }
        if tail is not None:
            options["tail_lines"] = tail
        if since_seconds is not None:
            options["since_seconds"] = since_seconds
        import urllib3

        # A followed stream may stay quiet for long: a generous read timeout, after which the caller
        # resumes (stream_logs does) instead of hanging forever on a dead connection.
        timeout = (REQUEST_TIMEOUT[0], FOLLOW_READ_TIMEOUT) if follow else REQUEST_TIMEOUT
        fn = self.core.read_namespaced_pod_log
        response = self._call(
            "get", POD_LOG, pod, fn, pod, self.namespace, _request_timeout=timeout, **options
        )
        try:
            yield from _lines(response)
        except urllib3.exceptions.HTTPError as e:
            if not follow:
                raise ClusterUnreachable(f"the log stream of pod {pod} broke off: {e}") from e
        finally:
            response.release_conn()

    def _call(
        self,
        verb: str,
        resource: Resource,
        name: str | None,
        fn: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """`fn(*args)` with bounded retries on 429/5xx/connection errors; failures become ClusterErrors."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        kwargs.setdefault("_preload_content", False)
        kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                return fn(*args, **kwargs)
            except ApiException as e:
                if last or not _retryable(e.status):
                    raise self._translate(e, verb, resource, name) from e
                delay = _retry_after(e) or self.backoff * 2**attempt
            except urllib3.exceptions.HTTPError as e:  # refused, reset, timed out, TLS...
                if last:
                    reason = getattr(e, "reason", None) or e
                    raise ClusterUnreachable(
                        f"cannot reach the Kubernetes API at {self.server} after {attempt + 1} attempts: {reason}"
                    ) from e
                delay = self.backoff * 2**attempt
            time.sleep(min(delay, MAX_BACKOFF))
        raise AssertionError("unreachable")  # the loop returns or raises

    def _translate(self, e: Any, verb: str, resource: Resource, name: str | None) -> ClusterError:
        what = f"{resource} {name}" if name else str(resource)
        where = f'in namespace "{self.namespace}"'
        said = _status_message(e)
        if e.status == 401:
            return Forbidden(
                f"unauthorized: the API server at {self.server} rejected orch's credentials "
                f"({verb} {what}): {said}. Check the kubeconfig user/token (is it expired?)"
            )
        if e.status == 403:
            return Forbidden(f"forbidden: you may not {verb} {what} {where} ({said}). {RBAC_HINT}")
        if e.status == 404:
            return NotFound(f"{what} not found {where}")
        if e.status == 409:
            return AlreadyExists(f"{what} already exists {where}")
        return ClusterError(f"{verb} {what} {where} failed: HTTP {e.status} {e.reason}: {said}")


def _retryable(status_code: int | None) -> bool:
    return status_code == 429 or (status_code is not None and 500 <= status_code <= 599)


def _retry_after(e: Any) -> float | None:
    try:
        return float((e.headers or {}).get("Retry-After"))
    except (TypeError, ValueError):
        return None


def _status_message(e: Any) -> str:
    """The API server's own explanation (a `Status` object's message), else the HTTP reason."""
    try:
        return json.loads(e.body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(e.reason or "")


def _json(response: Any) -> dict[str, Any]:
    data = response.data if hasattr(response, "data") else response
    return json.loads(data) if data else {}


def _lines(response: Any) -> Iterator[str]:
    """Lines from a streamed HTTP response as they arrive (the last one even without a newline)."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=True):
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            yield line.decode("utf-8", errors="replace").rstrip("\r")
    if buffer:
        yield buffer.decode("utf-8", errors="replace")


# --- submit ------------------------------------------------------------------------------------------------


def prepare(objects: Sequence[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """The rendered objects as they will be sent: copies, each in `namespace`. (`--dry-run=client` prints
    these; at submit time the ConfigMap and PodMonitor also get an ownerReference to the created job.)"""
    prepared = []
    for obj in objects:
        if obj.get("kind") not in SUBMITTABLE:
            raise ClusterError(f"orch cannot submit a {obj.get('kind')} (only {', '.join(SUBMITTABLE)})")
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {})["namespace"] = namespace
        prepared.append(obj)
    return prepared


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    """Makes the garbage collector delete the ConfigMap and PodMonitor together with the job."""
    return {
        "apiVersion": PYTORCHJOB.api_version,
        "kind": PYTORCHJOB.kind,
        "name": job["metadata"]["name"],
        "uid": job["metadata"].get("uid") or "",
        "controller": True,
        "blockOwnerDeletion": True,
    }


@dataclass
class Submission:
    created: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def submit(
    cluster: Cluster,
    objects: Sequence[dict[str, Any]],
    *,
    replace: bool = False,
    dry_run: bool = False,
    warn: Callable[[str], None] = lambda message: None,
    replace_timeout: float = 600,
) -> Submission:
    """Create the PyTorchJob, then the other objects owned by it; all of them or none.

    Order: the job first, because its uid is what the ownerReferences name. The pods may start before
    their ConfigMap exists; the kubelet retries the mount, so they wait a moment instead of failing.
    `dry_run` asks the API server to validate everything without persisting it (dryRun=All).
    """
    objects = prepare(objects, cluster.namespace)
    jobs = [o for o in objects if o["kind"] == PYTORCHJOB.kind]
    if len(jobs) != 1:
        raise ClusterError(f"expected exactly one PyTorchJob to submit, got {len(jobs)}")
    job = jobs[0]
    name = job["metadata"]["name"]

    if not cluster.served(PYTORCHJOB):
        raise OperatorNotInstalled(
            f"Kubeflow training operator (PyTorchJob CRD) is not installed in this cluster "
            f"({cluster.server} does not serve {PYTORCHJOB.api_version} {PYTORCHJOB.plural}). "
            f"Install it: {OPERATOR_INSTALL} (see {OPERATOR_DOCS})"
        )
    result = Submission()
    if any(o["kind"] == PODMONITOR.kind for o in objects) and not cluster.served(PODMONITOR):
        warn(
            f"the PodMonitor CRD ({PODMONITOR.api_version} {PODMONITOR.plural}) is not installed, so Prometheus "
            "will not scrape this job's metrics; skipping the PodMonitor (install the Prometheus operator, "
            "e.g. kube-prometheus-stack, to get them)"
        )
        result.skipped.append(f"{PODMONITOR.kind}/{name}")
        objects = [o for o in objects if o["kind"] != PODMONITOR.kind]

    if cluster.find(PYTORCHJOB, name) is not None:
        if not replace:
            raise AlreadyExists(
                f'job {name} already exists in namespace "{cluster.namespace}"; use --replace to delete '
                f"it and submit again, or `orch delete {name}` first"
            )
        if not dry_run:
            delete_job(cluster, name, wait=True, timeout=replace_timeout)

    created_job = cluster.create(job, dry_run=dry_run)
    result.created.append(created_job)
    owner = owner_reference(created_job if created_job.get("metadata") else job)
    try:
        for obj in objects:
            if obj is job:
                continue
            obj["metadata"]["ownerReferences"] = [owner]
            result.created.append(cluster.create(obj, dry_run=dry_run))
    except ClusterError as e:
        if dry_run:
            raise
        _roll_back(cluster, result.created, e)
    return result


def _roll_back(cluster: Cluster, created: list[dict[str, Any]], cause: ClusterError) -> None:
    """Delete what this submit created (newest first), then re-raise `cause` saying so."""
    undone, left = [], []
    for obj in reversed(created):
        resource, name = SUBMITTABLE[obj["kind"]], obj["metadata"]["name"]
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


# --- delete / wait / status --------------------------------------------------------------------------------


def delete_job(cluster: Cluster, name: str, *, wait: bool = False, timeout: float = 600) -> None:
    """Delete the job; its pods, ConfigMap and PodMonitor go with it (ownerReferences).

    With `wait`, deletion is Foreground (the job disappears only after its pods did) and this returns once
    it is gone, so a new job of the same name cannot meet the old pods.
    """
    cluster.delete(PYTORCHJOB, name, propagation="Foreground" if wait else "Background")
    if not wait:
        return
    deadline = time.monotonic() + timeout
    while cluster.find(PYTORCHJOB, name) is not None:
        if time.monotonic() > deadline:
            raise ClusterError(f"job {name} was still being deleted after {timeout:.0f}s")
        time.sleep(poll_seconds())


def wait_for(
    cluster: Cluster,
    name: str,
    *,
    timeout: float | None = None,
    on_phase: Callable[[str], None] = lambda phase: None,
) -> dict[str, Any] | None:
    """Poll the job until it Succeeded or Failed; returns it, or None if `timeout` seconds passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    seen = None
    while True:
        job = cluster.get(PYTORCHJOB, name)
        phase = status.phase(job)
        if phase != seen:
            on_phase(phase)
            seen = phase
        if phase in status.FINISHED:
            return job
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return None
        time.sleep(poll_seconds() if remaining is None else min(poll_seconds(), remaining))


def job_pods(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return cluster.list(POD, selector=f"{naming.LABEL_OPERATOR_JOB_NAME}={name}")


def job_status(cluster: Cluster, name: str) -> status.JobStatus:
    job = cluster.get(PYTORCHJOB, name)
    pods = job_pods(cluster, name)
    mine = {name} | {(p.get("metadata") or {}).get("name") for p in pods}
    events = [e for e in cluster.list(EVENT) if (e.get("involvedObject") or {}).get("name") in mine]
    return status.job_status(job, pods, events)


def list_jobs(cluster: Cluster, *, all_namespaces: bool = False) -> list[dict[str, Any]]:
    jobs = cluster.list(PYTORCHJOB, selector=naming.MANAGED_SELECTOR, all_namespaces=all_namespaces)
    return sorted(jobs, key=lambda j: (j["metadata"].get("namespace", ""), j["metadata"]["name"]))


# --- logs --------------------------------------------------------------------------------------------------


@dataclass
class _Reader:
    """One thread following one container instance (a pod uid + its restart count) of one pod."""

    key: tuple[str, int]
    done: threading.Event = field(default_factory=threading.Event)
    last_timestamp: str = ""
    error: ClusterError | None = None


def stream_logs(
    cluster: Cluster,
    name: str,
    *,
    emit: Callable[[str, str], None],
    notice: Callable[[str], None] = lambda message: None,
    follow: bool = False,
    rank: int | None = None,
    pod: str | None = None,
    tail: int | None = None,
    since_seconds: int | None = None,
    drain_seconds: float = 10.0,
) -> dict[str, Any] | None:
    """Every pod's `pytorch` log as `emit(label, line)`, label = "master-0"/"worker-3".

    Without `follow`: what each started container has logged so far, pod by pod in rank order.
    With `follow`: lines as they come, from a thread per container; every poll interval the pods are
    listed again to pick up pods that start late, restarted containers (new readers) and streams that
    ended while the container still runs (resumed after the last timestamp seen). Ends when the job has
    finished and every reader has drained (at most `drain_seconds` after the end). Returns the last job seen.
    """
    job = cluster.get(PYTORCHJOB, name)
    has_master = "Master" in ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {})

    def wanted(p: dict[str, Any]) -> bool:
        summary = status.pod_summary(p)
        if pod is not None:
            return summary.name == pod
        if rank is not None:
            node_rank = 0 if summary.role == "master" else summary.index + (1 if has_master else 0)
            return node_rank == rank
        return True

    def selected_pods() -> list[dict[str, Any]]:
        pods = [p for p in job_pods(cluster, name) if wanted(p)]
        return sorted(pods, key=lambda p: status.pod_order(status.pod_summary(p)))

    if not follow:
        pods = selected_pods()
        if not pods:
            notice(_no_pods_message(name, pod, rank))
        for p in pods:
            label = status.pod_label(p)
            if not status.container_started(p):
                notice(
                    f"[{label}] {p['metadata']['name']} has not started yet ({status.pod_summary(p).phase})"
                )
                continue
            for line in cluster.log_lines(p["metadata"]["name"], tail=tail, since_seconds=since_seconds):
                emit(label, line)
        return job

    lines: queue.Queue[tuple[str, str]] = queue.Queue()
    readers: dict[str, _Reader] = {}  # pod name -> its current (or last) reader
    waiting_noted: set[str] = set()
    finished_at: float | None = None
    first_round = True

    def start(p: dict[str, Any], key: tuple[str, int], resume_after: str = "") -> None:
        pod_name, label = p["metadata"]["name"], status.pod_label(p)
        # The first reader of a pod honours --tail/--since; a restarted container is read from its start.
        fresh = pod_name not in readers
        reader = _Reader(key=key, last_timestamp=resume_after)

        def run() -> None:
            try:
                options: dict[str, Any] = {"follow": True, "timestamps": True}
                if resume_after:
                    options["since_seconds"] = max(1, int(time.time() - _epoch(resume_after)) + 1)
                elif fresh and first_round:
                    options.update(tail=tail, since_seconds=since_seconds)
                for raw in cluster.log_lines(pod_name, **options):
                    stamp, _, text = raw.partition(" ")
                    if resume_after and _stamp_key(stamp) <= _stamp_key(resume_after):
                        continue  # already shown before the stream was resumed
                    reader.last_timestamp = stamp
                    lines.put((label, text))
            except ClusterError as e:
                reader.error = e  # e.g. the container is between restarts; the next round retries
            finally:
                reader.done.set()

        readers[pod_name] = reader
        threading.Thread(target=run, name=f"orch-logs-{pod_name}", daemon=True).start()

    def refresh() -> None:
        nonlocal job, finished_at, first_round
        job = cluster.get(PYTORCHJOB, name)
        if finished_at is None and status.phase(job) in status.FINISHED:
            finished_at = time.monotonic()
        pods = selected_pods()
        if not pods and first_round:
            notice(_no_pods_message(name, pod, rank) + "; waiting for them")
        for p in pods:
            pod_name, label = p["metadata"]["name"], status.pod_label(p)
            key = (p["metadata"].get("uid", ""), status.restart_count(p))
            current = readers.get(pod_name)
            if not status.container_started(p):
                if pod_name not in waiting_noted:
                    notice(f"[{label}] waiting for {pod_name} to start ({status.pod_summary(p).phase})")
                    waiting_noted.add(pod_name)
                continue
            if current is None:
                start(p, key)
            elif current.done.is_set():
                if current.key != key:
                    if key[0] == current.key[0]:
                        notice(f"[{label}] container restarted (restart {key[1]})")
                    start(p, key)  # a new container instance, or a recreated pod
                elif isinstance(current.error, Forbidden):
                    raise current.error  # retrying cannot help: say so instead of showing nothing
                elif current.error is not None or _running(p):
                    start(p, key, resume_after=current.last_timestamp)  # the stream broke; carry on
        first_round = False

    refresh()
    next_refresh = time.monotonic() + poll_seconds()
    while True:
        try:
            label, text = lines.get(timeout=max(0.0, min(0.2, next_refresh - time.monotonic())))
            emit(label, text)
            continue
        except queue.Empty:
            pass
        if finished_at is not None:
            drained = all(r.done.is_set() for r in readers.values()) and lines.empty()
            if drained or time.monotonic() - finished_at > drain_seconds:
                while not lines.empty():
                    emit(*lines.get_nowait())
                return job
        if time.monotonic() >= next_refresh:
            try:
                refresh()
            except NotFound:
                notice(f"job {name} was deleted")
                return None
            next_refresh = time.monotonic() + poll_seconds()


def _running(pod: dict[str, Any]) -> bool:
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if c.get("name") == naming.CONTAINER_NAME:
            return bool((c.get("state") or {}).get("running"))
    return False


def _stamp_key(timestamp: str) -> tuple[str, float]:
    """Sortable form of an RFC3339Nano log timestamp (Go trims trailing zeros, so strings do not sort)."""
    whole, _, fraction = timestamp.rstrip("Z").partition(".")
    return whole, float(f"0.{fraction or 0}")


def _epoch(timestamp: str) -> float:
    whole, fraction = _stamp_key(timestamp)
    parsed = status.parse_time(whole + "+00:00")
    return parsed.timestamp() + fraction if parsed else time.time()


def _no_pods_message(name: str, pod: str | None, rank: int | None) -> str:
    if pod is not None:
        return f"job {name} has no pod named {pod}"
    if rank is not None:
        return f"job {name} has no pod with rank {rank} (yet)"
    return f"job {name} has no pods yet"


# --- doctor ------------------------------------------------------------------------------------------------
# The cluster side of `orch doctor` (owned by the images/doctor work): read-only probes that return plain
# data; orchestrator/doctor.py judges it. Discovery, not CRD reads: most users may not read CRDs.

NODE = Resource("", "v1", "nodes", "Node")
SELF_SUBJECT_ACCESS_REVIEW = Resource(
    "authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview"
)
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by NVIDIA GPU feature discovery
MONITORING_GROUP, MONITORING_VERSION = "monitoring.coreos.com", "v1"


def doctor_probe(
    *, namespace: str | None = None, context: str | None = None, kubeconfig: str | None = None
) -> dict[str, Any]:
    """What `orch doctor --cluster` needs to know, as plain data:

    server, version, namespace; pytorchjob_versions (kubeflow.org versions that serve pytorchjobs);
    monitoring_resources (monitoring.coreos.com/v1 resources); nodes ([{name, gpus, product}], or None
    with nodes_error when listing nodes is forbidden); can_create_pytorchjobs (True/False, or None with
    access_error) and access_reason.
    Raises ClusterError (ClusterUnreachable, KubeconfigError...) when the cluster cannot be reached at all.
    """
    from kubernetes import client

    cluster = connect(Target(kubeconfig=kubeconfig, context=context, namespace=namespace))
    version_resource = Resource("", "", "version", "Version")
    version = _json(
        cluster._call("get", version_resource, None, client.VersionApi(cluster.api_client).get_code)
    )
    facts: dict[str, Any] = {
        "server": cluster.server,
        "version": version.get("gitVersion"),
        "namespace": cluster.namespace,
    }
    # Training Operator v1 is the only API that serves kubeflow.org pytorchjobs (Trainer v2 has TrainJob).
    facts["pytorchjob_versions"] = ["v1"] if cluster.served(PYTORCHJOB) else []
    try:
        raw = cluster._call(
            "get", PODMONITOR, None, cluster.custom.get_api_resources, MONITORING_GROUP, MONITORING_VERSION
        )
        facts["monitoring_resources"] = sorted(
            r["name"] for r in _json(raw).get("resources") or [] if "/" not in r["name"]
        )
    except NotFound:
        facts["monitoring_resources"] = []
    try:
        nodes = _json(cluster._call("list", NODE, None, cluster.core.list_node)).get("items") or []
        facts["nodes"] = [
            {
                "name": n["metadata"]["name"],
                "gpus": int(((n.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, 0)),
                "product": (n["metadata"].get("labels") or {}).get(GPU_PRODUCT_LABEL),
            }
            for n in nodes
        ]
    except Forbidden as e:
        facts["nodes"], facts["nodes_error"] = None, str(e)
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "group": PYTORCHJOB.group,
                "resource": PYTORCHJOB.plural,
                "verb": "create",
                "namespace": cluster.namespace,
            }
        },
    }
    authorization = client.AuthorizationV1Api(cluster.api_client)
    try:
        answer = (
            _json(
                cluster._call(
                    "create",
                    SELF_SUBJECT_ACCESS_REVIEW,
                    None,
                    authorization.create_self_subject_access_review,
                    review,
                )
            ).get("status")
            or {}
        )
        facts["can_create_pytorchjobs"] = bool(answer.get("allowed"))
        facts["access_reason"] = answer.get("reason") or ""
    except ClusterError as e:
        facts["can_create_pytorchjobs"], facts["access_error"] = None, str(e)
    return facts
