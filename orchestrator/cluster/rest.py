"""The Kubernetes API calls `Cluster` makes, as paths, sent through one of two transports.

- `OfficialTransport`: the official client's `ApiClient`, which does everything a kubeconfig can ask for
  (credential plugins, auth providers, proxies). `orch submit`, `doctor` and render's cluster checks use it
  (docs/decisions.md), and the follow commands fall back to it for any kubeconfig the lean one does not cover.
- `LeanTransport`: urllib3 directly (the library the official client's `RESTClientObject` sends with), for
  the follow commands (status, list, logs, wait, delete, top) when the kubeconfig's user is a bearer token or a
  client certificate (connection.py decides). Importing the `kubernetes` package costs ~0.7 CPU-s (every
  generated model, pydantic, google-auth), seven times what kubectl takes for the whole `get pods`
  (benchmarks section 10); this path never imports it.

Neither uses the generated API classes (`CoreV1Api`, `CustomObjectsApi`): orch reads raw JSON anyway.

Each method has the name and positional arguments of the generated method it replaces; keyword arguments are
the same query parameters in snake case (`label_selector`, `_continue`, `tail_lines`...). Both transports
answer the same way: the urllib3 response (unread) for a 2xx, `HttpError` for any other status, urllib3's
exceptions for a connection that failed (a TLS failure included), so the session's retries and translation
(session.py, failures.py) do not know which one sent the request.

Paths are built by `_path` from their parts: a part that client-go's request builder refuses
(apimachinery's IsValidPathSegmentName: empty, `.`, `..`, a `/` or a `%`) is refused before anything is
sent, and every part is percent-quoted, so no value (a namespace, a name, one the server returned) can
reach another namespace, kind or object, or add a query. (The commands and `orchestrator.api` refuse a bad
job name or namespace before that, naming the argument: naming.py's rules.)

Neither follows a redirect: a 3xx is handed back as an `HttpError` like any other status (failures.py says it
in one line), so a bearer token or a client certificate is never presented to a server the kubeconfig does
not name. Bodies are read as they arrive (`chunks`), bounded in size and in time (`read_body`; a stream line by
line: `lines`): a server that sends without end, or one byte at a time, cannot hold a command past its
deadline or fill its memory. `parse_json` reads JSON as an API server writes it (no NaN, no nesting past
the parser's stack).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, urlencode

from orchestrator.cluster.errors import ClusterError

if TYPE_CHECKING:
    import urllib3
    from kubernetes.client import ApiClient

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"

# What one answer may be: a list page is PAGE_SIZE objects (a few MiB of pods), an object at most the
# 1.5 MiB etcd takes; four times the largest page an API server sends in practice. Past it the server is not
# answering as an API server does (an endless stream, a file served in its place).
MAX_ANSWER_BYTES = 64 * 2**20
MAX_ERROR_BYTES = 64 * 2**10  # of a non-2xx answer: its Status message is all that is shown
CHUNK_BYTES = 64 * 2**10


class AnswerTooLarge(Exception):
    """An answer (or one line of a stream) over its bound."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"larger than {limit / 2**20:g} MiB")
        self.limit = limit


class AnswerTooSlow(Exception):
    """An answer still arriving when the deadline came (a server that trickles bytes)."""

    def __init__(self, received: int) -> None:
        super().__init__(f"its answer was still arriving after {received} bytes")
        self.received = received


def chunks(response: Any) -> Iterator[bytes]:
    """A response's body as it arrives: each piece is what one socket read gave (`read1`), so a reader sees
    lines when they come and checks its bounds between pieces, whatever the server's pace."""
    read1 = getattr(response, "read1", None)
    if read1 is None:  # a body already read (bytes, or an object holding them)
        data = response.data if hasattr(response, "data") else response
        if data:
            yield data if isinstance(data, bytes) else str(data).encode()
        return
    while chunk := read1(CHUNK_BYTES):
        yield chunk


