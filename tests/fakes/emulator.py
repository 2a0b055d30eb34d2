"""A Kubernetes API server for tests: kmock's emulator over real HTTP on 127.0.0.1, talked to by the
unmodified official client (and kubectl).

`RealisticK8s` closes the gaps of kmock 0.8 that orch would hit (see shared notes, offline-testing.md §1):
uid/resourceVersion/creationTimestamp stamping, 201 on create, List kinds and labelSelector, watch
timeouts, `/version/`, discovery. On top of that it emulates, because nothing here can run them:
- `dryRun=All` on create and delete (answered, nothing stored or deleted; 409 for an existing name);
- injected faults (`Fault`): an error status before any effect, any other answer (an HTML page with 200),
  or no answer at all, before or after the request took effect (a create stored but answered too late);
- the kubelet's log endpoint (`follow`, `tailLines`, `sinceSeconds`, `timestamps`, container restarts, a
  stream that breaks off);
- the garbage collector: deleting an object deletes the objects whose ownerReferences name its uid;
- RBAC (`role`): a request the Role does not grant is refused 403 the way the API server's authorizer words it;
- field validation against the CRD schemas it is given (`crds`): `fieldValidation=Strict` refuses an unknown
  field with the API server's strict-decoding error, the default (Warn) drops it with a Warning header;
- admission webhooks (`webhooks`), called on create after the above, e.g. `runtime_webhook`: the Trainer's and
  Kueue's TrainJob webhooks, which look the runtime up in a lagging informer cache.
- watches and paged lists as the API server serves them (`tests.fakes.history`): a resourceVersion for
  every change, a watch resumed from one, 410 Gone when it was compacted, `limit`/`continue` pages cut
  from one snapshot, bookmarks at a watch's end when asked for.
It touches kmock internals, hence the pin kmock==0.8 in pyproject.toml. `serve()` runs it on its own thread
and yields a `tests.fakes.kube.Kube`, the test's handle on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import re
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from tests.fakes.history import Expired, History, Recorders

if TYPE_CHECKING:
    from tests.fakes.kube import Kube

kmock = pytest.importorskip("kmock")
import aiohttp.test_utils  # noqa: E402  (kmock's own server class, which `tls` extends)
from kmock._internal import enums, k8s  # noqa: E402  (internal: pinned kmock==0.8)

JOBS = "kubeflow.org/v1/pytorchjobs"
PODMONITORS = "monitoring.coreos.com/v1/podmonitors"
CONFIGMAPS = "v1/configmaps"
PODS = "v1/pods"
EVENTS = "v1/events"
TRAINJOBS = "trainer.kubeflow.org/v1alpha1/trainjobs"
TRAININGRUNTIMES = "trainer.kubeflow.org/v1alpha1/trainingruntimes"
CLUSTERTRAININGRUNTIMES = "trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"
JOBSETS = "jobset.x-k8s.io/v1alpha2/jobsets"
PODGROUPS = "scheduling.volcano.sh/v1beta1/podgroups"


def workloads(version: str = "v1beta2") -> str:
    return f"kueue.x-k8s.io/{version}/workloads"


def localqueues(version: str = "v1beta2") -> str:
    return f"kueue.x-k8s.io/{version}/localqueues"


CRDS = "apiextensions.k8s.io/v1/customresourcedefinitions"


def now_stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rfc3339nano(seconds: float) -> str:
    """Like Go's time.RFC3339Nano, which the kubelet uses: trailing zeros of the fraction trimmed."""
    whole = datetime.datetime.fromtimestamp(int(seconds), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    nanos = f"{round((seconds % 1) * 1e9):09d}".rstrip("0")
    return f"{whole}.{nanos}Z" if nanos else f"{whole}Z"


def _matches(obj: dict[str, Any], params: Any) -> bool:
    """Whether a list or watch request's labelSelector and fieldSelector (metadata.name/namespace) select obj."""
    meta = obj.get("metadata") or {}
    for term in filter(None, (params.get("fieldSelector") or "").split(",")):
        field_name, _, value = term.replace("==", "=").partition("=")
        if field_name in ("metadata.name", "metadata.namespace") and meta.get(field_name[9:]) != value:
            return False
    return _match_labels(obj, params.get("labelSelector"))


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
    body: str | None = None  # answer this (with `content_type`) instead of an error Status
    content_type: str = "application/json"
    hang: bool = False  # never answer (until the server stops)
    after: bool = False  # with `hang`: first let the request take effect (a create is stored)


@dataclass
class ContainerLog:
    lines: list[tuple[float, str]] = field(default_factory=list)
    ended: bool = False
    broken: bool = False  # the next write to a followed stream drops the connection instead


# An admission webhook: (emulator, the create's request) -> None to allow, or the denial's message.
Webhook = Callable[["RealisticK8s", Any], "str | None"]


def rbac_attributes(request: Any) -> tuple[str, str, str] | None:
    """The (apiGroup, resource, verb) the API server's authorizer checks for a request; None for discovery
    and the non-resource URLs every authenticated user may read (ClusterRole system:discovery), and for the
    access reviews every authenticated user may create (system:basic-user; both in
    plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go)."""
    path = request.url.path.rstrip("/")
    match = re.fullmatch(
        r"/api/v1/(?:namespaces/[^/]+/)?([^/]+)(?:/([^/]+))?(?:/([^/]+))?", path
    ) or re.fullmatch(r"/apis/([^/]+)/[^/]+/(?:namespaces/[^/]+/)?([^/]+)(?:/([^/]+))?(?:/([^/]+))?", path)
    if match is None:
        assert re.fullmatch(r"/api(/v1)?|/apis(/[^/]+){0,2}|/version", path), f"unexpected call {path}"
        return None
    if path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":
        return None  # every authenticated user may ask (bootstrap ClusterRole system:basic-user)
    if path.startswith("/api/"):
        group, (resource, name, sub) = "", match.groups()
    else:
        group, resource, name, sub = match.groups()
    verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}.get(request.method.value)
    if verb is None:
        verb = "get" if name else ("watch" if request.params.get("watch") == "true" else "list")
    return group, f"{resource}/{sub}" if sub else resource, verb


