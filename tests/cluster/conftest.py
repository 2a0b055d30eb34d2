"""A Kubernetes API for the cluster tests: kmock's emulator over real HTTP on 127.0.0.1, talked to by the
unmodified official client (and kubectl). The test plays the training operator: it creates pods, patches
the job's status and writes container logs.

`RealisticK8s` closes the gaps of kmock 0.8 that orch would hit (see shared notes, offline-testing.md §1):
uid/resourceVersion/creationTimestamp stamping, 201 on create, List kinds and labelSelector, watch
timeouts, `/version/`. On top of that it emulates, because nothing here can run them:
- `dryRun=All` (validated, not stored), and injected API failures (`fail()`: a status before any effect);
- the kubelet's log endpoint (`follow`, `tailLines`, `sinceSeconds`, `timestamps`, container restarts);
- the garbage collector: deleting an object deletes the objects whose ownerReferences name its uid.
It touches kmock internals, hence the pin kmock==0.8 in pyproject.toml.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

kmock = pytest.importorskip("kmock")
from kmock._internal import enums, k8s  # noqa: E402  (internal: pinned kmock==0.8)

_resource_versions = itertools.count(1000)

JOBS = "kubeflow.org/v1/pytorchjobs"
PODMONITORS = "monitoring.coreos.com/v1/podmonitors"
CONFIGMAPS = "v1/configmaps"
PODS = "v1/pods"
EVENTS = "v1/events"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rfc3339nano(seconds: float) -> str:
    """Like Go's time.RFC3339Nano, which the kubelet uses: trailing zeros of the fraction trimmed."""
    whole = datetime.datetime.fromtimestamp(int(seconds), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    nanos = f"{round((seconds % 1) * 1e9):09d}".rstrip("0")
    return f"{whole}.{nanos}Z" if nanos else f"{whole}Z"


def _match_labels(obj: dict[str, Any], selector: str | None) -> bool:  # k=v, k==v, k!=v, k, !k
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (selector or "").split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            ok = labels.get(key) != value
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            ok = labels.get(key) == value
        else:
            ok = (term[1:] not in labels) if term.startswith("!") else (term in labels)
        if not ok:
            return False
    return True


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    status: int
    times: int
    message: str
    headers: dict[str, str]
    hits: int = 0


@dataclass
class ContainerLog:
    lines: list[tuple[float, str]] = field(default_factory=list)
    ended: bool = False


class RealisticK8s(kmock.KubernetesEmulator):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback["get /version/"] << self._serve_server_version
        self.faults: list[Fault] = []
        self.logs: dict[tuple[str, str], list[ContainerLog]] = {}  # (ns, pod) -> one per container instance

    async def _handle(self, request):  # type: ignore[no-untyped-def]
        method = request.method.value.lower() if request.method else ""
        for fault in self.faults:
            if fault.times > 0 and fault.method == method and fault.path.fullmatch(request.url.path):
                fault.times -= 1
                fault.hits += 1
                response = await self._render_error(
                    k8s.KubernetesError(
                        status=fault.status, reason=_reason(fault.status), message=fault.message
                    )
                )
                response.headers.update(fault.headers)
                return response
        if discovery := re.fullmatch(r"/api/(v1)/?|/apis/([^/]+)/([^/]+)/", request.url.path):
            # A trailing slash (the Python client's core discovery call) is parsed by kmock as a list.
            group, version = ("", "v1") if discovery[1] else (discovery[2], discovery[3])
            try:
                return kmock_json(self._discovery(group, version), status=200)
            except k8s.KubernetesError as e:
                return await self._render_error(e)
        if request.resource is not None and request.subresource == "log":
            return await self._serve_log(request)
        if request.resource is not None and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if request.action == enums.action.CREATE:
                if request.namespace:
                    meta.setdefault("namespace", request.namespace)
                meta.update(uid=str(uuid.uuid4()), generation=1, creationTimestamp=_now())
                if request.params.get("dryRun") == "All":  # validated and answered, never stored
                    return kmock_json(request.data, status=201)
            if request.action in (enums.action.CREATE, enums.action.UPDATE):
                meta["resourceVersion"] = str(next(_resource_versions))
        owner_uid = None
        if request.action == enums.action.DELETE and request.name is not None:
            key = (request.resource, request.namespace, request.name)
            if key in self.objects and not self.objects[key].deleted:
                owner_uid = (self.objects[key].get("metadata") or {}).get("uid")
        response = await super()._handle(request)
        if owner_uid and response.status < 300:
            await self._collect_garbage(owner_uid)
        return response

    async def _collect_garbage(self, owner_uid: str) -> None:
        """What kube-controller-manager's garbage collector does (no controllers run here)."""
        async with self._lock:
            doomed = [
                (resource, obj)
                for (resource, _, _), obj in self.objects.items()
                if not obj.deleted
                and any(
                    ref.get("uid") == owner_uid
                    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []
                )
            ]
            uids = []
            for resource, obj in doomed:
                raw = obj.raw
                uids.append((raw.get("metadata") or {}).get("uid"))
                obj.delete()
                await self._buses[resource].put({"type": "DELETED", "object": raw})
        for uid in filter(None, uids):
            await self._collect_garbage(uid)

    async def _serve_version(self, request):  # type: ignore[no-untyped-def]
        return self._discovery(request.resource.group, request.resource.version)

    def _discovery(self, group: str, version: str) -> dict[str, Any]:
        """An APIResourceList (kmock 0.8 says groupVersion "/v1" for the core group)."""
        found = [r for r in self._get_resources() if r.group == group and r.version == version and r.plural]
        if not found and group:
            raise k8s.KubernetesResourceNotFoundError()
        resources = []
        for resource in found:
            info = self.resources.get(resource) or kmock.ResourceInfo()
            entry = {
                "name": resource.plural,
                "singularName": info.singular or "",
                "namespaced": bool(info.namespaced),
                "kind": info.kind or resource.plural.capitalize(),
                "verbs": sorted(info.verbs),
            }
            resources.append(entry)
            resources += [dict(entry, name=f"{resource.plural}/{sub}") for sub in sorted(info.subresources)]
        group_version = f"{group}/{version}" if group else version
        return {
            "apiVersion": "v1",
            "kind": "APIResourceList",
            "groupVersion": group_version,
            "resources": resources,
        }

    async def _render_error(self, exc):  # type: ignore[no-untyped-def]
        response = await super()._render_error(exc)
        response.headers["Content-Type"] = "application/json"
        return response

    async def _serve_create(self, request):  # type: ignore[no-untyped-def]
        return kmock.Response(status=201, payload=await super()._serve_create(request))

    async def _serve_list(self, request):  # type: ignore[no-untyped-def]
        result, resource = await super()._serve_list(request), request.resource
        info = self.resources.get(resource)
        result["apiVersion"] = f"{resource.group}/{resource.version}" if resource.group else resource.version
        result["kind"] = ((info and info.kind) or resource.plural.capitalize()) + "List"
        if selector := request.params.get("labelSelector"):
            result["items"] = [o for o in result["items"] if _match_labels(o, selector)]
        return result

    async def _serve_watch(self, request):  # type: ignore[no-untyped-def]
        stream, timeout = super()._serve_watch(request), request.params.get("timeoutSeconds")
        deadline = asyncio.get_running_loop().time() + float(timeout) if timeout else None
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    item = await anext(stream)
            except (TimeoutError, StopAsyncIteration):
                break
            yield item
        await stream.aclose()

    async def _serve_log(self, request):  # type: ignore[no-untyped-def]
        """The kubelet's container log, as the API server proxies it (text/plain, chunked when following)."""
        import aiohttp.web

        params, key = request.params, (request.namespace, request.name)
        pod_key = (request.resource, request.namespace, request.name)
        if pod_key not in self.objects or self.objects[pod_key].deleted:
            return await self._render_error(k8s.KubernetesObjectNotFoundError())
        containers = self.logs.get(key) or []
        if params.get("previous") == "true":
            containers = containers[:-1]
        if not containers:
            message = f'container "pytorch" in pod "{request.name}" is waiting to start: ContainerCreating'
            return await self._render_error(
                k8s.KubernetesError(status=400, reason="BadRequest", message=message)
            )
        log = containers[-1]
        follow, stamps = params.get("follow") == "true", params.get("timestamps") == "true"
        start = 0
        if "tailLines" in params:
            start = max(0, len(log.lines) - int(params["tailLines"]))
        if "sinceSeconds" in params:
            oldest = time.time() - int(params["sinceSeconds"])
            start = max(start, next((i for i, (t, _) in enumerate(log.lines) if t >= oldest), len(log.lines)))
        response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        await response.prepare(request._raw_request)
        sent = start
        while True:
            ended = log.ended  # read before the lines: lines written before the end are all sent
            batch, sent = log.lines[sent:], len(log.lines)
            for t, line in batch:
                await response.write(((f"{_rfc3339nano(t)} " if stamps else "") + line + "\n").encode())
            if not follow or (ended and sent == len(log.lines)):
                break
            await asyncio.sleep(0.01)
        await response.write_eof()
        return response


def _reason(status: int) -> str:
    return {
        401: "Unauthorized",
        403: "Forbidden",
        404: "NotFound",
        409: "AlreadyExists",
        429: "TooManyRequests",
    }.get(status, "InternalError")


def kmock_json(data: Any, status: int):  # type: ignore[no-untyped-def]
    import aiohttp.web

    return aiohttp.web.json_response(data, status=status)


class Kube:
    """The emulator seen from a (synchronous) test: seed and inspect objects, act as the operator."""

    def __init__(self, emulator: RealisticK8s, url: str, loop: asyncio.AbstractEventLoop) -> None:
        self.emulator, self.url, self.loop = emulator, url, loop

    def _on_loop(self, fn, *args):  # type: ignore[no-untyped-def]
        """Mutate server state on its own event-loop thread (never while it iterates)."""

        async def call():  # type: ignore[no-untyped-def]
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    # --- objects
    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        def read():  # type: ignore[no-untyped-def]
            key = (kmock.resource(resource), namespace, name)
            if key not in self.emulator.objects or self.emulator.objects[key].deleted:
                return None
            return dict(self.emulator.objects[key].raw)

        return self._on_loop(read)

    def names(self, resource: str, namespace: str | None = None) -> list[str]:
        def read():  # type: ignore[no-untyped-def]
            return sorted(
                name
                for (res, ns, name), obj in self.emulator.objects.items()
                if res == kmock.resource(resource) and not obj.deleted and namespace in (None, ns)
            )

        return self._on_loop(read)

    def put(self, resource: str, namespace: str, obj: dict[str, Any]) -> None:
        obj = dict(obj, metadata=dict(obj.get("metadata") or {}, namespace=namespace))
        obj["metadata"].setdefault("uid", str(uuid.uuid4()))
        obj["metadata"].setdefault("creationTimestamp", _now())

        def write():  # type: ignore[no-untyped-def]
            self.emulator.objects[resource, namespace, obj["metadata"]["name"]] = obj

        self._on_loop(write)

    def patch(self, resource: str, namespace: str, name: str, changes: dict[str, Any]) -> None:
        self._on_loop(lambda: self.emulator.objects[resource, namespace, name].patch(changes))

    def delete(self, resource: str, namespace: str, name: str) -> None:
        self._on_loop(lambda: self.emulator.objects[resource, namespace, name].delete())

    # --- requests and faults
    def requests(self, method: str | None = None, path: str | None = None) -> list[Any]:
        return [
            r
            for r in list(self.emulator)
            if (method is None or r.method.value.lower() == method)
            and (path is None or re.fullmatch(path, r.url.path))
        ]

    def fail(
        self, method: str, path: str, status: int, *, times: int = 1, message: str = "", headers=None
    ) -> Fault:  # type: ignore[no-untyped-def]
        fault = Fault(
            method, re.compile(path), status, times, message or _reason(status), dict(headers or {})
        )
        self._on_loop(self.emulator.faults.append, fault)
        return fault

    # --- the operator's part
    def set_conditions(self, namespace: str, name: str, *conditions: tuple[str, str], **status: Any) -> None:
        """Append conditions like the operator does: (type, "True"/"False"); reason = PyTorchJob<Type>."""
        job = self.get(JOBS, namespace, name)
        assert job is not None, f"no job {namespace}/{name}"
        existing = list((job.get("status") or {}).get("conditions") or [])
        for ctype, cstatus, *message in conditions:
            existing = [c for c in existing if c["type"] != ctype]
            existing.append(
                {
                    "type": ctype,
                    "status": cstatus,
                    "reason": f"PyTorchJob{ctype}",
                    "message": message[0] if message else f"PyTorchJob {name} is {ctype.lower()}.",
                    "lastTransitionTime": _now(),
                }
            )
        self.patch(JOBS, namespace, name, {"status": {"conditions": existing, **status}})

    def add_pod(
        self,
        namespace: str,
        job: str,
        role: str,
        index: int,
        *,
        state: str = "running",
        restarts: int = 0,
        node: str = "gpu-node-1",
    ) -> str:
        name = f"{job}-{role}-{index}"
        self.put(
            PODS, namespace, pod_object(name, job, role, index, state=state, restarts=restarts, node=node)
        )
        if state != "waiting":
            self._on_loop(lambda: self.emulator.logs.setdefault((namespace, name), [ContainerLog()]))
        return name

    def set_pod_state(
        self, namespace: str, name: str, state: str, *, restarts: int = 0, last: str = ""
    ) -> None:
        pod = self.get(PODS, namespace, name)
        assert pod is not None
        job = pod["metadata"]["labels"]["training.kubeflow.org/job-name"]
        role = pod["metadata"]["labels"]["training.kubeflow.org/replica-type"]
        index = int(pod["metadata"]["labels"]["training.kubeflow.org/replica-index"])
        fresh = pod_object(name, job, role, index, state=state, restarts=restarts, last=last)
        self.patch(PODS, namespace, name, {"status": fresh["status"]})
        if state != "waiting":
            self._on_loop(lambda: self.emulator.logs.setdefault((namespace, name), [ContainerLog()]))

    def write_log(self, namespace: str, pod: str, *lines: str) -> None:
        def write():  # type: ignore[no-untyped-def]
            log = self.emulator.logs.setdefault((namespace, pod), [ContainerLog()])[-1]
            log.lines.extend((time.time(), line) for line in lines)

        self._on_loop(write)

    def end_log(self, namespace: str, pod: str) -> None:
        """The container exited: followed streams of it end."""
        self._on_loop(lambda: setattr(self.emulator.logs[(namespace, pod)][-1], "ended", True))

    def restart_container(
        self, namespace: str, pod: str, *, reason: str = "Error", exit_code: int = 1
    ) -> None:
        """The kubelet restarts the `pytorch` container: the old log ends, a new one begins."""
        restarts = len(self.emulator.logs.get((namespace, pod), []))

        def restart():  # type: ignore[no-untyped-def]
            containers = self.emulator.logs.setdefault((namespace, pod), [ContainerLog()])
            containers[-1].ended = True
            containers.append(ContainerLog())

        self._on_loop(restart)
        self.set_pod_state(namespace, pod, "running", restarts=restarts, last=f"{reason}:{exit_code}")


def pod_object(
    name: str,
    job: str,
    role: str,
    index: int,
    *,
    state: str,
    restarts: int = 0,
    last: str = "",
    node: str = "gpu-node-1",
) -> dict[str, Any]:
    """A pod as the training operator creates it and the kubelet reports it."""
    container_state = {
        "waiting": {"waiting": {"reason": "ContainerCreating"}},
        "running": {"running": {"startedAt": _now()}},
        "succeeded": {"terminated": {"exitCode": 0, "reason": "Completed"}},
        "failed": {"terminated": {"exitCode": 1, "reason": "Error"}},
    }[state]
    phase = {"waiting": "Pending", "running": "Running", "succeeded": "Succeeded", "failed": "Failed"}[state]
    last_state = {}
    if last:
        reason, code = last.split(":")
        last_state = {"terminated": {"exitCode": int(code), "reason": reason}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "training.kubeflow.org/job-name": job,
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                "training.kubeflow.org/replica-type": role,
                "training.kubeflow.org/replica-index": str(index),
                "orch.dev/job": job,
            },
        },
        "spec": {
            "nodeName": "" if state == "waiting" else node,
            "containers": [{"name": "pytorch", "image": "x"}],
        },
        "status": {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": "pytorch",
                    "restartCount": restarts,
                    "state": container_state,
                    "lastState": last_state,
                }
            ],
        },
    }