def read_body(response: Any, *, limit: int, deadline: float | None, truncate: bool = False) -> bytes:
    """The body, at most `limit` bytes, read by `deadline` (monotonic; None: no limit but each read's
    timeout). Past either: `AnswerTooLarge` / `AnswerTooSlow`, or with `truncate` what came so far. A
    response not read to its end is closed (its connection cannot serve another request)."""
    data = bytearray()
    complete = False
    try:
        for chunk in chunks(response):
            data += chunk
            if len(data) > limit:
                if truncate:
                    break
                raise AnswerTooLarge(limit)
            if deadline is not None and time.monotonic() >= deadline:
                if truncate:
                    break
                raise AnswerTooSlow(len(data))
        else:
            complete = True
    finally:
        if not complete and hasattr(response, "close"):
            with contextlib.suppress(Exception):
                response.close()
    return bytes(data[:limit])


def lines(response: Any, *, max_line: int, cut: bool = False) -> Iterator[str]:
    """Lines from a streamed HTTP response as they arrive (the last one even without a newline). A line
    longer than `max_line` bytes is `AnswerTooLarge`, or with `cut` given in pieces of that size (a
    log line of a gigabyte is printed, not held whole)."""

    def pieces(line: bytes | bytearray) -> Iterator[str]:
        if len(line) > max_line and not cut:
            raise AnswerTooLarge(max_line)
        for start in range(0, max(len(line), 1), max_line):
            yield line[start : start + max_line].decode("utf-8", errors="replace")

    buffer = bytearray()  # the line still arriving
    # urllib3's stream: pieces of at most CHUNK_BYTES as they come (a chunked answer: each chunk), and a
    # stream cut off (a shutdown, a dropped connection) raises instead of ending as if complete
    pieces_of = getattr(response, "stream", None)
    stream = pieces_of(CHUNK_BYTES, decode_content=True) if pieces_of else chunks(response)
    for chunk in stream:
        *complete, tail = chunk.split(b"\n")
        for line in complete:
            buffer += line
            yield from (piece.rstrip("\r") for piece in pieces(buffer))
            buffer = bytearray()
        buffer += tail
        if len(buffer) > max_line:
            if not cut:
                raise AnswerTooLarge(max_line)
            whole = (len(buffer) - 1) // max_line * max_line  # the rest, 1 to max_line bytes, waits for more
            yield from pieces(buffer[:whole])
            del buffer[:whole]
    if buffer:
        yield from pieces(buffer)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(data: bytes | str) -> Any:
    """JSON as the API server writes it, or None: Python's NaN/Infinity extension is not JSON (no API
    field holds one), and nesting deep enough to exhaust the parser's stack is no API object either."""
    try:
        return json.loads(data, parse_constant=_no_constant)
    except (TypeError, ValueError, RecursionError):
        return None


def _error_body(response: Any, timeout: Any) -> str:
    """What a non-2xx answer says, bounded (MAX_ERROR_BYTES, and the attempt's read timeout in all)."""
    seconds = timeout[1] if isinstance(timeout, tuple) else timeout
    deadline = time.monotonic() + float(seconds) if seconds else None
    return _text(read_body(response, limit=MAX_ERROR_BYTES, deadline=deadline, truncate=True))


class HttpError(Exception):
    """The API server answered with a status other than 2xx (what `ApiException` carries, without importing
    the kubernetes package): `status`, `reason`, `body` (text) and `headers`."""

    def __init__(self, status: int, reason: str, body: str, headers: Any) -> None:
        super().__init__(f"({status}) Reason: {reason}")
        self.status = status
        self.reason = reason
        self.body = body
        self.headers = headers


class Transport(Protocol):
    """Sends one request; a 2xx's urllib3 response (unread), else `HttpError` or urllib3's exceptions."""

    host: str

    def send(
        self, method: str, path: str, query: list[tuple[str, Any]], headers: dict[str, str], body: Any,
        timeout: Any,
    ) -> Any: ...  # fmt: skip