def unknown_fields(schema: Any, value: Any, path: str, *, prune: bool) -> list[str]:
    """The paths of `value`'s fields that the structural schema does not declare, as the API server names
    them in a strict-decoding error (`spec.foo`, `spec.list[0].bar`); with `prune`, also removes them (what
    it does under the default fieldValidation, apiextensions-apiserver's pruning)."""
    if not isinstance(schema, dict):
        return []
    found: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key in list(value):
            here = f"{path}.{key}" if path else key
            if props is not None and key in props:
                found += unknown_fields(props[key], value[key], here, prune=prune)
            elif isinstance(extra, dict):
                found += unknown_fields(extra, value[key], here, prune=prune)
            elif schema.get("x-kubernetes-embedded-resource") and key in ("apiVersion", "kind", "metadata"):
                continue
            elif props is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                found.append(here)
                if prune:
                    del value[key]
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found += unknown_fields(schema["items"], item, f"{path}[{index}]", prune=prune)
    return found


def runtime_webhook(*, lag: float = 0.0, kueue: bool = False) -> Webhook:
    """The validating webhook of Trainer v2 (or, with `kueue`, Kueue's) for a TrainJob's create: the runtime it
    names must exist, as seen through the manager's informer cache, which learns of an object `lag` seconds
    after its create (cmd/trainer-controller-manager/main.go reads through mgr.GetClient()). The words are the
    webhook's (Trainer: pkg/runtime/core/trainingruntime.go and clustertrainingruntime.go ValidateObjects;
    Kueue: pkg/controller/jobs/trainjob/trainjob_controller.go getChildJobSet), wrapped the way the API server
    reports a denial (controller-runtime's Denied is a 403)."""

    def review(emulator: RealisticK8s, request: Any) -> str | None:
        if request.resource != kmock.resource(TRAINJOBS):
            return None
        ref = (request.data.get("spec") or {}).get("runtimeRef") or {}
        cluster_scoped = ref.get("kind", "ClusterTrainingRuntime") == "ClusterTrainingRuntime"
        resource = CLUSTERTRAININGRUNTIMES if cluster_scoped else TRAININGRUNTIMES
        key = (kmock.resource(resource), None if cluster_scoped else request.namespace, ref.get("name"))
        stored = key in emulator.objects and not emulator.objects[key].deleted
        if stored and time.monotonic() - emulator.stored_at.get(key, 0.0) >= lag:
            return None
        plural = resource.split("/")[-1]
        if kueue:
            webhook, said = "vtrainjob.kb.io", f"runtime '{ref.get('name')}' not found"
        else:
            kind = "clusterTrainingRuntime" if cluster_scoped else "trainingRuntime"
            webhook = "validator.trainjob.trainer.kubeflow.org"
            said = (
                f'spec.runtimeRef: Invalid value: {ref}: {plural}.trainer.kubeflow.org "{ref.get("name")}" '
                f"not found: specified {kind} must be created before the TrainJob is created"
            )
        return f'admission webhook "{webhook}" denied the request: {said}'

    return review


