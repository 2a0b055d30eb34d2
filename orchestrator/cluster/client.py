"""`Cluster`: one namespace of one cluster; each public method is one API request.

A `Cluster` is a `Session` (session.py: the deadline, bounded retries, the answer read and checked as a
JSON object, failures translated by failures.py) with the verbs: discovery (open to every authenticated
user), then the objects: create, get, list (in pages), watch and observe (list, then watch from there), patch,
delete, and a container's log line by line.

Creates are sent with `fieldValidation=Strict`: a field the cluster's CRD does not know (an older operator
version) is an error (`UnknownFields`, naming the fields) instead of being dropped silently. Every answer
stays a plain dict, the shape `orch render` prints and `orchestrator.kube.read` reads.
"""

from __future__ import annotations

import builtins
import math
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.cluster import rest
from orchestrator.cluster.errors import ClusterError, ClusterUnreachable, Expired, NotFound
from orchestrator.cluster.session import CONNECT_TIMEOUT, Session
from orchestrator.kube.kinds import (
    CONFIGMAP,
    CRD,
    EVENT,
    NODE,
    POD,
    POD_LOG,
    SELF_SUBJECT_ACCESS_REVIEW,
    VERSION,
    Resource,
)

FOLLOW_READ_TIMEOUT = 300  # seconds a followed log may stay silent before orch reconnects
MAX_LOG_LINE_BYTES = 2**20  # a longer log line is printed in pieces of this size (memory stays bounded)
PAGE_SIZE = 500  # objects per list page, as kubectl's --chunk-size: a 1,000-pod list is 2 bounded answers
WATCH_SECONDS = 300  # one watch request's server-side timeout; then it is resumed from its resourceVersion


