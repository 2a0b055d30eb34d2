"""`Cluster`: one namespace of one cluster; each public method is one API request.

Every request is retried a bounded number of times with exponential backoff on 429, 5xx and connection
errors (`Retry-After` is honoured), except a connection refused before the server ever answered this command:
nothing listens there, and waiting will not change that (it fails at once instead of after ~17 s of retries).
Anything that still fails becomes a `ClusterError` whose message names the verb and resource, chained `from` the
client's exception.

A 403 is one of two things: an RBAC refusal (`<resource> is forbidden: User "..." cannot <verb> ...`,
`Forbidden`), or an admission webhook's denial (`admission webhook "<name>" denied the request: ...`,
controller-runtime sends `Denied` as 403: pkg/webhook/admission/response.go), which is `AdmissionDenied` and
says the webhook's own words. A caller may name denials that are transient (`transient_denial`: a webhook that
reads through a lagging informer cache, see apis/trainjob.py); those are retried with backoff until the
deadline.

Creates are sent with `fieldValidation=Strict`: a field the cluster's CRD does not know (an older operator
version) is an error (`UnknownFields`, naming the fields) instead of being dropped silently. Reads ask for the raw JSON (`_preload_content=False`)
so every object stays a plain dict, the shape `orch render` prints and `orchestrator.kube.read` reads.

What the server answers is checked at this edge: an answer that is not a JSON object (an HTML login page
with 200, a list where an object belongs, list items that are not objects) is a `ClusterError`, never a
traceback further up. Parsing the objects' fields is `orchestrator.kube.read`'s job, and total.

Deadline: talking to the API server is bounded by `request_timeout` seconds (`--request-timeout`,
$ORCH_REQUEST_TIMEOUT, default 60; 0 = no limit), retries and backoff included. By default the bound covers
every request the command makes; inside `patiently()` (waiting for a job, following logs, waiting for a
deletion) it covers each request on its own. An unresponsive server therefore ends a command after that
long, with a message that says so, instead of after retries x read timeouts (once over six minutes).

Secrets: no message leaves this module with a credential in it. The server URL is shown without its
password, and every message is scrubbed of the kubeconfig's credentials (`secrets`), including any a
server echoes back.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from orchestrator.cluster import rest
from orchestrator.cluster.errors import (
    RBAC_HINT,
    AdmissionDenied,
    AlreadyExists,
    ClusterError,
    ClusterUnreachable,
    Expired,
    Forbidden,
    NotFound,
    Unauthorized,
    UnknownFields,
)
from orchestrator.errors import UsageError
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
from orchestrator.redaction import redact_url, scrub

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

DEFAULT_NAMESPACE = "default"
CONNECT_TIMEOUT = 10.0  # seconds one attempt may take to connect
FOLLOW_READ_TIMEOUT = 300  # seconds a followed log may stay silent before orch reconnects
MAX_LOG_LINE_BYTES = 2**20  # a longer log line is printed in pieces of this size (memory stays bounded)
DEFAULT_REQUEST_TIMEOUT = 60.0  # seconds orch waits for the API server, retries included (see module doc)

# Tunables, from the environment so tests (and impatient users) can shorten them.
REQUEST_TIMEOUT_ENV = "ORCH_REQUEST_TIMEOUT"  # the deadline; `--request-timeout` overrides it
POLL_SECONDS_ENV = "ORCH_POLL_SECONDS"  # how often wait/logs -f/status re-read the job and its pods
RETRIES_ENV = "ORCH_API_RETRIES"  # retries of one API call on 429/5xx/connection errors
BACKOFF_ENV = "ORCH_API_BACKOFF_SECONDS"  # first retry delay; doubles each time, capped at MAX_BACKOFF
READ_TIMEOUT_ENV = "ORCH_API_READ_TIMEOUT"  # seconds one attempt waits for an answer before retrying
MAX_BACKOFF = 30.0
MAX_DENIAL_BACKOFF = 2.0  # a transient denial lasts as long as an informer cache lags: seconds, not minutes
MAX_DENIALS_UNBOUNDED = 30  # without a deadline (--request-timeout 0): about a minute of asking again

# The API server's words for a webhook's denial (k8s.io/apiserver/pkg/admission/plugin/webhook/errors).
ADMISSION_DENIAL = re.compile(
    r'admission webhook "(?P<webhook>[^"]+)" denied the request: (?P<said>.*)', re.S
)
# A strict-decoding failure (fieldValidation=Strict): `... strict decoding error: unknown field "spec.x", ...`.
UNKNOWN_FIELD = re.compile(r'unknown field "([^"]+)"')
PAGE_SIZE = 500  # objects per list page, as kubectl's --chunk-size: a 1,000-pod list is 2 bounded answers
WATCH_SECONDS = 300  # one watch request's server-side timeout; then it is resumed from its resourceVersion


def poll_seconds() -> float:
    return _env_number(POLL_SECONDS_ENV, 2.0, minimum=0.01)


def _env_number(name: str, default: float, *, minimum: float, maximum: float = 86400.0) -> float:
    """A tunable from the environment: a finite number within [minimum, maximum], else a usage error naming
    the variable (nothing was sent yet: a negative backoff or retry count must not reach a sleep or a loop)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not minimum <= value <= maximum:  # NaN fails both comparisons
        shown = raw if len(raw) <= 20 else raw[:17] + "..."
        raise UsageError(f"${name}: {shown!r} is not a number from {minimum:g} to {maximum:g}")
    return value