class RealisticK8s(kmock.KubernetesEmulator):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback["get /version/"] << self._serve_server_version
        self.role: set[tuple[str, str, str]] | None = None  # None: the user may do anything
        self.schemas: dict[Any, dict[str, Any]] = {}  # kmock resource -> its CRD's openAPIV3Schema
        self.webhooks: list[Webhook] = []
        self.stored_at: dict[tuple[Any, str | None, str], float] = {}  # when each object was created
        self.faults: list[Fault] = []
        self.logs: dict[tuple[str, str], list[ContainerLog]] = {}  # (ns, pod) -> one per container instance
        self.released = asyncio.Event()  # set when the server stops: hung requests end
        self.history = History()
        self.bookmarks = True  # servers may send none: a test turns them off to see clients cope
        self.log_streams, self.log_streams_peak = (
            0,
            0,
        )  # log requests being answered now, and the most at once
        self._buses = Recorders(self.history)  # every change kmock announces gets its resourceVersion

    async def _handle(self, request):  # type: ignore[no-untyped-def]
        import aiohttp.web

        method = request.method.value.lower() if request.method else ""
        for fault in self.faults:
            if fault.times > 0 and fault.method == method and fault.path.fullmatch(request.url.path):
                fault.times -= 1
                fault.hits += 1
                if fault.hang:
                    if fault.after:
                        await self._serve(request)
                    await self.released.wait()
                    return aiohttp.web.Response(status=504)
                if fault.body is not None:
                    return aiohttp.web.Response(
                        status=fault.status, body=fault.body.encode(), content_type=fault.content_type
                    )
                response = await self._render_error(
                    k8s.KubernetesError(
                        status=fault.status, reason=reason_phrase(fault.status), message=fault.message
                    )
                )
                response.headers.update(fault.headers)
                return response
        return await self._serve(request)

    async def _serve(self, request):  # type: ignore[no-untyped-def]
        """What the API server does with a request (no faults)."""
        attributes = rbac_attributes(request) if self.role is not None else None
        if attributes is not None and self.role is not None and attributes not in self.role:
            return await self._render_error(self._rbac_refusal(request, *attributes))
        warnings: list[str] = []
        schema = self.schemas.get(request.resource) if request.resource is not None else None
        if schema is not None and isinstance(request.data, dict) and request.action in (
            enums.action.CREATE, enums.action.UPDATE
        ):  # fmt: skip
            strict = request.params.get("fieldValidation") == "Strict"
            unknown = unknown_fields(schema, request.data, "", prune=not strict)
            if unknown and strict:
                kind = (self.resources.get(request.resource) or kmock.ResourceInfo()).kind
                version = request.resource.version
                listed = ", ".join(f'unknown field "{f}"' for f in unknown)
                message = f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding error: {listed}'
                return await self._render_error(
                    k8s.KubernetesError(status=400, reason="BadRequest", message=message)
                )
            warnings = [f'299 - "unknown field \\"{f}\\""' for f in unknown]
        if request.action == enums.action.CREATE and isinstance(request.data, dict):
            for webhook in self.webhooks:
                if (denial := webhook(self, request)) is not None:
                    return await self._render_error(
                        k8s.KubernetesError(status=403, reason="Forbidden", message=denial)
                    )
        response = await self._serve_admitted(request)
        for warning in warnings:
            response.headers.add("Warning", warning)
        if (
            request.action == enums.action.CREATE
            and response.status < 300
            and request.params.get("dryRun") != "All"
        ):
            meta = request.data.get("metadata") or {} if isinstance(request.data, dict) else {}
            self.stored_at[(request.resource, request.namespace, meta.get("name"))] = time.monotonic()
        return response

    def _rbac_refusal(self, request: Any, group: str, resource: str, verb: str) -> k8s.KubernetesError:
        """The authorizer's words (k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go)."""
        plural = resource.partition("/")[0]
        qualified = f"{plural}.{group}" if group else plural
        subject = f'{qualified} "{request.name}"' if request.name else qualified
        scope = f'in the namespace "{request.namespace}"' if request.namespace else "at the cluster scope"
        message = (
            f'{subject} is forbidden: User "tester" cannot {verb} resource "{resource}" in API group '
            f'"{group}" {scope}'
        )
        return k8s.KubernetesError(status=403, reason="Forbidden", message=message)

    async def _serve_admitted(self, request):  # type: ignore[no-untyped-def]
        """What the API server does with a request that was authorized and admitted."""
        if request.url.path == "/apis/":  # the group list, as the Python client asks for it (trailing slash)
            return kmock_json(await self._serve_apis(request), status=200)
        if discovery := re.fullmatch(r"/api/(v1)/?|/apis/([^/]+)/([^/]+)/", request.url.path):
            # A trailing slash (the Python client's core discovery call) is parsed by kmock as a list.
            group, version = ("", "v1") if discovery[1] else (discovery[2], discovery[3])
            try:
                return kmock_json(self._discovery(group, version), status=200)
            except k8s.KubernetesError as e:
                return await self._render_error(e)
        if request.resource is not None and request.subresource == "log":
            return await self._serve_log(request)
        if request.resource is not None and request.action == enums.action.WATCH:
            return await self._serve_watch_stream(request)
        if request.resource is not None and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if request.action == enums.action.CREATE:
                if request.namespace:
                    meta.setdefault("namespace", request.namespace)
                meta.update(uid=str(uuid.uuid4()), generation=1, creationTimestamp=now_stamp())
                if request.params.get("dryRun") == "All":  # validated and answered, never stored
                    key = (request.resource, request.namespace, meta.get("name"))
                    if key in self.objects and not self.objects[key].deleted:
                        return await self._render_error(k8s.KubernetesObjectConflictError())
                    return kmock_json(request.data, status=201)
        owner_uid = None
        if request.action == enums.action.DELETE and request.name is not None:
            key = (request.resource, request.namespace, request.name)
            if request.params.get("dryRun") == "All":  # answered as if deleted, nothing changes
                if key not in self.objects or self.objects[key].deleted:
                    return await self._render_error(k8s.KubernetesObjectNotFoundError())
                return kmock_json(dict(self.objects[key].raw), status=200)
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
        result, resource, params = await super()._serve_list(request), request.resource, request.params
        info = self.resources.get(resource)
        result["apiVersion"] = f"{resource.group}/{resource.version}" if resource.group else resource.version
        result["kind"] = ((info and info.kind) or resource.plural.capitalize()) + "List"
        items = [o for o in result["items"] if _matches(o, params)]
        limit = int(params["limit"]) if params.get("limit") else None
        try:
            result["items"], result["metadata"] = self.history.page(
                items, limit=limit, token=params.get("continue")
            )
        except Expired as e:
            raise k8s.KubernetesError(status=410, reason="Expired", message=str(e)) from None
        except ValueError as e:
            raise k8s.KubernetesError(status=400, reason="BadRequest", message=str(e)) from None
        return result

    async def _serve_watch_stream(self, request):  # type: ignore[no-untyped-def]
        """A watch: newline-separated JSON events. From `resourceVersion` N: every change after N; unset or
        "0": the current objects as ADDED, then every change. Ends after `timeoutSeconds` (a BOOKMARK with
        the latest resourceVersion first, if `allowWatchBookmarks`), or with an ERROR event (410) if N was
        compacted away."""
        import aiohttp.web

        params, loop = request.params, asyncio.get_running_loop()
        deadline = loop.time() + float(params.get("timeoutSeconds") or 1800)
        response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)

        def wanted(obj: dict[str, Any]) -> bool:
            meta = obj.get("metadata") or {}
            return (
                request.namespace in (None, meta.get("namespace"))
                and request.name in (None, meta.get("name"))
                and _matches(obj, params)
            )

        async def send(event: dict[str, Any]) -> None:
            await response.write(json.dumps(event).encode() + b"\n")

        try:
            version_asked = params.get("resourceVersion") or "0"
            if version_asked == "0":
                async with self._lock:
                    version = self.history.current
                    current = [
                        o.raw
                        for (r, _, _), o in self.objects.items()
                        if r == request.resource and not o.deleted and wanted(o.raw)
                    ]
                for obj in current:
                    await send({"type": "ADDED", "object": obj})
            else:
                version = int(version_asked)
            while not self.released.is_set():
                try:
                    events = self.history.since(request.resource, version)
                except Expired as e:
                    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": str(e), "reason": "Expired", "code": 410}  # fmt: skip
                    await send({"type": "ERROR", "object": status})
                    break
                for event in events:
                    if wanted(event.object):
                        await send({"type": event.type, "object": event.object})
                version = self.history.current
                remaining = deadline - loop.time()
                if remaining <= 0:
                    if params.get("allowWatchBookmarks") == "true" and self.bookmarks:
                        kind = (self.resources.get(request.resource) or kmock.ResourceInfo()).kind
                        bookmark = {"kind": kind, "metadata": {"resourceVersion": str(version)}}
                        await send({"type": "BOOKMARK", "object": bookmark})
                    break
                async with self.history.changed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.history.changed.wait(), min(remaining, 1.0))
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # the client went away
        return response

    async def _serve_log(self, request):  # type: ignore[no-untyped-def]
        """The kubelet's container log, as the API server proxies it (text/plain, chunked when following)."""

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
        self.log_streams += 1
        self.log_streams_peak = max(self.log_streams_peak, self.log_streams)
        try:
            return await self._stream_log(request, log, start, follow, stamps)
        finally:
            self.log_streams -= 1

    async def _stream_log(self, request, log, start, follow, stamps):  # type: ignore[no-untyped-def]
        import aiohttp.web

        response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        await response.prepare(request._raw_request)
        sent = start
        while True:
            ended = log.ended  # read before the lines: lines written before the end are all sent
            batch, sent = log.lines[sent:], len(log.lines)
            if log.broken and follow:
                log.broken = False  # once: a new request reads on
                request._raw_request.transport.close()  # mid-chunk: the client sees a broken stream
                return response
            for t, line in batch:
                await response.write(((f"{_rfc3339nano(t)} " if stamps else "") + line + "\n").encode())
            if not follow or (ended and sent == len(log.lines)):
                break
            await asyncio.sleep(0.01)
        await response.write_eof()
        return response