class OfficialTransport:
    """Through the official client's `ApiClient` (its kubeconfig loader did the auth)."""

    def __init__(self, api_client: ApiClient) -> None:
        self.api_client = api_client
        self.host = str(api_client.configuration.host)

    def send(
        self, method: str, path: str, query: list[tuple[str, Any]], headers: dict[str, str], body: Any,
        timeout: Any,
    ) -> Any:  # fmt: skip
        import urllib3
        from kubernetes.client.exceptions import ApiException

        request = self.api_client.param_serialize(
            method=method, resource_path=path, query_params=query, header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )  # fmt: skip
        try:
            response = self.api_client.call_api(*request, _request_timeout=timeout)
        except ApiException as e:
            if e.status == 0:  # the client's RESTClientObject turns urllib3's SSLError into status 0
                raise urllib3.exceptions.SSLError(" ".join(str(e.reason).split("\n")[1:])) from e
            raise
        if not 200 <= response.status <= 299:
            text = _error_body(response.response, timeout)
            raise HttpError(response.status, str(response.reason or ""), text, response.headers)
        return response.response


class LeanTransport:
    """Through a urllib3 pool set up by connection.py (TLS context, pool size, no urllib3 retries), with the
    kubeconfig's bearer token, if any, on every request."""

    def __init__(self, host: str, pool: urllib3.PoolManager, *, token: str | None = None) -> None:
        self.host = host
        self.pool = pool
        self.token = token

    def send(
        self, method: str, path: str, query: list[tuple[str, Any]], headers: dict[str, str], body: Any,
        timeout: Any,
    ) -> Any:  # fmt: skip
        import urllib3

        url = self.host + path + (f"?{urlencode(query)}" if query else "")
        if self.token:
            headers = {**headers, "Authorization": f"Bearer {self.token}"}
        limits: Any = None
        if isinstance(timeout, tuple):
            limits = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        elif timeout:
            limits = urllib3.Timeout(total=timeout)
        data = None if body is None else json.dumps(body).encode()
        response = self.pool.request(
            method, url, body=data, headers=headers, timeout=limits, preload_content=False, redirect=False
        )
        if not 200 <= response.status <= 299:
            text = _error_body(response, timeout)
            response.release_conn()
            raise HttpError(response.status, str(response.reason or ""), text, response.headers)
        return response


def _path(*parts: str) -> str:
    """`/part/part/...`, each part quoted; refused where client-go refuses a name
    (k8s.io/apimachinery/pkg/api/validation/path/name.go, which client-go's rest.Request.Name and
    .Namespace apply)."""
    for part in parts:
        if part in ("", ".", "..") or "/" in part or "%" in part:
            raise ClusterError(
                f"refusing to send a request for the name {ascii(part)}: a name in a request path may not "
                "be empty, '.' or '..', nor contain '/' or '%'"
            )
    return "".join(f"/{quote(part, safe='')}" for part in parts)


def _text(data: Any) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data or "")


def _query_name(key: str) -> str:
    """label_selector -> labelSelector; _continue -> continue (a Python keyword in the generated client)."""
    head, *rest = key.lstrip("_").split("_")
    return head + "".join(part.capitalize() for part in rest)


def _query_value(value: Any) -> Any:
    return ("true" if value else "false") if isinstance(value, bool) else value


class Rest:
    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def call(
        self, method: str, path: str, body: Any = None, *, content_type: str = JSON, **options: Any
    ) -> Any:
        """One request; the urllib3 response (unread), or `HttpError` for any answer but 2xx."""
        timeout = options.pop("_request_timeout", None)
        options.pop("_preload_content", None)  # always raw: the caller reads the JSON
        query = [(_query_name(k), _query_value(v)) for k, v in options.items() if v is not None]
        headers = {"Accept": JSON, **({"Content-Type": content_type} if body is not None else {})}
        return self.transport.send(method, path, query, headers, body, timeout)


