"""The transport attacked (issue #33): what a hostile or unlucky server, kubeconfig or environment gives orch,
through both transports (rest.py: the lean one and the unpatched official client), each ending in one line, the
right exit code, nothing sent that should not be, no credential shown.

The servers are real HTTP(S) servers on 127.0.0.1: tests/fakes/scripted.py answers what no API server does on
purpose (a redirect, an endless or trickling body, odd Retry-After values); certificates come from
tests/fakes/tls.py.
"""

from __future__ import annotations

import base64
import time
import warnings
from pathlib import Path

import pytest

from orchestrator import cluster
from orchestrator.cluster import client, rest
from orchestrator.cluster.rest import LeanTransport, OfficialTransport
from orchestrator.kube.kinds import POD, Resource
from tests.cluster.test_faults import one_error_line
from tests.cluster.test_transport import kubeconfig
from tests.fakes.cli import FAST, run_orch
from tests.fakes.scripted import EMPTY_LIST, Request, scripted
from tests.fakes.tls import Certificates, make_certificates

TOKEN = {"token": "tok-s3cr3t"}
JOBS = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
TRANSPORTS = [True, False]
TRANSPORT_IDS = ["lean", "official"]


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in FAST.items():
        monkeypatch.setenv(key, value)


@pytest.fixture(scope="module")
def certificates() -> Certificates:
    return make_certificates()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def connect(path: Path, *, lean: bool, request_timeout: float | None = None) -> cluster.Cluster:
    connected = cluster.connect(
        cluster.Target(kubeconfig=str(path), request_timeout=request_timeout), lean=lean
    )
    assert isinstance(connected.transport, LeanTransport if lean else OfficialTransport)
    return connected


