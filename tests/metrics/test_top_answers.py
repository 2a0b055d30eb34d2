"""`orch top` against servers that answer something else than Prometheus does (issue #12): one error line
or a table of what could be read, never a traceback. The servers are real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading

import pytest

from orchestrator import top
from tests.metrics.conftest import REPO


@pytest.fixture
def answering():
    """`answering(body, content_type)` -> the URL of a server that gives that answer to every GET."""
    servers = []

    def start(body: str, content_type: str = "application/json") -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def orch_top(url: str):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "top", "j", "--prometheus", url, "--once"],
        cwd=REPO, env=clean, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("body", "content_type", "said"),
    [
        ("<html><body>Sign in</body></html>", "text/html", "is not a Prometheus API (its answer is not JSON"),
        ("[1, 2]", "application/json", "query failed"),
        ('{"status": "error", "error": "bad query"}', "application/json", "query failed: bad query"),
    ],
)
def test_not_prometheus_is_one_error_line(answering, body, content_type, said):
    result = orch_top(answering(body, content_type))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert said in result.stderr


def test_malformed_samples_are_skipped(answering):
    result = [
        {"metric": {"rank": "0", "job": "j"}, "value": [1, "12"]},  # the only readable one
        {"metric": "rank 1", "value": [1, "3"]},
        {"metric": {"rank": "2"}, "value": [1, "not a number"]},
        {"metric": {"rank": "3"}, "value": "5"},
        5,
    ]
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})
    assert top._prometheus_query(answering(body), "orch_train_step", 10) == [
        ({"rank": "0", "job": "j"}, 12.0)
    ]
    shapes = ['{"status": "success"}', '{"status": "success", "data": {"result": 5}}']
    for shape in shapes:
        assert top._prometheus_query(answering(shape), "x", 10) == []
    run = orch_top(answering(body))
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr


def test_an_exporter_that_serves_no_metrics(answering):
    url = answering("<html>not metrics</html>\n{{{", "text/plain")
    with pytest.raises(top.TopError, match="does not serve Prometheus metrics"):
        top.from_exporters([url], "j", interval=0)
