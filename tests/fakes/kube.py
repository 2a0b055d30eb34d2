"""The emulator seen from a (synchronous) test: seed and inspect objects, inject faults, and play the
controllers that cannot run here (the training operator, the kubelet's container restarts)."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from typing import Any

from tests.fakes.emulator import (
    CRDS,
    JOBS,
    PODS,
    ContainerLog,
    Fault,
    RealisticK8s,
    Webhook,
    kmock,
    now_stamp,
    reason_phrase,
)


class Kube:
    """The emulator seen from a (synchronous) test: seed and inspect objects, act as the operator."""

    def __init__(self, emulator: RealisticK8s, url: str, loop: asyncio.AbstractEventLoop) -> None:
        self.emulator, self.url, self.loop = emulator, url, loop

    def _on_loop(self, fn, *args):  # type: ignore[no-untyped-def]
        """Mutate server state on its own event-loop thread (never while it iterates)."""

        async def call():  # type: ignore[no-untyped-def]
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    def _on_loop_async(self, fn):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(fn(), self.loop).result(10)

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
        obj["metadata"].setdefault("creationTimestamp", now_stamp())

        async def write():  # type: ignore[no-untyped-def]
            key = (kmock.resource(resource), namespace, obj["metadata"]["name"])
            change = (
                "MODIFIED"
                if key in self.emulator.objects and not self.emulator.objects[key].deleted
                else "ADDED"
            )
            self.emulator.objects[key] = obj
            await self._announce(key, change)

        self._on_loop_async(write)

    def patch(self, resource: str, namespace: str, name: str, changes: dict[str, Any]) -> None:
        async def write():  # type: ignore[no-untyped-def]
            key = (kmock.resource(resource), namespace, name)
            self.emulator.objects[key].patch(changes)
            await self._announce(key, "MODIFIED")

        self._on_loop_async(write)

    def delete(self, resource: str, namespace: str, name: str) -> None:
        async def write():  # type: ignore[no-untyped-def]
            key = (kmock.resource(resource), namespace, name)
            last = self.emulator.objects[key].raw
            self.emulator.objects[key].delete()
            await self.emulator.history.record(key[0], "DELETED", last)

        self._on_loop_async(write)

    async def _announce(self, key: tuple[Any, str, str], change: str) -> None:
        """A change made behind the API's back (a controller's) is still seen by watches, as on a cluster."""
        await self.emulator.history.record(key[0], change, self.emulator.objects[key].raw)

    def compact(self) -> None:
        """etcd compaction: watches from an earlier resourceVersion get 410 Gone and must list again."""
        self._on_loop(self.emulator.history.compact)

    # --- what the API server enforces

    def enforce_role(self, rules: set[tuple[str, str, str]] | None) -> None:
        """From now on only these (apiGroup, resource, verb) are granted (None: everything)."""
        self._on_loop(setattr, self.emulator, "role", rules)

    def add_webhook(self, webhook: Webhook) -> None:
        """An admission webhook for every create from now on (see emulator.runtime_webhook)."""
        self._on_loop(self.emulator.webhooks.append, webhook)

    def serve_crd(self, resource: str, crd: dict[str, Any]) -> None:
        """Validate `resource`'s objects against this CRD's schema (its version of `resource`), and serve the
        CRD object itself (apiextensions.k8s.io/v1), as a cluster with that release installed does."""
        version = resource.split("/")[-2]
        served = next(v for v in crd["spec"]["versions"] if v["name"] == version)

        def install():  # type: ignore[no-untyped-def]
            self.emulator.schemas[kmock.resource(resource)] = served["schema"]["openAPIV3Schema"]
            self.emulator.resources[CRDS] = kmock.ResourceInfo(
                kind="CustomResourceDefinition", namespaced=False, verbs={"get", "list"}
            )
            self.emulator.objects[CRDS, None, crd["metadata"]["name"]] = crd

        self._on_loop(install)

    # --- requests and faults
    def requests(self, method: str | None = None, path: str | None = None) -> list[Any]:
        return [
            r
            for r in list(self.emulator)
            if (method is None or r.method.value.lower() == method)
            and (path is None or re.fullmatch(path, r.url.path))
        ]

    def fail(
        self,
        method: str,
        path: str,
        status: int,
        *,
        times: int = 1,
        message: str = "",
        headers=None,  # type: ignore[no-untyped-def]
        body: str | None = None,
        content_type: str = "application/json",
    ) -> Fault:
        """The next `times` requests matching `method` and `path` (a regex) are answered `status` with a
        Status object (or with `body` as `content_type`, e.g. an HTML page) and have no effect."""
        fault = Fault(
            method, re.compile(path), status, times, message or reason_phrase(status), dict(headers or {}),
            body=body, content_type=content_type,
        )  # fmt: skip
        self._on_loop(self.emulator.faults.append, fault)
        return fault

    def clear_faults(self) -> None:
        self._on_loop(self.emulator.faults.clear)

    def hang(self, method: str, path: str, *, after: bool = False, times: int = 1) -> Fault:
        """The next `times` matching requests are never answered; with `after`, they take effect first
        (a create is stored, then the answer never comes, as when the client's read times out)."""
        fault = Fault(method, re.compile(path), 0, times, "", {}, hang=True, after=after)
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
                    "lastTransitionTime": now_stamp(),
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

    def start_log(self, namespace: str, pod: str) -> None:
        """The pod's training container started: it has a (so far empty) log."""
        self._on_loop(lambda: self.emulator.logs.setdefault((namespace, pod), [ContainerLog()]))

    def write_log(
        self, namespace: str, pod: str, *lines: str, broken: bool = False, at: float | None = None
    ) -> None:
        """The container prints `lines` (at time.time() `at`, default now). `broken`: followed streams break off
        before sending them."""

        def write():  # type: ignore[no-untyped-def]
            log = self.emulator.logs.setdefault((namespace, pod), [ContainerLog()])[-1]
            log.lines.extend((time.time() if at is None else at, line) for line in lines)
            log.broken = broken

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
        "running": {"running": {"startedAt": now_stamp()}},
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
