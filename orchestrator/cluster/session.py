"""`Session`: one namespace of one cluster, and how one request to it is made: within the deadline, retried,
its answer read and checked. `Cluster` (client.py) is a `Session` with the verbs.

Every request is retried a bounded number of times with exponential backoff on 429, 5xx and connection
errors (`Retry-After` is honoured), except a connection refused before the server ever answered this command:
nothing listens there, and waiting will not change that (it fails at once instead of after ~17 s of retries).
Anything that still fails becomes a `ClusterError` whose message names the verb and resource, chained `from` the
client's exception (failures.py: which error, and its words). A caller may name admission webhook denials
that are transient (`transient_denial`: a webhook that reads through a lagging informer cache, see
apis/trainjob.py); those are retried with backoff until the deadline.

Reads ask for the raw JSON (`_preload_content=False`) so every object stays a plain dict, the shape `orch
render` prints and `orchestrator.kube.read` reads. What the server answers is checked at this edge: an
answer that is not a JSON object (an HTML login page with 200, a list where an object belongs, list items
that are not objects) is a `ClusterError`, never a traceback further up. Parsing the objects' fields is
`orchestrator.kube.read`'s job, and total.

Deadline: talking to the API server is bounded by `request_timeout` seconds (`--request-timeout`,
$ORCH_REQUEST_TIMEOUT, default 60; 0 = no limit), retries and backoff included. By default the bound covers
every request the command makes; inside `patiently()` (waiting for a job, following logs, waiting for a
deletion) it covers each request on its own. An unresponsive server therefore ends a command after that
long, with a message that says so, instead of after retries x read timeouts (once over six minutes).

Secrets: no message leaves a session with a credential in it. The server URL is shown without its
password, and every message is scrubbed of the kubeconfig's credentials (`secrets`), including any a
server echoes back.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from orchestrator.cluster import failures, rest
from orchestrator.cluster.errors import ClusterError, ClusterUnreachable
from orchestrator.errors import UsageError
from orchestrator.kube.kinds import Resource
from orchestrator.redaction import redact_url, scrub

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

DEFAULT_NAMESPACE = "default"
CONNECT_TIMEOUT = 10.0  # seconds one attempt may take to connect
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


class Session:
    """One namespace of one cluster, the deadline and the streams open there; `_request` and `_call` make one
    request (the verbs are `Cluster`'s)."""

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

    # --- one request: retries, deadline, the answer checked

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
                self._scrub(
                    f"the answer to {verb} {resource} from {self.server} broke off: {failures.reason(e)}"
                )
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
                denied = failures.admission_denial(e)
                if denied and transient_denial is not None and transient_denial.search(denied[1]):
                    # the webhook has not seen what it looks up yet: ask again until the deadline
                    delay = min(self.backoff * 2**denials, MAX_DENIAL_BACKOFF)
                    denials += 1
                    out_of_time = deadline is not None and time.monotonic() + delay >= deadline
                    if out_of_time or (deadline is None and denials > MAX_DENIALS_UNBOUNDED):
                        raise self._translate(e, verb, resource, name) from e
                    time.sleep(delay)
                    continue
                if attempt == self.retries or not failures.retryable(e.status):
                    raise self._translate(e, verb, resource, name) from e
                last_error, delay = e, failures.retry_after(e) or self.backoff * 2**attempt
            except urllib3.exceptions.HTTPError as e:  # refused, reset, timed out, TLS...
                if deadline is not None and time.monotonic() >= deadline:
                    raise self._expired(verb, resource, name, e) from e
                # Like a refusal: TLS failing before the server ever answered will fail the same way again.
                if not self._answered and (tls := failures.tls_failure(e)):
                    raise ClusterUnreachable(
                        self._scrub(f"cannot reach the Kubernetes API at {self.server}: TLS: {tls}")
                    ) from e
                # Refused before the server ever answered: nothing listens at that address. Retrying is for
                # a server that answered and then went away for a moment (a restart, a load balancer).
                if attempt == self.retries or (failures.refused(e) and not self._answered):
                    tries = f"{attempt + 1} attempt{'s' if attempt else ''}"
                    raise ClusterUnreachable(
                        self._scrub(
                            f"cannot reach the Kubernetes API at {self.server} after {tries}: {failures.reason(e)}"
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
            said = (
                f"; last: HTTP {status} {failures.status_message(last)}"
                if status
                else f"; last: {failures.reason(last)}"
            )
        return ClusterUnreachable(
            self._scrub(
                f"the Kubernetes API at {self.server} did not answer within {seconds(self.request_timeout)} "
                f"(--request-timeout, or ${REQUEST_TIMEOUT_ENV}, sets how long orch waits): {verb} {what}{said}"
            )
        )

    def _decode(
        self, data: bytes, content_type: str | None, verb: str, resource: Resource, name: str | None
    ) -> dict[str, Any]:
        answer = rest.parse_json(data) if data else {}
        if isinstance(answer, dict):
            return answer
        raise self._not_the_api(verb, resource, name, content_type or "no content type", data)

    def _items(self, verb: str, resource: Resource, answer: dict[str, Any]) -> list[dict[str, Any]]:
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
        return failures.translate(
            e,
            verb,
            resource,
            name,
            server=self.server,
            namespace=self.namespace,
            retries=self.retries,
            secrets=self.secrets,
        )