@contextlib.contextmanager
def serve(*, operator: bool = True, prometheus_operator: bool = True):  # type: ignore[no-untyped-def]
    """Run the emulator on its own thread and event loop (the sync client blocks); yields a `Kube`."""
    ready, box, loop = threading.Event(), {}, asyncio.new_event_loop()

    def declare(k: RealisticK8s) -> None:
        info = kmock.ResourceInfo
        k.resources[CONFIGMAPS] = info(
            kind="ConfigMap", namespaced=True, verbs={"create", "get", "list", "delete"}
        )
        k.resources[PODS] = info(
            kind="Pod", namespaced=True, verbs={"get", "list"}, subresources={"log", "status"}
        )
        k.resources[EVENTS] = info(kind="Event", namespaced=True, verbs={"list"})
        if operator:
            k.resources[JOBS] = info(
                kind="PyTorchJob",
                namespaced=True,
                verbs={"create", "get", "list", "delete"},
                subresources={"status"},
            )
        if prometheus_operator:
            k.resources[PODMONITORS] = info(
                kind="PodMonitor", namespaced=True, verbs={"create", "get", "delete"}
            )

    async def main() -> None:
        async with RealisticK8s() as k, kmock.Server(k) as server:
            declare(k)
            box.update(k=k, url=str(server.url).rstrip("/"), stop=asyncio.Event())
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("kmock did not start")
    try:
        yield Kube(box["k"], box["url"], loop)
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(5)