def always(status: int, body: bytes | str | dict = b"", headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    def script(request: Request) -> None:
        request.answer(status, body, headers)

    return script


# --- redirects: nothing is followed, so no credential reaches another server --------------------------------


@pytest.mark.parametrize("lean", TRANSPORTS, ids=TRANSPORT_IDS)
def test_a_redirect_is_not_followed_with_a_token(tmp_path, lean):
    with scripted(always(200, EMPTY_LIST)) as elsewhere:
        target = f"{elsewhere.url}/api/v1/namespaces/team-a/pods?token=tok-in-the-query"
        with scripted(always(302, b"", {"Location": target})) as api:
            connected = connect(kubeconfig(tmp_path / "kc", api.url, TOKEN), lean=lean)
            with pytest.raises(cluster.ClusterError) as raised:
                connected.list(POD)
    assert str(raised.value) == (
        f"the API server at {api.url} (context x) answered list pods with a redirect (HTTP 302) to "
        f"{elsewhere.url}/api/v1/namespaces/team-a/pods; orch follows none, so that no token or client "
        "certificate goes to a server the kubeconfig does not name: if that is the API server, make it the "
        "kubeconfig's server"
    )
    assert len(api.requests) == 1  # not retried: a redirect says the same the next time
    assert elsewhere.requests == []


@pytest.mark.parametrize("lean", TRANSPORTS, ids=TRANSPORT_IDS)
def test_a_redirect_is_not_followed_with_a_client_certificate(tmp_path, certificates, lean):
    user = {
        "client-certificate-data": b64(certificates.client.cert),
        "client-key-data": b64(certificates.client.key),
    }
    ca = {"certificate-authority-data": b64(certificates.ca.cert)}
    elsewhere_tls = certificates.server_context(tmp_path, require_client_cert=False)
    (tmp_path / "api").mkdir()
    api_tls = certificates.server_context(tmp_path / "api")
    with scripted(always(200, EMPTY_LIST), tls=elsewhere_tls) as elsewhere:
        redirect = always(307, b"", {"Location": f"{elsewhere.url}/api/v1/namespaces/team-a/pods"})
        with scripted(redirect, tls=api_tls) as api:
            connected = connect(kubeconfig(tmp_path / "kc", api.url, user, ca), lean=lean)
            with pytest.raises(cluster.ClusterError, match=r"with a redirect \(HTTP 307\)"):
                connected.list(POD)
    assert [r.client_certificate for r in api.requests] == [True]
    assert elsewhere.requests == []


# --- throttling and server errors ------------------------------------------------------------------------


def throttled_then(times: int, retry_after: str):  # type: ignore[no-untyped-def]
    """429 with this Retry-After `times` times, then an empty list; the request times are kept."""
    answered: list[float] = []

    def script(request: Request) -> None:
        answered.append(time.monotonic())
        if len(answered) <= times:
            request.answer(429, {"kind": "Status", "message": "slow down"}, {"Retry-After": retry_after})
        else:
            request.answer(200, EMPTY_LIST)

    return script, answered


@pytest.mark.parametrize(
    "retry_after", ["-5", "nan", "inf", "1e999", "soon", "", "Wed, 21 Oct 2015 07:28:00 GMT", "²", "1.5"]
)
@pytest.mark.parametrize("lean", TRANSPORTS, ids=TRANSPORT_IDS)
def test_odd_retry_after_values_fall_back_to_orchs_backoff(tmp_path, lean, retry_after):
    """Before: a negative or NaN Retry-After reached time.sleep (ValueError, a traceback). Now what is not a
    number of seconds or an HTTP date is orch's own backoff, and a date gone by is no wait."""
    script, answered = throttled_then(2, retry_after)
    with scripted(script) as api:
        assert connect(kubeconfig(tmp_path / "kc", api.url, TOKEN), lean=lean).list(POD) == []
    assert len(answered) == 3


@pytest.mark.parametrize("retry_after", ["3600", "99999999999999999999999"])
@pytest.mark.parametrize("lean", TRANSPORTS, ids=TRANSPORT_IDS)
def test_a_retry_after_past_the_deadline_is_said_at_once(tmp_path, lean, retry_after):
    """Waits are capped (30 s); one that would end after the command's deadline is not begun."""
    script, answered = throttled_then(1, retry_after)
    with scripted(script) as api:
        connected = connect(kubeconfig(tmp_path / "kc", api.url, TOKEN), lean=lean, request_timeout=20)
        with pytest.raises(cluster.ClusterUnreachable) as raised:
            connected.list(POD)
    assert str(raised.value).endswith("did not answer within 20s (--request-timeout, or $ORCH_REQUEST_TIMEOUT, "
                                      "sets how long orch waits): list pods; last: HTTP 429 slow down")  # fmt: skip
    assert len(answered) == 1


@pytest.mark.parametrize("lean", TRANSPORTS, ids=TRANSPORT_IDS)
def test_retry_after_is_honoured(tmp_path, lean):
    script, answered = throttled_then(1, "1")
    with scripted(script) as api:
        assert connect(kubeconfig(tmp_path / "kc", api.url, TOKEN), lean=lean).list(POD) == []
    assert answered[1] - answered[0] >= 1.0  # FAST's backoff is 0.01 s: this wait is the server's


@pytest.mark.parametrize("lean", TRANSPORTS, ids=TRANSPORT_IDS)
def test_throttling_that_never_ends_is_bounded_and_said(tmp_path, lean):
    script, answered = throttled_then(1000, "0")
    with scripted(script) as api:
        connected = connect(kubeconfig(tmp_path / "kc", api.url, TOKEN), lean=lean)
        with pytest.raises(cluster.ClusterError) as raised:
            connected.list(POD)
    assert str(raised.value) == (
        'list pods in namespace "team-a": the API server is throttling requests (HTTP 429: slow down) and '
        "still was after 3 retries; try again later"
    )
    assert len(answered) == 4  # FAST: 3 retries


@pytest.mark.parametrize(("status", "tries"), [(500, 4), (503, 4), (401, 1), (403, 1), (404, 1), (418, 1)])
@pytest.mark.parametrize("lean", TRANSPORTS, ids=TRANSPORT_IDS)
def test_error_statuses_are_retried_only_when_waiting_can_help(tmp_path, lean, status, tries):
    body = {"kind": "Status", "message": "said by the server with tok-s3cr3t in it"}
    with scripted(always(status, body)) as api:
        connected = connect(kubeconfig(tmp_path / "kc", api.url, TOKEN), lean=lean)
        with pytest.raises(cluster.ClusterError) as raised:
            connected.get(JOBS, "demo")
    assert len(api.requests) == tries
    assert "tok-s3cr3t" not in str(raised.value) and "\n" not in str(raised.value)
    assert api.requests[0].headers["authorization"] == "Bearer tok-s3cr3t"


# --- answers that are not an API server's ------------------------------------------------------------------


def trickle(request: Request) -> None:
    """Headers at once, then the body a byte at a time: each read returns in time, the whole never does."""
    request.handler.send_response(200)
    request.handler.send_header("Content-Type", "application/json")
    request.handler.send_header("Content-Length", "100000")
    request.handler.end_headers()
    while not request.stopping.wait(0.1):
        request.wfile.write(b" ")
        request.wfile.flush()


def endless(request: Request) -> None:
    request.handler.send_response(200)
    request.handler.send_header("Content-Type", "application/json")
    request.handler.end_headers()  # no length: the body ends when the connection does (never)
    request.wfile.write(b'{"items": [')
    while not request.stopping.is_set():
        request.wfile.write(b'{"a": 1},' * 10_000)


@pytest.mark.parametrize("lean", TRANSPORTS, ids=TRANSPORT_IDS)
def test_a_trickling_answer_ends_at_the_deadline(tmp_path, lean):
    """Before: the read timeout is per socket read, so a byte every 0.1 s held the command for ever."""
    with scripted(trickle) as api:
        connected = connect(kubeconfig(tmp_path / "kc", api.url, TOKEN), lean=lean, request_timeout=1)
        started = time.monotonic()
        with pytest.raises(cluster.ClusterUnreachable) as raised:
            connected.list(POD)
    assert time.monotonic() - started < 60  # far above the 1 s it takes; before, it never ended
    assert str(raised.value).startswith(
        f"the Kubernetes API at {api.url} (context x) did not answer within 1s (--request-timeout, or "
        "$ORCH_REQUEST_TIMEOUT, sets how long orch waits): list pods; last: its answer was still arriving after "
    )


@pytest.mark.parametrize("lean", TRANSPORTS, ids=TRANSPORT_IDS)
def test_an_endless_answer_is_cut_at_its_bound(tmp_path, lean, monkeypatch):
    """Before: read whole into memory until the machine ran out. The bound (64 MiB) is lowered here so the
    test moves 1 MiB, not 64."""
    monkeypatch.setattr(rest, "MAX_ANSWER_BYTES", 2**20)
    with scripted(endless) as api:
        connected = connect(kubeconfig(tmp_path / "kc", api.url, TOKEN), lean=lean)
        with pytest.raises(cluster.ClusterError) as raised:
            connected.list(POD)
    assert str(raised.value) == (
        f"the answer to list pods from {api.url} (context x) is larger than 1 MiB, more than an API server "
        "sends for one request; is the server URL in the kubeconfig right?"
    )


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000, b'{"items": [{"metadata": {"name": NaN}}]}', b'{"items": Infinity}', b"\xff\xfe{"],
    ids=["nested-too-deep", "NaN", "Infinity", "not-utf8"],
)
@pytest.mark.parametrize("lean", TRANSPORTS, ids=TRANSPORT_IDS)
def test_json_no_api_server_writes(tmp_path, lean, body):
    """Before: nesting past the parser's stack was a RecursionError (a traceback); NaN was let in."""
    with scripted(always(200, body)) as api:
        connected = connect(kubeconfig(tmp_path / "kc", api.url, TOKEN), lean=lean)
        with pytest.raises(cluster.ClusterError, match="is not a Kubernetes API answer"):
            connected.list(POD)


