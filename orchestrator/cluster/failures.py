"""What a failed request was, and the one line orch says about it.

`translate` makes an HTTP error answer (the transports' `rest.HttpError`, or the official client's
`ApiException`: both carry status, reason, body and headers) the `ClusterError` it is, naming the verb and
the resource. A 403 is one of two things: an RBAC refusal (`<resource> is forbidden: User "..." cannot <verb>
...`, `Forbidden`), or an admission webhook's denial (`admission webhook "<name>" denied the request: ...`;
controller-runtime sends `Denied` as 403: pkg/webhook/admission/response.go), which is `AdmissionDenied` and
says the webhook's own words. A strict decoding's 400/422 (`fieldValidation=Strict`) is `UnknownFields`,
naming the fields the cluster's CRD does not know (an older operator version).

The readers below it say what `Session`'s retries decide from (session.py): whether a status is worth
another try, the server's `Retry-After`, a connection refused or a TLS failure somewhere in a chain of
causes, and where a redirect pointed (shown without credentials or query).
"""

from __future__ import annotations

import re
import time
from typing import Any

from orchestrator.cluster import rest
from orchestrator.cluster.errors import (
    RBAC_HINT,
    AdmissionDenied,
    AlreadyExists,
    ClusterError,
    Expired,
    Forbidden,
    NotFound,
    Unauthorized,
    UnknownFields,
)
from orchestrator.kube.kinds import Resource
from orchestrator.redaction import scrub

# The API server's words for a webhook's denial (k8s.io/apiserver/pkg/admission/plugin/webhook/errors).
ADMISSION_DENIAL = re.compile(
    r'admission webhook "(?P<webhook>[^"]+)" denied the request: (?P<said>.*)', re.S
)
# A strict-decoding failure (fieldValidation=Strict): `... strict decoding error: unknown field "spec.x", ...`.
UNKNOWN_FIELD = re.compile(r'unknown field "([^"]+)"')


def translate(
    e: Any,
    verb: str,
    resource: Resource,
    name: str | None,
    *,
    server: str,
    namespace: str,
    retries: int,
    secrets: tuple[str, ...],
) -> ClusterError:
    """The `ClusterError` an HTTP error answer becomes: which one, and its one line (what was asked, where,
    the server's own words), with none of `secrets` in it."""

    def scrubbed(text: str) -> str:
        return scrub(text, secrets)

    what = f"{resource} {name}" if name else str(resource)
    where = f'in namespace "{namespace}"'
    said = scrubbed(status_message(e))
    if 300 <= e.status <= 399:
        return ClusterError(
            scrubbed(
                f"the API server at {server} answered {verb} {what} with a redirect (HTTP {e.status}) "
                f"to {location(e)}; orch follows none, so that no token or client certificate goes to a "
                "server the kubeconfig does not name: if that is the API server, make it the kubeconfig's "
                "server"
            )
        )
    if e.status == 401:
        return Unauthorized(
            f"unauthorized: the API server at {server} rejected orch's credentials "
            f"({verb} {what}): {said}. Check the kubeconfig user/token (is it expired?)"
        )
    if e.status == 403:
        if denied := admission_denial(e):
            webhook, words = denied
            return AdmissionDenied(
                scrubbed(f"the cluster's admission webhook {webhook} refused {verb} {what} {where}: {words}")
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
            f"after {retries} retries; try again later"
        )
    return ClusterError(f"{verb} {what} {where} failed: HTTP {e.status} {scrubbed(str(e.reason))}: {said}")


def reason(e: Exception) -> str:
    return str(getattr(e, "reason", None) or e)


def admission_denial(e: Any) -> tuple[str, str] | None:
    """(webhook, its words) when a 403 is an admission webhook's denial rather than an RBAC refusal."""
    if getattr(e, "status", None) != 403:
        return None
    found = ADMISSION_DENIAL.search(status_message(e))
    return (found["webhook"], found["said"].strip()) if found else None


def refused(e: Exception) -> bool:
    """Whether a connection error is "connection refused" (somewhere in its chain of causes)."""
    seen: BaseException | None = e
    for _ in range(8):  # MaxRetryError -> NewConnectionError -> ConnectionRefusedError; never a cycle
        if seen is None or isinstance(seen, ConnectionRefusedError):
            break
        reason = getattr(seen, "reason", None)
        seen = reason if isinstance(reason, BaseException) else (seen.__cause__ or seen.__context__)
    return isinstance(seen, ConnectionRefusedError)


def tls_failure(e: Exception) -> str | None:
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


def location(e: Any) -> str:
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


def retryable(status_code: int | None) -> bool:
    return status_code == 429 or (status_code is not None and 500 <= status_code <= 599)


def retry_after(e: Any) -> float | None:
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


def status_message(e: Any) -> str:
    """The API server's own explanation (a `Status` object's message), else the HTTP reason."""
    answer = rest.parse_json(getattr(e, "body", None) or "")
    message = answer.get("message") if isinstance(answer, dict) else None
    return message if isinstance(message, str) and message else str(e.reason or "")
