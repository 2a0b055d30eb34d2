"""What goes into a request path (#33): a job name or namespace a user, a script or a service passes to `orch
status/logs/wait/delete/top/list` or to `orchestrator.api` must be a valid Kubernetes name before it reaches a
URL, and every path part is quoted, so no name can address another namespace, kind or object.

Bad names are sent to a server that records the raw request line it receives (a plain HTTP server on
127.0.0.1: the request target exactly as the client wrote it, before any server-side decoding), through the CLI
and through `orchestrator.api`, on both transports (the lean one and the unpatched official client). A name
that passes is then followed through the emulator (tests/fakes/) to the paths it becomes.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import api, cluster
from orchestrator.cluster.rest import LeanTransport, OfficialTransport
from orchestrator.errors import UsageError
from orchestrator.kube.kinds import POD
from tests.cluster.test_faults import one_error_line
from tests.fakes.cli import FAST, run_orch, write_kubeconfig
from tests.fakes.emulator import JOBS

NS = "team-a"
PYTORCHJOB = cluster.Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")

# Names that must never reach a path: other namespaces or kinds through `..` and `/` (raw or percent-encoded), a
# query or fragment, whitespace and control characters, a Cyrillic look-alike of "demo", case, empty, too long.
HOSTILE = [
    "../team-b/pytorchjobs/demo",
    "..",
    "demo/../../../team-b",
    "a%2F..%2Fteam-b",
    "demo?watch=true",
    "demo#x",
    "demo x",
    "demo\n",
    "d\u0435mo",  # Cyrillic е
    "Demo",
    "",
    "a" * 51,
    "demo,metadata.namespace=team-b",
]


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Records each request line's method and target as received; answers 404 with a Status object."""

    def _answer(self) -> None:
        self.server.seen.append((self.command, self.path))  # type: ignore[attr-defined]
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                           "message": "not found", "code": 404}).encode()  # fmt: skip
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def recorder() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def seen(recorder: http.server.ThreadingHTTPServer) -> list[tuple[str, str]]:
    recorder.seen.clear()  # type: ignore[attr-defined]
    return recorder.seen  # type: ignore[attr-defined,no-any-return]


@pytest.fixture
def user(recorder: http.server.ThreadingHTTPServer, tmp_path: Path, monkeypatch) -> Path:  # type: ignore[no-untyped-def]
    """A kubeconfig (token user, namespace team-a) pointing at the recorder; in the environment too."""
    url = f"http://127.0.0.1:{recorder.server_address[1]}"
    path = write_kubeconfig(tmp_path / "kubeconfig", url, contexts={"dev": NS, "evil": "../kube-system"},
                            current="dev")  # fmt: skip
    for key, value in {"KUBECONFIG": str(path), "HOME": str(tmp_path), **FAST}.items():
        monkeypatch.setenv(key, value)
    return path


def _commands(name: str) -> list[list[str]]:
    return [["status", name], ["logs", name], ["logs", name, "-f"], ["wait", name, "--timeout", "1s"],
            ["delete", name], ["delete", name, "--wait"]]  # fmt: skip


@pytest.mark.parametrize("name", HOSTILE, ids=ascii)
def test_a_bad_job_name_on_the_command_line_sends_nothing(user, seen, name):  # type: ignore[no-untyped-def]
    for argv in _commands(name):
        result = run_orch(*argv)
        assert result.returncode == 2, (argv, result.stderr)
        line = one_error_line(result.stderr)
        assert line.startswith("error: NAME: ") and ("is not a valid job name" in line or "empty" in line), (
            line
        )
    assert seen == []


def test_a_bad_job_name_for_top_sends_no_query(user, seen, recorder):  # type: ignore[no-untyped-def]
    prometheus = f"http://127.0.0.1:{recorder.server_address[1]}"
    injection = 'demo"} or orch_rank_info{job=~".+'
    result = run_orch("top", injection, "--prometheus", prometheus, "--once")
    assert result.returncode == 2
    assert one_error_line(result.stderr).startswith("error: NAME: ")
    result = run_orch("top", "demo", "-n", 'x"}', "--prometheus", prometheus, "--once")
    assert result.returncode == 2
    assert one_error_line(result.stderr).startswith("error: --namespace: ")
    with pytest.raises(UsageError, match=r"^name: "):
        api.top(injection, prometheus=prometheus)
    with pytest.raises(UsageError, match=r"^namespace: "):
        api.top("demo", prometheus=prometheus, namespace='x"}')
    assert seen == []


@pytest.mark.parametrize("namespace", ["../kube-system", "team-a/pytorchjobs", "team-a%2F..", "Team-A", "a" * 64,
                                       "team-\u0430", "team-a?x=1", ""], ids=ascii)  # fmt: skip
