"""An HTTP(S) server on 127.0.0.1 that answers as the test scripts it, for what no API server does on purpose:
a redirect, a body that never ends or comes a byte at a time, an answer that is not HTTP, throttling with odd
`Retry-After` values. It records every request (method, path, headers, and whether the client presented a
certificate), so a test can also say what never arrived.

`script(request)` gets a `Request` and answers through it: `request.answer(status, body, headers)`, or writes
to `request.wfile` itself (a trickle, garbage). The emulator (tests/fakes/emulator.py) stays the API server
of every other test; this one stands where it cannot.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case (the official client sends `authorization`)
    client_certificate: bool  # the client presented a TLS certificate


@dataclass
class Request:
    handler: http.server.BaseHTTPRequestHandler
    seen: Seen
    stopping: threading.Event

    @property
    def wfile(self) -> Any:
        return self.handler.wfile

    def answer(
        self, status: int, body: bytes | str | dict[str, Any] = b"", headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        data = data.encode() if isinstance(data, str) else data
        self.handler.send_response(status)
        for key, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.handler.send_header(key, value)
        self.handler.send_header("Content-Length", str(len(data)))
        self.handler.end_headers()
        self.handler.wfile.write(data)


EMPTY_LIST = {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []}


@dataclass
class Scripted:
    url: str
    requests: list[Seen] = field(default_factory=list)


@contextlib.contextmanager
def scripted(script: Callable[[Request], None], *, tls: ssl.SSLContext | None = None) -> Iterator[Scripted]:
    stopping = threading.Event()
    server_box: list[Scripted] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def handle_one(self) -> None:
            cert = getattr(self.connection, "getpeercert", lambda: None)()
            seen = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, bool(cert))
            server_box[0].requests.append(seen)
            with contextlib.suppress(OSError):  # the client went away (it gave up, as it should)
                script(Request(self, seen, stopping))

        do_GET = do_POST = do_DELETE = do_PATCH = handle_one  # noqa: N815 (http.server's names)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    scheme = "https" if tls is not None else "http"
    server_box.append(Scripted(f"{scheme}://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield server_box[0]
    finally:
        stopping.set()
        server.shutdown()
        server.server_close()