def test_a_log_line_of_megabytes_is_printed_in_pieces(tmp_path, monkeypatch):
    """Before: a log line was held whole until its newline (a container writing without one filled memory)."""
    monkeypatch.setattr(client, "MAX_LOG_LINE_BYTES", 1000)
    with scripted(always(200, b"x" * 2500 + b"\nend\n", {"Content-Type": "text/plain"})) as api:
        connected = connect(kubeconfig(tmp_path / "kc", api.url, TOKEN), lean=True)
        lines = list(connected.log_lines("demo-master-0", container="pytorch"))
    assert lines == ["x" * 1000, "x" * 1000, "x" * 500, "end"]


def test_a_watch_event_past_the_bound_is_said(tmp_path, monkeypatch):
    monkeypatch.setattr(rest, "MAX_ANSWER_BYTES", 1000)
    with scripted(always(200, b'{"type": "ADDED", "object": {"x": "' + b"y" * 5000, {})) as api:
        connected = connect(kubeconfig(tmp_path / "kc", api.url, TOKEN), lean=True)
        with pytest.raises(
            cluster.ClusterError, match="is not a Kubernetes API answer .*an event larger than"
        ):
            list(connected.watch(POD, resource_version="1"))


# --- kubeconfigs: TLS settings and the server URL, checked before anything is sent -----------------------