def reason_phrase(status: int) -> str:
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


def _https_server(context: ssl.SSLContext) -> type[aiohttp.test_utils.RawTestServer]:
    class HttpsServer(aiohttp.test_utils.RawTestServer):
        async def start_server(self, **kwargs: Any) -> None:
            await super().start_server(ssl=context, **kwargs)

    return HttpsServer


@contextlib.contextmanager
def serve(
    *,
    operator: bool = True,
    trainer: bool = False,
    prometheus_operator: bool = True,
    kueue: str | None = None,
    volcano: bool = False,
    tls: ssl.SSLContext | None = None,
) -> Iterator[Kube]:
    """Run the emulator on its own thread and event loop (the sync client blocks); yields a `Kube`.

    Which CRDs are served: `operator`, the training operator v1's PyTorchJob; `trainer`, Kubeflow Trainer v2's
    TrainJob, TrainingRuntime, ClusterTrainingRuntime and JobSet (its dependency); `prometheus_operator`,
    PodMonitor; `kueue`, Kueue's Workload and LocalQueue in that API version (v1beta1 up to Kueue v0.15,
    v1beta2 from v0.16; tests/fakes/queues.py plays Kueue); `volcano`, Volcano's PodGroup. `tls`: served over
    HTTPS with this server context (tests/fakes/tls.py makes one), its URL https://127.0.0.1:PORT."""
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
        if trainer:
            k.resources[TRAINJOBS] = info(
                kind="TrainJob",
                namespaced=True,
                verbs={"create", "get", "list", "delete", "patch"},
                subresources={"status"},
            )
            k.resources[TRAININGRUNTIMES] = info(
                kind="TrainingRuntime", namespaced=True, verbs={"create", "get", "list", "delete", "patch"}
            )
            k.resources[CLUSTERTRAININGRUNTIMES] = info(
                kind="ClusterTrainingRuntime", namespaced=False, verbs={"create", "get", "list", "delete"}
            )
            k.resources[JOBSETS] = info(
                kind="JobSet",
                namespaced=True,
                verbs={"create", "get", "list", "delete"},
                subresources={"status"},
            )
        if kueue:
            k.resources[workloads(kueue)] = info(kind="Workload", namespaced=True, verbs={"get", "list"},
                                                 subresources={"status"})  # fmt: skip
            k.resources[localqueues(kueue)] = info(kind="LocalQueue", namespaced=True, verbs={"get", "list"},
                                                   subresources={"status"})  # fmt: skip
        if volcano:
            k.resources[PODGROUPS] = info(
                kind="PodGroup", namespaced=True, verbs={"get", "list"}, subresources={"status"}
            )
        if prometheus_operator:
            k.resources[PODMONITORS] = info(
                kind="PodMonitor", namespaced=True, verbs={"create", "get", "list", "delete"}
            )

    async def main() -> None:
        server_cls = _https_server(tls) if tls is not None else aiohttp.test_utils.RawTestServer
        async with RealisticK8s() as k, kmock.Server(k, server_cls=server_cls) as server:
            declare(k)
            box.update(k=k, url=str(server.url).rstrip("/"), stop=asyncio.Event())
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("kmock did not start")
    try:
        from tests.fakes.kube import Kube

        yield Kube(box["k"], box["url"], loop)
    finally:
        loop.call_soon_threadsafe(box["k"].released.set)
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(5)