class CoreCalls(Rest):
    """What orch calls of the core API (`CoreV1Api`'s methods of the same names)."""

    def get_api_resources(self, **options: Any) -> Any:
        return self.call("GET", "/api/v1/", **options)

    def list_node(self, **options: Any) -> Any:
        return self.call("GET", "/api/v1/nodes", **options)

    def list_namespaced_pod(self, namespace: str, **options: Any) -> Any:
        return self.call("GET", _path("api", "v1", "namespaces", namespace, "pods"), **options)

    def read_namespaced_pod_log(self, name: str, namespace: str, **options: Any) -> Any:
        return self.call("GET", _path("api", "v1", "namespaces", namespace, "pods", name, "log"), **options)

    def list_namespaced_event(self, namespace: str, **options: Any) -> Any:
        return self.call("GET", _path("api", "v1", "namespaces", namespace, "events"), **options)

    def list_namespaced_config_map(self, namespace: str, **options: Any) -> Any:
        return self.call("GET", _path("api", "v1", "namespaces", namespace, "configmaps"), **options)

    def create_namespaced_config_map(self, namespace: str, body: Any, **options: Any) -> Any:
        return self.call("POST", _path("api", "v1", "namespaces", namespace, "configmaps"), body, **options)

    def read_namespaced_config_map(self, name: str, namespace: str, **options: Any) -> Any:
        return self.call("GET", _path("api", "v1", "namespaces", namespace, "configmaps", name), **options)

    def delete_namespaced_config_map(self, name: str, namespace: str, **options: Any) -> Any:
        return self.call("DELETE", _path("api", "v1", "namespaces", namespace, "configmaps", name), **options)


class CustomCalls(Rest):
    """What orch calls of custom resources (`CustomObjectsApi`'s methods of the same names)."""

    def get_api_resources(self, group: str, version: str, **options: Any) -> Any:
        return self.call("GET", _path("apis", group, version), **options)

    def list_cluster_custom_object(self, group: str, version: str, plural: str, **options: Any) -> Any:
        return self.call("GET", _path("apis", group, version, plural), **options)

    def list_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, **options: Any
    ) -> Any:
        return self.call("GET", _path("apis", group, version, "namespaces", namespace, plural), **options)

    def create_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: Any, **options: Any
    ) -> Any:
        return self.call(
            "POST", _path("apis", group, version, "namespaces", namespace, plural), body, **options
        )

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, **options: Any
    ) -> Any:
        return self.call(
            "GET", _path("apis", group, version, "namespaces", namespace, plural, name), **options
        )

    def patch_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any, **options: Any
    ) -> Any:
        path = _path("apis", group, version, "namespaces", namespace, plural, name)
        return self.call("PATCH", path, body, content_type=MERGE_PATCH, **options)

    def delete_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, **options: Any
    ) -> Any:
        path = _path("apis", group, version, "namespaces", namespace, plural, name)
        return self.call("DELETE", path, **options)


class ClusterCalls(Rest):
    """The rest: discovery, the server's version, access reviews, CRDs (`ApisApi.get_api_versions`,
    `VersionApi.get_code`, `AuthorizationV1Api`'s and `ApiextensionsV1Api`'s methods of the same names)."""

    def get_api_versions(self, **options: Any) -> Any:
        return self.call("GET", "/apis/", **options)

    def get_code(self, **options: Any) -> Any:
        return self.call("GET", "/version/", **options)

    def create_self_subject_access_review(self, body: Any, **options: Any) -> Any:
        return self.call("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body, **options)

    def read_custom_resource_definition(self, name: str, **options: Any) -> Any:
        return self.call(
            "GET", _path("apis", "apiextensions.k8s.io", "v1", "customresourcedefinitions", name), **options
        )