@pytest.fixture
def pki(tmp_path: Path, certificates: Certificates) -> Path:
    (tmp_path / "pki").mkdir()
    for name, data in (("ca.crt", certificates.ca.cert), ("me.crt", certificates.client.cert),
                       ("me.key", certificates.client.key), ("empty.pem", b"not a pem\n")):  # fmt: skip
        (tmp_path / "pki" / name).write_bytes(data)
    return tmp_path / "pki"


BAD_TLS = [
    (
        {"token": "t"}, {"certificate-authority": "pki/nope.crt"},
        "clusters.c.certificate-authority: No such file or directory: {tmp}/pki/nope.crt",
    ),
    (
        {"client-certificate": "pki/nope.crt", "client-key": "pki/me.key"}, {},
        "users.u.client-certificate: No such file or directory: {tmp}/pki/nope.crt",
    ),
    (
        {"client-certificate": "pki/me.crt", "client-key": "pki/nope.key"}, {},
        "users.u.client-key: No such file or directory: {tmp}/pki/nope.key",
    ),
    (
        {"client-certificate": "pki/empty.pem", "client-key": "pki/me.key"}, {},
        "cannot use it: users.u.client-certificate: holds no PEM certificate",
    ),
    (
        {"client-certificate": "pki/me.crt", "client-key": "pki/me.crt"}, {},
        "cannot use it: users.u.client-key: holds no PEM private key",
    ),
    (
        {"token": "t"}, {"certificate-authority-data": "!!not base64!!"},
        "cannot use it: clusters.c.certificate-authority-data: not base64",
    ),
    (
        {"token": "t"}, {"certificate-authority-data": b64(b"hello")},
        "cannot use it: clusters.c.certificate-authority-data: holds no PEM certificate",
    ),
    (
        {"token": "t"}, {"certificate-authority": "pki/empty.pem"},
        "cannot use it: clusters.c.certificate-authority: holds no PEM certificate",
    ),
    (
        {"token": "t"}, {"certificate-authority": "pki/ca.crt", "certificate-authority-data": b64(b"x")},
        "clusters.c: both certificate-authority and certificate-authority-data are set (kubectl refuses that "
        "too); keep one",
    ),
    (
        {"client-certificate": "pki/me.crt", "client-certificate-data": b64(b"x"), "client-key": "pki/me.key"},
        {}, "users.u: both client-certificate and client-certificate-data are set",
    ),
    (
        {"token": "t"}, {"certificate-authority": "pki/ca.crt", "insecure-skip-tls-verify": True},
        "clusters.c: insecure-skip-tls-verify beside a certificate-authority: one says verify the server with "
        "it, the other do not verify (kubectl refuses the pair too); remove one",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("user", "cluster_fields", "expected"), BAD_TLS)
@pytest.mark.parametrize("args", [("list",), ("submit", "JOB")], ids=["lean", "official"])
def test_tls_settings_that_do_not_load_are_one_line_naming_the_field(
    tmp_path, pki, certificates, job_file, user, cluster_fields, expected, args
):
    """Before: `TLS setup: [Errno 2] No such file or directory` (which file?) or `[SSL] PEM lib` from the
    lean transport; the official client found a bad CA only when connecting. Now the field, the same for
    every command, and nothing is sent."""
    with scripted(
        always(200, EMPTY_LIST), tls=certificates.server_context(tmp_path, require_client_cert=False)
    ) as api:
        path = kubeconfig(tmp_path / "kc", api.url, user, cluster_fields)
        result = run_orch(*(str(job_file) if a == "JOB" else a for a in args), env={"KUBECONFIG": str(path)})
    assert result.returncode == 2, result.stderr
    line = one_error_line(result.stderr)
    assert line.startswith(f"error: kubeconfig {path}: context x: "), line
    assert expected.format(tmp=tmp_path) in line, line
    assert api.requests == []


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        ("127.0.0.1:6443", "clusters.c.server: 127.0.0.1:6443 is not an https:// (or http://) URL"),
        (
            "ftp://127.0.0.1:6443",
            "clusters.c.server: ftp://127.0.0.1:6443 is not an https:// (or http://) URL",
        ),
        ("https://[::1", "clusters.c.server: is not a URL"),
        ("https://127.0.0.1:99999", "clusters.c.server: https://127.0.0.1:99999 has no valid port"),
        ("https:///api", "clusters.c.server: https:///api has no host"),
        ("https://admin:hunter2@:6443", "clusters.c.server: https://admin:***@:6443 has no host"),
    ],
)
@pytest.mark.parametrize("args", [("list",), ("submit", "JOB")], ids=["lean", "official"])
def test_a_server_that_is_no_url_is_one_line(tmp_path, job_file, server, expected, args):
    """Before: urllib3 guessed a scheme (with a FutureWarning of two lines) or each of six attempts failed
    to parse it ("cannot reach ... after 6 attempts")."""
    path = kubeconfig(tmp_path / "kc", server, TOKEN)
    result = run_orch(*(str(job_file) if a == "JOB" else a for a in args), env={"KUBECONFIG": str(path)})
    assert result.returncode == 2, result.stderr
    assert one_error_line(result.stderr) == (
        f"error: kubeconfig {path}: context x: {expected} (e.g. https://10.0.0.1:6443)"
    )
    assert "hunter2" not in result.stderr


