"""`Cluster`: one namespace of one cluster; each public method is one API request.

Every request is retried a bounded number of times with exponential backoff on 429, 5xx and connection
errors (`Retry-After` is honoured). Anything that still fails becomes a `ClusterError` whose message names the
verb and resource, chained `from` the client's exception. Reads ask for the raw JSON (`_preload_content=False`)
so every object stays a plain dict, the shape `orch render` prints and `orchestrator.status` reads.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from orchestrator.cluster.errors import (
    RBAC_HINT,
    AlreadyExists,
    ClusterError,
    ClusterUnreachable,
    Forbidden,
    NotFound,
    Unauthorized,
)
from orchestrator.cluster.resources import (
    CONFIGMAP,
    EVENT,
    NODE,
    POD,
    POD_LOG,
    SELF_SUBJECT_ACCESS_REVIEW,
    VERSION,
    Resource,
)

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

DEFAULT_NAMESPACE = "default"
REQUEST_TIMEOUT = (10, 60)  # seconds (connect, read) for ordinary calls
FOLLOW_READ_TIMEOUT = 300  # seconds a followed log may stay silent before orch reconnects

# Tunables, from the environment so tests (and impatient users) can shorten them.
POLL_SECONDS_ENV = "ORCH_POLL_SECONDS"  # how often wait/logs -f/status re-read the job and its pods
RETRIES_ENV = "ORCH_API_RETRIES"  # retries of one API call on 429/5xx/connection errors
BACKOFF_ENV = "ORCH_API_BACKOFF_SECONDS"  # first retry delay; doubles each time, capped at MAX_BACKOFF
MAX_BACKOFF = 30.0


def poll_seconds() -> float:
    return float(os.environ.get(POLL_SECONDS_ENV, "2"))


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

    # --- discovery (open to every authenticated user; most users may not read CRDs)

    def api_resources(self, group: str, version: str, *, what: Resource | None = None) -> list[str] | None:
        """The resource names (`pods`, `pods/log`, ...) that `group/version` serves; None if it is not served.

        `what` names the resource asked about in error messages (else the group/version itself)."""
        # named like its URL path in messages: apis/kubeflow.org/v1
        probe = what or Resource(
            "", version, f"apis/{group}/{version}" if group else "api/v1", "APIResourceList"
        )
        try:
            if group:
                raw = self._call("get", probe, None, self.custom.get_api_resources, group, version)
            else:
                raw = self._call("get", probe, None, self.core.get_api_resources)
        except NotFound:
            return None
        return [str(r.get("name")) for r in _json(raw).get("resources") or []]

    def api_groups(self) -> dict[str, list[str]]:
        """Every API group the server serves, with its versions (preferred first): one discovery request."""
        from kubernetes import client

        probe = Resource("", "", "apis", "APIGroupList")
        raw = self._call("get", probe, None, client.ApisApi(self.api_client).get_api_versions)
        groups = {}
        for group in _json(raw).get("groups") or []:
            preferred = (group.get("preferredVersion") or {}).get("version")
            versions = [v.get("version") for v in group.get("versions") or [] if v.get("version")]
            groups[str(group.get("name"))] = sorted(versions, key=lambda v: v != preferred)
        return groups

    def served(self, resource: Resource) -> bool:
        """Whether API discovery lists `resource`."""
        return resource.plural in (self.api_resources(resource.group, resource.version, what=resource) or [])

    def server_version(self) -> dict[str, Any]:
        """The API server's `/version` (gitVersion, major, minor, platform...)."""
        from kubernetes import client

        return _json(self._call("get", VERSION, None, client.VersionApi(self.api_client).get_code))

    def can_i(self, verb: str, resource: Resource) -> tuple[bool, str]:
        """A SelfSubjectAccessReview: may the caller `verb` `resource` in this namespace? (allowed, reason)"""
        from kubernetes import client

        review = {
            "apiVersion": SELF_SUBJECT_ACCESS_REVIEW.api_version,
            "kind": SELF_SUBJECT_ACCESS_REVIEW.kind,
            "spec": {
                "resourceAttributes": {
                    "group": resource.group,
                    "resource": resource.plural,
                    "verb": verb,
                    "namespace": self.namespace,
                }
            },
        }
        fn = client.AuthorizationV1Api(self.api_client).create_self_subject_access_review
        answer = _json(self._call("create", SELF_SUBJECT_ACCESS_REVIEW, None, fn, review)).get("status") or {}
        return bool(answer.get("allowed")), str(answer.get("reason") or "")

    def nodes(self) -> list[dict[str, Any]]:
        return list(_json(self._call("list", NODE, None, self.core.list_node)).get("items") or [])

    # --- objects

    def create(self, resource: Resource, obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        options = {"dry_run": "All"} if dry_run else {}
        if resource == CONFIGMAP:
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
        if resource == POD:
            raw = self._call("list", resource, None, self.core.list_namespaced_pod, self.namespace, **options)
        elif resource == EVENT:
            # Only warnings are shown; the field selector saves the transfer where the server supports it.
            fn: Callable[..., Any] = self.core.list_namespaced_event
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

    def patch(self, resource: Resource, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of one custom object (orch adds ownerReferences this way)."""
        fn = self.custom.patch_namespaced_custom_object
        args = (resource.group, resource.version, self.namespace, resource.plural, name, changes)
        return _json(self._call("patch", resource, name, fn, *args))

    def delete(self, resource: Resource, name: str, *, propagation: str = "Background") -> None:
        if resource == CONFIGMAP:
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
        container: str,
        follow: bool = False,
        tail: int | None = None,
        since_seconds: int | None = None,
        timestamps: bool = False,
    ) -> Iterator[str]:
        """One container's log, line by line; with `follow`, until the container stops."""
        options: dict[str, Any] = {"container": container, "follow": follow, "timestamps": timestamps}
        if tail is not None:
            options["tail_lines"] = tail
        if since_seconds is not None:
            options["since_seconds"] = since_seconds
        import urllib3

        # A followed stream may stay quiet for long: a generous read timeout, after which the caller
        # resumes (the log follower does) instead of hanging forever on a dead connection.
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

    # --- one request: retries and translation

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
            return Unauthorized(
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
        headers: Any = e.headers or {}
        return float(headers.get("Retry-After"))
    except (TypeError, ValueError):
        return None


def _status_message(e: Any) -> str:
    """The API server's own explanation (a `Status` object's message), else the HTTP reason."""
    try:
        return str(json.loads(e.body)["message"])
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