def test_a_bad_namespace_sends_nothing(user, seen, namespace):  # type: ignore[no-untyped-def]
    for argv in [*_commands("demo"), ["list"]]:
        result = run_orch(*argv, "-n", namespace)
        assert result.returncode == 2, (argv, result.stderr)
        assert one_error_line(result.stderr).startswith("error: --namespace: "), result.stderr
    with pytest.raises(UsageError, match=r"^namespace: "):
        api.Client(namespace=namespace)
    assert seen == []


def test_a_bad_namespace_in_the_kubeconfig_sends_nothing(user, seen, job_file):  # type: ignore[no-untyped-def]
    result = run_orch("status", "demo", "--context", "evil")
    assert result.returncode == 2
    assert one_error_line(result.stderr) == (
        "error: context evil: namespace: '../kube-system' is not a valid namespace: it must be a DNS-1123 "
        "label of at most 63 characters (lowercase letters, digits and '-'); pass -n NAMESPACE, or fix the "
        "context evil"
    )
    assert run_orch("submit", str(job_file), "--context", "evil", "--dry-run=client").returncode == 2
    assert seen == []


@pytest.mark.parametrize("name", HOSTILE, ids=ascii)
def test_a_bad_job_name_through_the_python_api_sends_nothing(user, seen, name):  # type: ignore[no-untyped-def]
    client = api.Client()
    calls = [
        lambda: client.status(name),
        lambda: client.logs(name, emit=print),
        lambda: client.wait(name, timeout=1),
        lambda: client.delete(name),
    ]
    for call in calls:
        with pytest.raises(UsageError, match=r"^name: ") as refused:
            call()
        assert refused.value.exit_code == 2
    assert seen == []


def test_the_request_path_quotes_every_part_on_both_transports(user, seen):  # type: ignore[no-untyped-def]
    """Below the argument checks (a name a server returned, a caller of orchestrator.cluster): what client-go
    refuses is refused unsent; anything else is percent-quoted, so it stays one path segment."""
    for lean, transport in ((True, LeanTransport), (False, OfficialTransport)):
        connected = cluster.connect(cluster.Target(kubeconfig=str(user)), lean=lean)
        assert isinstance(connected.transport, transport)
        for name in ("", ".", "..", "a/b", "a%2Fb"):
            with pytest.raises(cluster.ClusterError, match="^refusing to send a request for the name "):
                connected.get(PYTORCHJOB, name)
        assert seen == []
        with pytest.raises(cluster.NotFound):
            connected.get(PYTORCHJOB, "x y?z#w\u0435")
        with pytest.raises(cluster.NotFound):
            next(iter(connected.observe(POD, name="a,metadata.namespace=kube-system")))
        assert seen == [
            ("GET", f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs/x%20y%3Fz%23w%D0%B5"),
            # the field selector's value escaped as apimachinery's fields.EscapeValue does: one term
            ("GET", f"/api/v1/namespaces/{NS}/pods?fieldSelector=metadata.name%3Da%5C%2Cmetadata.namespace"
                    "%5C%3Dkube-system&limit=500"),
        ], lean  # fmt: skip
        seen.clear()


def test_a_good_name_reaches_only_its_own_objects(env, job_file):  # type: ignore[no-untyped-def]
    """Every path the follow commands send for job demo in team-a: discovery, or team-a's objects of the
    job's kinds, the job by its name, its pods' logs by their names."""
    assert env.orch("submit", str(job_file)).exit_code == 0
    env.kube.set_conditions(NS, "demo", ("Created", "True"), ("Succeeded", "True"))
    env.kube.add_pod(NS, "demo", "master", 0, state="succeeded")
    env.kube.end_log(NS, "demo-master-0")
    before = len(env.kube.requests())
    for argv in (["status", "demo"], ["logs", "demo"], ["logs", "demo", "-f"], ["wait", "demo"],
                 ["delete", "demo"]):  # fmt: skip
        result = env.orch(*argv)
        assert result.exit_code == 0, (argv, result.stderr)
    allowed = (
        rf"/api/v1/?|/apis/?|/apis/[a-z.]+/v[0-9a-z]+/?"
        rf"|/apis/[a-z.]+/v[0-9a-z]+/namespaces/{NS}/[a-z]+(/demo)?"
        rf"|/api/v1/namespaces/{NS}/(pods|events|configmaps)|/api/v1/namespaces/{NS}/pods/demo-master-0/log"
    )
    paths = [r.url.path for r in env.kube.requests()[before:]]
    assert paths and all(re.fullmatch(allowed, p) for p in paths), paths
    assert env.kube.get(JOBS, NS, "demo") is None