class Cluster(Session):
    """One namespace of one cluster. Methods return plain dicts and raise `ClusterError`s."""

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
                answer = self._request("get", probe, None, self.custom.get_api_resources, group, version)
            else:
                answer = self._request("get", probe, None, self.core.get_api_resources)
        except NotFound:
            return None
        resources = answer.get("resources")
        return (
            [str(r.get("name")) for r in resources if isinstance(r, dict)]
            if isinstance(resources, list)
            else []
        )

    def api_groups(self) -> dict[str, list[str]]:
        """Every API group the server serves, with its versions (preferred first): one discovery request."""
        probe = Resource("", "", "apis", "APIGroupList")
        answer = self._request("get", probe, None, self.calls.get_api_versions)
        groups: dict[str, list[str]] = {}
        listed = answer.get("groups")
        for group in listed if isinstance(listed, list) else []:
            if not isinstance(group, dict) or not isinstance(group.get("name"), str):
                continue
            preferred = group.get("preferredVersion")
            preferred_version = preferred.get("version") if isinstance(preferred, dict) else None
            entries = group.get("versions")
            versions = [
                v["version"]
                for v in (entries if isinstance(entries, list) else [])
                if isinstance(v, dict) and isinstance(v.get("version"), str)
            ]
            groups[group["name"]] = sorted(versions, key=lambda v: v != preferred_version)
        return groups

    def served(self, resource: Resource) -> bool:
        """Whether API discovery lists `resource`."""
        return resource.plural in (self.api_resources(resource.group, resource.version, what=resource) or [])

    def server_version(self) -> dict[str, Any]:
        """The API server's `/version` (gitVersion, major, minor, platform...)."""
        return self._request("get", VERSION, None, self.calls.get_code)

    def can_i(self, verb: str, resource: Resource) -> tuple[bool, str]:
        """A SelfSubjectAccessReview: may the caller `verb` `resource` in this namespace? (allowed, reason)"""
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
        fn = self.calls.create_self_subject_access_review
        answer = self._request("create", SELF_SUBJECT_ACCESS_REVIEW, None, fn, review).get("status")
        answer = answer if isinstance(answer, dict) else {}
        reason = answer.get("reason")
        return answer.get("allowed") is True, reason if isinstance(reason, str) else ""

    def crd(self, name: str) -> dict[str, Any]:
        """A CustomResourceDefinition (cluster-scoped: many users may not read it; a Forbidden then)."""
        fn = self.calls.read_custom_resource_definition
        return self._request("get", CRD, name, fn, name)

    def nodes(self) -> list[dict[str, Any]]:
        return self._items("list", NODE, self._request("list", NODE, None, self.core.list_node))

    # --- objects

    def create(
        self,
        resource: Resource,
        obj: dict[str, Any],
        *,
        dry_run: bool = False,
        transient_denial: re.Pattern[str] | None = None,
    ) -> dict[str, Any]:
        """Create `obj` (fieldValidation=Strict). A webhook denial matching `transient_denial` is retried."""
        name = obj["metadata"]["name"]
        options: dict[str, Any] = {"field_validation": "Strict", **({"dry_run": "All"} if dry_run else {})}
        if transient_denial is not None:
            options["_transient_denial"] = transient_denial
        if resource == CONFIGMAP:
            fn: Callable[..., Any] = self.core.create_namespaced_config_map
            return self._request("create", resource, name, fn, self.namespace, obj, **options)
        fn = self.custom.create_namespaced_custom_object
        args = (resource.group, resource.version, self.namespace, resource.plural, obj)
        return self._request("create", resource, name, fn, *args, **options)

    def get(self, resource: Resource, name: str) -> dict[str, Any]:
        """One object of orch's CRDs, or one of its ConfigMaps (pods come from `list`)."""
        if resource == CONFIGMAP:
            fn: Callable[..., Any] = self.core.read_namespaced_config_map
            return self._request("get", resource, name, fn, name, self.namespace)
        args = (resource.group, resource.version, self.namespace, resource.plural, name)
        return self._request("get", resource, name, self.custom.get_namespaced_custom_object, *args)

    def find(self, resource: Resource, name: str) -> dict[str, Any] | None:
        try:
            return self.get(resource, name)
        except NotFound:
            return None

    def list(
        self, resource: Resource, *, selector: str | None = None, all_namespaces: bool = False
    ) -> list[dict[str, Any]]:
        return self.list_versioned(resource, selector=selector, all_namespaces=all_namespaces)[0]

    def list_versioned(
        self,
        resource: Resource,
        *,
        selector: str | None = None,
        name: str | None = None,
        all_namespaces: bool = False,
    ) -> tuple[builtins.list[dict[str, Any]], str]:
        """Every object, read in pages of `PAGE_SIZE` (`limit`/`continue`), and the list's resourceVersion
        (where a watch of what changes next starts). A continue token that expired (410) restarts the list,
        as client-go's pager does."""
        options: dict[str, Any] = {"label_selector": selector} if selector else {}
        if name is not None:
            options["field_selector"] = f"metadata.name={_selector_value(name)}"
        if resource == EVENT:
            # Only warnings are shown; the field selector saves the transfer where the server supports it.
            options["field_selector"] = "type=Warning"
        fn, args = self._list_call(resource, all_namespaces)
        items: builtins.list[dict[str, Any]] = []
        token = ""
        while True:
            page = {"limit": PAGE_SIZE, **({"_continue": token} if token else {})}
            try:
                answer = self._request("list", resource, None, fn, *args, **options, **page)
            except Expired:
                if not token:
                    raise
                items, token = [], ""  # the snapshot is gone: start over
                continue
            items += self._items("list", resource, answer)
            meta = answer.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            token = str(meta.get("continue") or "")
            if not token:
                return items, str(meta.get("resourceVersion") or "")

    def _list_call(
        self, resource: Resource, all_namespaces: bool
    ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """The client function that lists `resource` (or watches it, with watch=True), and its arguments."""
        if resource == POD:
            return self.core.list_namespaced_pod, (self.namespace,)
        if resource == CONFIGMAP:
            return self.core.list_namespaced_config_map, (self.namespace,)
        if resource == EVENT:
            return self.core.list_namespaced_event, (self.namespace,)
        if all_namespaces:
            return self.custom.list_cluster_custom_object, (resource.group, resource.version, resource.plural)
        fn = self.custom.list_namespaced_custom_object
        return fn, (resource.group, resource.version, self.namespace, resource.plural)

    def watch(
        self,
        resource: Resource,
        *,
        resource_version: str,
        selector: str | None = None,
        name: str | None = None,
        seconds: float = WATCH_SECONDS,
    ) -> Iterator[dict[str, Any]]:
        """One watch request: the changes after `resource_version`, as {type, object} events, until the
        server ends it (after `seconds`). Raises `Expired` if that version is too old: list again."""

        options: dict[str, Any] = {
            "watch": True,
            "resource_version": resource_version,
            "timeout_seconds": max(1, math.ceil(seconds)),
            "allow_watch_bookmarks": True,
            # the server ends the watch after `seconds`; a few more for the last bookmark to arrive
            "_request_timeout": (CONNECT_TIMEOUT, math.ceil(seconds) + 30),
        }
        if selector:
            options["label_selector"] = selector
        if name is not None:
            options["field_selector"] = f"metadata.name={_selector_value(name)}"
        fn, args = self._list_call(resource, False)
        response = self._call("watch", resource, name, fn, *args, **options)
        with self._open(response):
            yield from self._events(response, resource, name)

    def _events(self, response: Any, resource: Resource, name: str | None) -> Iterator[dict[str, Any]]:
        import urllib3

        try:
            for line in rest.lines(response, max_line=rest.MAX_ANSWER_BYTES):
                if not line.strip():
                    continue
                event = rest.parse_json(line)
                if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
                    raise self._not_the_api("watch", resource, name, "application/json", line)
                if event.get("type") == "ERROR":
                    status_obj = event["object"]
                    message = self._scrub(str(status_obj.get("message") or ""))
                    if status_obj.get("code") == 410:
                        raise Expired(f"watch {resource}: {message}")
                    raise ClusterError(f"watch {resource} failed: HTTP {status_obj.get('code')} {message}")
                yield event
        except rest.AnswerTooLarge as e:
            raise self._not_the_api("watch", resource, name, "application/json", f"an event {e}") from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise ClusterUnreachable(self._scrub(f"the watch of {resource} broke off: {e}")) from e

    def observe(
        self,
        resource: Resource,
        *,
        selector: str | None = None,
        name: str | None = None,
        until: float | None = None,
    ) -> Iterator[tuple[str, dict[str, Any] | None, dict[str, dict[str, Any]]]]:
        """List, then watch from the list's resourceVersion, resuming each watch where the last one ended;
        a 410 Gone (the version was compacted) lists again. Yields (change, object, current objects by name):
        ("SYNC", None, all) after each list, then ("ADDED"|"MODIFIED"|"DELETED", object, all) per change.
        Ends at the monotonic time `until` (never, if None). Requests per minute do not grow with the number
        of objects: after the list, one watch request every `WATCH_SECONDS`."""
        version = ""
        current: dict[str, dict[str, Any]] = {}
        while until is None or time.monotonic() < until:
            if not version:
                items, version = self.list_versioned(resource, selector=selector, name=name)
                current = {_name(obj): obj for obj in items}
                yield "SYNC", None, current
            seconds = WATCH_SECONDS if until is None else min(WATCH_SECONDS, until - time.monotonic())
            if seconds <= 0:
                return
            try:
                for event in self.watch(resource, resource_version=version, selector=selector, name=name,
                                        seconds=seconds):  # fmt: skip
                    obj, change = event["object"], str(event.get("type"))
                    version = _resource_version(obj) or version
                    if change == "BOOKMARK":
                        continue
                    if change == "DELETED":
                        current.pop(_name(obj), None)
                    else:
                        current[_name(obj)] = obj
                    yield change, obj, current
            except Expired:
                version = ""  # list again

    def patch(self, resource: Resource, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of one custom object (orch adds ownerReferences this way)."""
        fn = self.custom.patch_namespaced_custom_object
        args = (resource.group, resource.version, self.namespace, resource.plural, name, changes)
        return self._request("patch", resource, name, fn, *args)

    def delete(
        self, resource: Resource, name: str, *, propagation: str = "Background", dry_run: bool = False
    ) -> None:
        options = {"propagation_policy": propagation, **({"dry_run": "All"} if dry_run else {})}
        if resource == CONFIGMAP:
            fn: Callable[..., Any] = self.core.delete_namespaced_config_map
            self._request("delete", resource, name, fn, name, self.namespace, **options)
        else:
            fn = self.custom.delete_namespaced_custom_object
            args = (resource.group, resource.version, self.namespace, resource.plural, name)
            self._request("delete", resource, name, fn, *args, **options)

    def log_lines(
        self,
        pod: str,
        *,
        container: str,
        follow: bool = False,
        tail: int | None = None,
        since_seconds: int | None = None,
        timestamps: bool = False,
        opened: Callable[[Any], None] | None = None,
    ) -> Iterator[str]:
        """One container's log, line by line; with `follow`, until the container stops. `opened(response)`
        hears the open stream, so a caller can end it (`response.shutdown()`) from another thread."""
        options: dict[str, Any] = {"container": container, "follow": follow, "timestamps": timestamps}
        if tail is not None:
            options["tail_lines"] = tail
        if since_seconds is not None:
            options["since_seconds"] = since_seconds
        import urllib3

        # A followed stream may stay quiet for long: a generous read timeout, after which the caller
        # resumes (the log follower does) instead of hanging forever on a dead connection.
        if follow:
            options["_request_timeout"] = (CONNECT_TIMEOUT, FOLLOW_READ_TIMEOUT)
        fn = self.core.read_namespaced_pod_log
        response = self._call("get", POD_LOG, pod, fn, pod, self.namespace, **options)
        with self._open(response):
            if opened is not None:
                opened(response)
            try:
                yield from rest.lines(response, max_line=MAX_LOG_LINE_BYTES, cut=True)
            except (urllib3.exceptions.HTTPError, OSError) as e:
                # A followed stream breaks when the container exits or the connection drops: the follower
                # reads on from the last line it got, so the lines the server still has are not lost.
                raise ClusterUnreachable(self._scrub(f"the log stream of pod {pod} broke off: {e}")) from e


def _name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, dict) else ""


def _selector_value(value: str) -> str:
    """A field selector's value escaped as apimachinery's fields.EscapeValue does (`\\`, `,`, `=`): a name
    cannot add a term to the selector."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def _resource_version(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""