def write_kubeconfig(path: Path, url: str, *, contexts: dict[str, str | None], current: str) -> Path:
    """A kubeconfig like a user's: one cluster, a token user, a context per namespace."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "tester", "user": {"token": "not-a-secret"}}],
        "contexts": [
            {
                "name": name,
                "context": {"cluster": "emulator", "user": "tester", **({"namespace": ns} if ns else {})},
            }
            for name, ns in contexts.items()
        ],
        "current-context": current,
    }
    path.write_text(yaml.safe_dump(config))
    return path


FAST = {"ORCH_POLL_SECONDS": "0.05", "ORCH_API_BACKOFF_SECONDS": "0.01", "ORCH_API_RETRIES": "3"}


@dataclass
class Env:
    kube: Kube
    kubeconfig: Path
    home: Path
    vars: dict[str, str]

    def orch(self, *args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
        """Run `orch` in this process exactly as the console script does (main(): errors, exit codes)."""
        return CliRunner().invoke(_EntryPoint(), list(args), env={**self.vars, **(env or {})})


class _EntryPoint:
    """Lets CliRunner run `orchestrator.cli.main()` (which reads sys.argv and calls sys.exit)."""

    name = "orch"

    def main(self, args=(), prog_name=None, **_):  # type: ignore[no-untyped-def]
        from orchestrator.cli import main

        saved = sys.argv
        sys.argv = ["orch", *args]
        try:
            main()
        finally:
            sys.argv = saved


@pytest.fixture
def kube():  # type: ignore[no-untyped-def]
    with serve() as k:
        yield k


@pytest.fixture
def env(kube: Kube, tmp_path: Path) -> Env:
    """A user whose kubeconfig points at the emulator; current context "dev" has namespace "team-a"."""
    home = tmp_path / "home"
    home.mkdir()
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig",
        kube.url,
        contexts={"dev": "team-a", "prod": "team-b", "bare": None},
        current="dev",
    )
    return Env(kube, kubeconfig, home, {"KUBECONFIG": str(kubeconfig), "HOME": str(home), **FAST})


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: demo\nimage: registry.example/trainer:1\nnodes: 3\ntrain:\n  task: digits\n  batch_size: 96\n  max_steps: 10\n"
    )
    return path