def request_timeout_from_env() -> float:
    """$ORCH_REQUEST_TIMEOUT in seconds (a number, or a duration like 90s or 2m; 0: no limit), else the default."""
    from orchestrator.job.durations import parse_duration

    raw = os.environ.get(REQUEST_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_REQUEST_TIMEOUT
    if raw == "0":
        return 0.0
    try:
        return float(parse_duration(raw))
    except ValueError as e:  # nothing was sent: bad input, like a bad --request-timeout (exit 2)
        raise UsageError(f"${REQUEST_TIMEOUT_ENV}: {e}; or 0 for no limit") from None


def seconds(value: float) -> str:
    return f"{value:g}s"


class Cluster:
    """One namespace of one cluster. Methods return plain dicts and raise `ClusterError`s."""

    def __init__(
        self,
        transport: rest.Transport | ApiClient,
        namespace: str = DEFAULT_NAMESPACE,
        *,
        server: str = "",
        retries: int | None = None,
        backoff: float | None = None,
        request_timeout: float | None = None,
        secrets: Iterable[str] = (),
        kubectl_flags: tuple[str, ...] = (),
    ) -> None:
        if not hasattr(transport, "send"):  # an ApiClient (tests, callers of the official client)
            transport = rest.OfficialTransport(transport)
        self.transport: rest.Transport = transport  # type: ignore[assignment]
        self.namespace = namespace
        self.secrets = tuple(s for s in secrets if s)
        self.server = scrub(server or redact_url(self.transport.host), self.secrets)
        self.retries = (
            int(_env_number(RETRIES_ENV, 5, minimum=0, maximum=100)) if retries is None else retries
        )
        self.backoff = (
            _env_number(BACKOFF_ENV, 0.5, minimum=0, maximum=MAX_BACKOFF) if backoff is None else backoff
        )
        self.read_timeout = _env_number(READ_TIMEOUT_ENV, 60.0, minimum=0.1)
        self.request_timeout = request_timeout_from_env() if request_timeout is None else request_timeout
        self.kubectl_flags = kubectl_flags  # --context/--kubeconfig, for commands orch tells users to run
        self._per_request = False  # inside patiently(): the deadline bounds each request, not all of them
        self._deadline: float | None = None  # set by the first request (importing the client is not waiting)
        self._answered = False  # whether the server answered any request yet (a refusal then means a restart)
        self._streams: set[Any] = set()  # open watch and followed-log responses (`close_streams`)
        # The API's paths, sent through the transport (rest.py says why not CoreV1Api & co.)
        self.core = rest.CoreCalls(self.transport)
        self.custom = rest.CustomCalls(self.transport)
        self.calls = rest.ClusterCalls(self.transport)

    # --- the deadline

    def renew_deadline(self) -> None:
        """Start a new `request_timeout` window for what follows (e.g. a rollback after a timeout)."""
        self._deadline = time.monotonic() + self.request_timeout if self.request_timeout > 0 else None

    @contextlib.contextmanager
    def patiently(self) -> Iterator[None]:
        """Within: orch waits for the job, not for the server, so the deadline bounds each request alone."""
        outer = self._per_request
        self._per_request = True
        try:
            yield
        finally:
            self._per_request = outer
            self.renew_deadline()

    def close_streams(self) -> None:
        """End every open watch and followed log now (their readers see the stream break off): a command
        that is done must not leave threads blocked on sockets while the interpreter shuts down."""
        for response in list(self._streams):
            with contextlib.suppress(Exception):
                response.shutdown()

    @contextlib.contextmanager
    def _open(self, response: Any) -> Iterator[Any]:
        self._streams.add(response)
        try:
            yield response
        finally:
            self._streams.discard(response)
            if not getattr(response, "closed", True):  # left before its end (a 410 event): its rest is
                response.close()  # still to come, so the connection cannot serve another request
            response.release_conn()

    def kubectl(self, *args: str) -> str:
        """A kubectl command line for the user, aimed at this cluster and namespace."""
        return " ".join(["kubectl", *self.kubectl_flags, "-n", self.namespace, *args])

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
            for line in _lines(response, max_line=rest.MAX_ANSWER_BYTES):
                if not line.strip():
                    continue
                event = _json(line)
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
                yield from _lines(response, max_line=MAX_LOG_LINE_BYTES, cut=True)
            except (urllib3.exceptions.HTTPError, OSError) as e:
                # A followed stream breaks when the container exits or the connection drops: the follower
                # reads on from the last line it got, so the lines the server still has are not lost.
                raise ClusterUnreachable(self._scrub(f"the log stream of pod {pod} broke off: {e}")) from e

    # --- one request: retries, deadline, translation

    def _request(
        self,
        verb: str,
        resource: Resource,
        name: str | None,
        fn: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """`_call`, and its answer as a JSON object (anything else is the server's error, said so), read
        within the same deadline and at most `rest.MAX_ANSWER_BYTES`."""
        import urllib3

        deadline = self._call_deadline()
        response = self._call(verb, resource, name, fn, *args, _deadline=deadline, **kwargs)
        try:
            data = rest.read_body(response, limit=rest.MAX_ANSWER_BYTES, deadline=deadline)
        except rest.AnswerTooSlow as e:
            raise self._expired(verb, resource, name, e) from e
        except rest.AnswerTooLarge as e:
            what = f"{resource} {name}" if name else str(resource)
            raise ClusterError(
                self._scrub(
                    f"the answer to {verb} {what} from {self.server} is {e}, more than an API server sends "
                    "for one request; is the server URL in the kubeconfig right?"
                )
            ) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:  # the connection broke while the body came
            raise ClusterUnreachable(
                self._scrub(f"the answer to {verb} {resource} from {self.server} broke off: {_reason(e)}")
            ) from e
        headers = getattr(response, "headers", None) or {}
        return self._decode(data, headers.get("Content-Type"), verb, resource, name)

    def _call(
        self,
        verb: str,
        resource: Resource,
        name: str | None,
        fn: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """`fn(*args)` with bounded retries on 429/5xx/connection errors (and on a transient admission denial,
        until the deadline), within the deadline; failures become ClusterErrors. A `_request_timeout` given by
        the caller (a followed log) is kept as is."""
        import urllib3

        kwargs.setdefault("_preload_content", False)
        fixed_timeout = kwargs.pop("_request_timeout", None)
        transient_denial: re.Pattern[str] | None = kwargs.pop("_transient_denial", None)
        deadline = kwargs.pop("_deadline") if "_deadline" in kwargs else self._call_deadline()
        last_error: Exception | None = None
        attempt = denials = 0
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise self._expired(verb, resource, name, last_error)
            if fixed_timeout is not None:
                timeout: Any = fixed_timeout
            elif remaining is None:
                timeout = (CONNECT_TIMEOUT, self.read_timeout)
            else:
                timeout = (min(CONNECT_TIMEOUT, remaining), min(self.read_timeout, remaining))
            try:
                answer = fn(*args, _request_timeout=timeout, **kwargs)
                self._answered = True
                return answer
            except rest.HttpError as e:
                self._answered = True
                denied = _admission_denial(e)
                if denied and transient_denial is not None and transient_denial.search(denied[1]):
                    # the webhook has not seen what it looks up yet: ask again until the deadline
                    delay = min(self.backoff * 2**denials, MAX_DENIAL_BACKOFF)
                    denials += 1
                    out_of_time = deadline is not None and time.monotonic() + delay >= deadline
                    if out_of_time or (deadline is None and denials > MAX_DENIALS_UNBOUNDED):
                        raise self._translate(e, verb, resource, name) from e
                    time.sleep(delay)
                    continue
                if attempt == self.retries or not _retryable(e.status):
                    raise self._translate(e, verb, resource, name) from e
                last_error, delay = e, _retry_after(e) or self.backoff * 2**attempt
            except urllib3.exceptions.HTTPError as e:  # refused, reset, timed out, TLS...
                if deadline is not None and time.monotonic() >= deadline:
                    raise self._expired(verb, resource, name, e) from e
                # Like a refusal: TLS failing before the server ever answered will fail the same way again.
                if not self._answered and (tls := _tls_failure(e)):
                    raise ClusterUnreachable(
                        self._scrub(f"cannot reach the Kubernetes API at {self.server}: TLS: {tls}")
                    ) from e
                # Refused before the server ever answered: nothing listens at that address. Retrying is for
                # a server that answered and then went away for a moment (a restart, a load balancer).
                if attempt == self.retries or (_refused(e) and not self._answered):
                    tries = f"{attempt + 1} attempt{'s' if attempt else ''}"
                    raise ClusterUnreachable(
                        self._scrub(
                            f"cannot reach the Kubernetes API at {self.server} after {tries}: {_reason(e)}"
                        )
                    ) from e
                last_error, delay = e, self.backoff * 2**attempt
            attempt += 1
            delay = min(delay, MAX_BACKOFF)
            if deadline is not None and time.monotonic() + delay >= deadline:
                raise self._expired(verb, resource, name, last_error) from last_error
            time.sleep(delay)

    def _call_deadline(self) -> float | None:
        if self.request_timeout <= 0:
            return None
        if self._per_request:
            return time.monotonic() + self.request_timeout
        if self._deadline is None:
            self.renew_deadline()
        return self._deadline

    def _expired(
        self, verb: str, resource: Resource, name: str | None, last: Exception | None
    ) -> ClusterUnreachable:
        what = f"{resource} {name}" if name else str(resource)
        said = ""
        if last is not None:
            status = getattr(last, "status", None)
            said = f"; last: HTTP {status} {_status_message(last)}" if status else f"; last: {_reason(last)}"
        return ClusterUnreachable(
            self._scrub(
                f"the Kubernetes API at {self.server} did not answer within {seconds(self.request_timeout)} "
                f"(--request-timeout, or ${REQUEST_TIMEOUT_ENV}, sets how long orch waits): {verb} {what}{said}"
            )
        )

    def _decode(
        self, data: bytes, content_type: str | None, verb: str, resource: Resource, name: str | None
    ) -> dict[str, Any]:
        answer = _json(data) if data else {}
        if isinstance(answer, dict):
            return answer
        raise self._not_the_api(verb, resource, name, content_type or "no content type", data)

    def _items(self, verb: str, resource: Resource, answer: dict[str, Any]) -> builtins.list[dict[str, Any]]:
        """The `items` of a List answer; each one must be an object."""
        items = answer.get("items")
        if items is None:
            return []
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise self._not_the_api(verb, resource, None, "application/json", json.dumps(answer)[:200])
        return items

    def _not_the_api(
        self, verb: str, resource: Resource, name: str | None, content_type: str, data: Any
    ) -> ClusterError:
        what = f"{resource} {name}" if name else str(resource)
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data or "")
        text = " ".join(text.split())
        text = text if len(text) <= 80 else text[:77] + "..."
        return ClusterError(
            self._scrub(
                f"the answer to {verb} {what} from {self.server} is not a Kubernetes API answer "
                f"({content_type.split(';')[0]}: {text or 'empty'}); is the server URL in the kubeconfig "
                "right? (a proxy or a login page may be answering in its place)"
            )
        )

    def _scrub(self, text: str) -> str:
        return scrub(text, self.secrets)

    def _translate(self, e: Any, verb: str, resource: Resource, name: str | None) -> ClusterError:
        what = f"{resource} {name}" if name else str(resource)
        where = f'in namespace "{self.namespace}"'
        said = self._scrub(_status_message(e))
        if 300 <= e.status <= 399:
            return ClusterError(
                self._scrub(
                    f"the API server at {self.server} answered {verb} {what} with a redirect (HTTP {e.status}) "
                    f"to {_location(e)}; orch follows none, so that no token or client certificate goes to a "
                    "server the kubeconfig does not name: if that is the API server, make it the kubeconfig's "
                    "server"
                )
            )
        if e.status == 401:
            return Unauthorized(
                f"unauthorized: the API server at {self.server} rejected orch's credentials "
                f"({verb} {what}): {said}. Check the kubeconfig user/token (is it expired?)"
            )
        if e.status == 403:
            if denied := _admission_denial(e):
                webhook, words = denied
                return AdmissionDenied(
                    self._scrub(
                        f"the cluster's admission webhook {webhook} refused {verb} {what} {where}: {words}"
                    )
                )
            return Forbidden(f"forbidden: you may not {verb} {what} {where} ({said}). {RBAC_HINT}")
        if e.status in (400, 422) and (fields := UNKNOWN_FIELD.findall(said)) and "strict decoding" in said:
            listed = ", ".join(fields)
            return UnknownFields(
                f"the cluster's {resource.kind} CRD has no field {listed} ({verb} {what} {where}): {said}",
                fields=tuple(fields),
            )
        if e.status == 404:
            return NotFound(f"{what} not found {where}")
        if e.status == 409:
            return AlreadyExists(f"{what} already exists {where}")
        if e.status == 410:
            return Expired(f"{verb} {what} {where}: {said}")
        if e.status == 429:
            return ClusterError(
                f"{verb} {what} {where}: the API server is throttling requests (HTTP 429: {said}) and still was "
                f"after {self.retries} retries; try again later"
            )
        return ClusterError(
            f"{verb} {what} {where} failed: HTTP {e.status} {self._scrub(str(e.reason))}: {said}"
        )


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


def _reason(e: Exception) -> str:
    return str(getattr(e, "reason", None) or e)


def _admission_denial(e: Any) -> tuple[str, str] | None:
    """(webhook, its words) when a 403 is an admission webhook's denial rather than an RBAC refusal."""
    if getattr(e, "status", None) != 403:
        return None
    found = ADMISSION_DENIAL.search(_status_message(e))
    return (found["webhook"], found["said"].strip()) if found else None


def _refused(e: Exception) -> bool:
    """Whether a connection error is "connection refused" (somewhere in its chain of causes)."""
    seen: BaseException | None = e
    for _ in range(8):  # MaxRetryError -> NewConnectionError -> ConnectionRefusedError; never a cycle
        if seen is None or isinstance(seen, ConnectionRefusedError):
            break
        reason = getattr(seen, "reason", None)
        seen = reason if isinstance(reason, BaseException) else (seen.__cause__ or seen.__context__)
    return isinstance(seen, ConnectionRefusedError)


def _tls_failure(e: Exception) -> str | None:
    """What failed, when a connection error is a TLS failure (a certificate the kubeconfig's CA did not sign,
    a client certificate the server refused...): one line, without urllib3's wrapping."""
    import ssl

    import urllib3

    seen: BaseException | None = e
    tls: BaseException | None = None
    for _ in range(8):  # MaxRetryError -> SSLError -> ssl.SSLCertVerificationError
        if seen is None:
            break
        if isinstance(seen, ssl.SSLError | urllib3.exceptions.SSLError):
            tls = seen
        reason = getattr(seen, "reason", None)
        seen = reason if isinstance(reason, BaseException) else (seen.__cause__ or seen.__context__)
    if tls is None:
        return None
    said = str(getattr(tls, "verify_message", None) or getattr(tls, "reason", None) or tls)
    # the official client hands on only the text of urllib3's error: the verifier's words are inside it
    unverified = not isinstance(tls, ssl.SSLCertVerificationError) and re.search(
        r"certificate verify failed: (.+?) \(_ssl\.c", str(tls)
    )
    if unverified:
        said = unverified[1]
    said = " ".join(said.split())
    if not isinstance(tls, ssl.SSLCertVerificationError) and not unverified:
        return said
    if said.startswith("Hostname mismatch"):
        return f"certificate verify failed: {said} (the kubeconfig's server, or its tls-server-name)"
    return f"certificate verify failed: {said} (is the kubeconfig's certificate-authority the cluster's CA?)"


def _location(e: Any) -> str:
    """Where a redirect points, shown without credentials or query (either may hold a token)."""
    from urllib.parse import urlsplit

    try:
        raw = str((e.headers or {}).get("Location") or "")
        parts = urlsplit(raw)
        host, port = parts.hostname, parts.port
    except (AttributeError, TypeError, ValueError):  # a Location that is no URL (a bad port, a bad host)
        return "an unreadable Location"
    if not raw:
        return "no Location"
    where = f"{parts.scheme}://{host}{f':{port}' if port else ''}" if host else "this server"
    shown = where + parts.path
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _retryable(status_code: int | None) -> bool:
    return status_code == 429 or (status_code is not None and 500 <= status_code <= 599)


def _retry_after(e: Any) -> float | None:
    """The server's `Retry-After` in seconds (RFC 9110: a number of seconds or an HTTP date), None if it
    sent none or nothing readable (then orch's own backoff). Never negative; the caller caps it."""
    try:
        headers: Any = e.headers or {}
        raw = str(headers.get("Retry-After") or "").strip()
    except (AttributeError, TypeError):
        return None
    if not raw:
        return None
    if re.fullmatch(r"[0-9]+", raw):
        # a 1000-digit number means "later", not an int to convert
        return float(raw) if len(raw) <= 9 else 1e9
    import email.utils

    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # RFC 9110's dates are GMT; a date without a zone is not one of them
        return None
    return max(0.0, when.timestamp() - time.time())


def _status_message(e: Any) -> str:
    """The API server's own explanation (a `Status` object's message), else the HTTP reason."""
    answer = _json(getattr(e, "body", None) or "")
    message = answer.get("message") if isinstance(answer, dict) else None
    return message if isinstance(message, str) and message else str(e.reason or "")


def _lines(response: Any, *, max_line: int, cut: bool = False) -> Iterator[str]:
    """Lines from a streamed HTTP response as they arrive (the last one even without a newline). A line
    longer than `max_line` bytes is `rest.AnswerTooLarge`, or with `cut` given in pieces of that size (a
    log line of a gigabyte is printed, not held whole)."""

    def pieces(line: bytes | bytearray) -> Iterator[str]:
        if len(line) > max_line and not cut:
            raise rest.AnswerTooLarge(max_line)
        for start in range(0, max(len(line), 1), max_line):
            yield line[start : start + max_line].decode("utf-8", errors="replace")

    buffer = bytearray()  # the line still arriving
    # urllib3's stream: pieces of at most CHUNK_BYTES as they come (a chunked answer: each chunk), and a
    # stream cut off (a shutdown, a dropped connection) raises instead of ending as if complete
    pieces_of = getattr(response, "stream", None)
    stream = pieces_of(rest.CHUNK_BYTES, decode_content=True) if pieces_of else rest.chunks(response)
    for chunk in stream:
        *complete, tail = chunk.split(b"\n")
        for line in complete:
            buffer += line
            yield from (piece.rstrip("\r") for piece in pieces(buffer))
            buffer = bytearray()
        buffer += tail
        if len(buffer) > max_line:
            if not cut:
                raise rest.AnswerTooLarge(max_line)
            whole = (len(buffer) - 1) // max_line * max_line  # the rest, 1 to max_line bytes, waits for more
            yield from pieces(buffer[:whole])
            del buffer[:whole]
    if buffer:
        yield from pieces(buffer)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json(data: bytes | str) -> Any:
    """JSON as the API server writes it, or None: Python's NaN/Infinity extension is not JSON (no API
    field holds one), and nesting deep enough to exhaust the parser's stack is no API object either."""
    try:
        return json.loads(data, parse_constant=_no_constant)
    except (TypeError, ValueError, RecursionError):
        return None