@pytest.mark.parametrize("lean", TRANSPORTS, ids=TRANSPORT_IDS)
def test_insecure_skip_tls_verify_says_nothing_on_stderr(tmp_path, certificates, lean):
    """As kubectl: the kubeconfig asked for it. urllib3's InsecureRequestWarning (two lines with a file path,
    once per request site) is not shown."""
    tls = certificates.server_context(tmp_path, require_client_cert=False)
    with scripted(always(200, EMPTY_LIST), tls=tls) as api, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = kubeconfig(tmp_path / "kc", api.url, TOKEN, {"insecure-skip-tls-verify": True})
        assert connect(path, lean=lean).list(POD) == []
    assert len(api.requests) == 1
    assert [str(w.message) for w in caught if "Unverified HTTPS" in str(w.message)] == []


# --- the tunables ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("ORCH_API_RETRIES", "-1", "$ORCH_API_RETRIES: '-1' is not a number from 0 to 100"),
        ("ORCH_API_RETRIES", "many", "$ORCH_API_RETRIES: 'many' is not a number from 0 to 100"),
        (
            "ORCH_API_BACKOFF_SECONDS",
            "-0.5",
            "$ORCH_API_BACKOFF_SECONDS: '-0.5' is not a number from 0 to 30",
        ),
        ("ORCH_API_BACKOFF_SECONDS", "nan", "$ORCH_API_BACKOFF_SECONDS: 'nan' is not a number from 0 to 30"),
        ("ORCH_API_READ_TIMEOUT", "0", "$ORCH_API_READ_TIMEOUT: '0' is not a number from 0.1 to 86400"),
        ("ORCH_API_READ_TIMEOUT", "inf", "$ORCH_API_READ_TIMEOUT: 'inf' is not a number from 0.1 to 86400"),
        ("ORCH_REQUEST_TIMEOUT", "-1", "$ORCH_REQUEST_TIMEOUT: '-1' is not a duration"),
        ("ORCH_REQUEST_TIMEOUT", "1y", "$ORCH_REQUEST_TIMEOUT: '1y' is not a duration"),
    ],
)
def test_bad_tunables_are_usage_errors(tmp_path, variable, value, expected):
    """Before: int("many") was a traceback, a negative backoff a ValueError from time.sleep, a negative retry
    count retried until the deadline, and a bad $ORCH_REQUEST_TIMEOUT exited 1 like a cluster fault."""
    with scripted(always(200, EMPTY_LIST)) as api:
        path = kubeconfig(tmp_path / "kc", api.url, TOKEN)
        result = run_orch("list", env={"KUBECONFIG": str(path), variable: value})
    assert result.returncode == 2, result.stderr
    assert one_error_line(result.stderr).startswith(f"error: {expected}")
    assert api.requests == []
