"""A real S3-compatible HTTP server on 127.0.0.1 for the object-storage tests: moto's server mode.

moto needs boto3/botocore, which pin python-dateutil below what the kubernetes client needs, so it lives in a
venv of its own (`make install` builds .venv-moto, as it builds .venv-mlflow for the MLflow server);
ORCH_MOTO_PYTHON names another Python that has `moto[server]`. The server listens on a free port (port 0),
keeps its objects in memory, and accepts any credentials (moto does not check signatures by default).

`Throttling` is a proxy in front of it that answers every `every`-th request with S3's
`503 SlowDown`, as a throttled bucket does, and forwards the rest. `Failing` fails every request for the
objects whose keys end in one of its names, as a store does that refuses them (403 AccessDenied), keeps
throttling them past any retry budget (503 SlowDown) or is gone (the connection closed without an answer).
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import IN_CI
from tests.tiers import starts_a_process

if TYPE_CHECKING:
    from typing import Self  # Python 3.11+; annotations only (3.10 is supported)

REPO = Path(__file__).resolve().parents[1]
SERVER = """
import sys, time
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print("%s:%d" % server.get_host_and_port(), flush=True)
sys.stdin.read()  # until the test closes our stdin (or kills us)
"""


def moto_python() -> str:
    path = os.environ.get("ORCH_MOTO_PYTHON") or str(REPO / ".venv-moto" / "bin" / "python")
    if not Path(path).is_file():
        message = f"no moto server at {path} (`make install` builds .venv-moto; or set ORCH_MOTO_PYTHON)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


@dataclass
class S3Server:
    process: subprocess.Popen[str]
    endpoint: str

    def create_bucket(self, name: str) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")).read()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """What a job's pods get through secret_env and env: credentials and the store's endpoint."""
        return {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
        }


@starts_a_process  # (through contextmanager's wrapper, which tests/tiers.py's search does not enter)
@contextmanager
def s3_server(*, check_credentials: bool = False) -> Iterator[S3Server]:
    """A fresh server. check_credentials: moto checks access keys (after one unchecked request, which
    creates the bucket), so only keys moto's IAM knows are accepted: none are."""
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "1"} if check_credentials else None
    process = subprocess.Popen(
        [moto_python(), "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        address = process.stdout.readline().strip() if process.stdout else ""
        assert address, "moto did not start"
        yield S3Server(process, f"http://{address}")
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


class Proxy:
    """A proxy to the S3 server at `upstream` that forwards every request as it came. A subclass decides first,
    in `intercept`, whether to answer a request itself (it then returns True) or to hold it before forwarding."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.removeprefix("http://")
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy.intercept(self):
                    return
                connection = http.client.HTTPConnection(proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = proxy.upstream
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                length = answer.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                connection.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def intercept(self, request: BaseHTTPRequestHandler) -> bool:
        return False

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class Throttling(Proxy):
    """A proxy that throttles every `every`-th request with 503 SlowDown."""

    def __init__(self, upstream: str, every: int = 3) -> None:
        super().__init__(upstream)
        self.every, self.requests, self.throttled = every, 0, 0
        self.lock = threading.Lock()

    def intercept(self, request: BaseHTTPRequestHandler) -> bool:
        with self.lock:
            self.requests += 1
            throttle = self.requests % self.every == 0
            self.throttled += throttle
        if throttle:
            error = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            request.send_response(503)
            request.send_header("Content-Length", str(len(error)))
            request.end_headers()
            if request.command != "HEAD":
                request.wfile.write(error)
        return throttle


# S3's error bodies (docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html) for the answers Failing gives.
FAILURES = {
    "refused": (403, b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"),
    "throttled": (
        503,
        b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>",
    ),
}


class Failing(Proxy):
    """A proxy that fails every write (PUT, POST: a multipart upload's parts included) of an object whose key
    ends in one of `names` or lies in a folder of that name, the way `how` says: "refused", "throttled" (every time: past the retry budget) or
    "gone" (the connection closed without an answer, as a store that died mid-request); the rest goes through.
    `failed` counts the requests it failed."""

    def __init__(self, upstream: str, names: tuple[str, ...], how: str = "refused") -> None:
        super().__init__(upstream)
        self.names, self.how, self.failed = names, how, 0
        self.lock = threading.Lock()

    def intercept(self, request: BaseHTTPRequestHandler) -> bool:
        key = request.path.partition("?")[0]
        ours = any(key.endswith(f"/{name}") or f"/{name}/" in key for name in self.names)  # a file, a folder
        if request.command not in ("PUT", "POST") or not ours:
            return False
        with self.lock:
            self.failed += 1
        if self.how == "gone":
            request.close_connection = True
            request.connection.shutdown(2)  # socket.SHUT_RDWR: no answer at all
            return True
        status, error = FAILURES[self.how]
        request.send_response(status)
        request.send_header("Content-Length", str(len(error)))
        request.end_headers()
        request.wfile.write(error)
        return True
