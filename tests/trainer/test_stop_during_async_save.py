"""#25 class 9: Ctrl-C while an async checkpoint is provably still being written.

The checkpoints go to a real S3 server (moto) through a proxy that holds the ranks' shard uploads (DCP's
`.distcp` files, written by the async save's background thread) of the first interval checkpoint until the
test lets them through. The test sends SIGINT while an upload is held: the save is in flight. `orch run` must
exit 130 (docs/trainer.md) after its stop checkpoint, every checkpoint in the store must be complete (its marker
written last, digests of every file), and the rerun must resume from the stop's checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from http.server import BaseHTTPRequestHandler

import pytest

from orchestrator import storage
from orchestrator.trainer import checkpoint
from tests.s3server import Proxy, s3_server
from tests.trainer.conftest import ORCH, REPO, write_job
from tests.trainer.test_faults import stop_job

pytestmark = pytest.mark.slow


class HoldingProxy(Proxy):
    """A proxy that holds every upload of a `.distcp` file (a rank's shard of a DCP checkpoint) until `release`
    is set; `held` is set when the first one arrives."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.held, self.release = threading.Event(), threading.Event()
        self.held_paths: list[str] = []

    def intercept(self, request: BaseHTTPRequestHandler) -> bool:
        if request.command in ("PUT", "POST") and ".distcp" in request.path and not self.release.is_set():
            self.held_paths.append(request.path)
            self.held.set()
            self.release.wait(timeout=300)
        return False

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        super().__exit__(*exc)


def test_ctrl_c_with_an_async_save_in_flight_leaves_complete_checkpoints_and_resumes(tmp_path, monkeypatch):
    spec = stop_job("inflight")
    spec["train"]["checkpoint"] = {"every_steps": 5, "keep": 5, "async": True}
    spec_file = write_job(tmp_path, spec)
    url = "s3://bkt/inflight"
    with s3_server() as server, HoldingProxy(server.endpoint) as proxy:
        server.create_bucket("bkt")
        env = {**os.environ, **server.env(proxy.endpoint), "ORCH_METRICS_PORT": "0", "PYTHONPATH": str(REPO)}
        process = subprocess.Popen(
            [*ORCH, "run", str(spec_file), "--out", url],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert proxy.held.wait(timeout=300), "no checkpoint upload seen"
            assert all("/checkpoints/step-00000005/" in path for path in proxy.held_paths), proxy.held_paths
            process.send_signal(signal.SIGINT)  # the step-5 save is being written: its upload is held
            threading.Timer(2.0, proxy.release.set).start()  # the store answers again while the ranks stop
            stdout, stderr = process.communicate(timeout=300)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == 130, stdout[-2000:] + stderr[-2000:]
        stopped = re.search(r"stopped at step (\d+) after writing a checkpoint", stderr)
        assert stopped, stderr
        stopped_at = int(stopped.group(1))
        assert stopped_at >= 5

        for name, value in server.env().items():
            monkeypatch.setenv(name, value)  # read the store directly, not through the proxy
        root = storage.location(f"{url}/checkpoints")
        saved = sorted(p.name for p in root.iterdir())
        assert saved[0] == "step-00000005" and saved[-1] == f"step-{stopped_at:08d}", saved
        for name in saved:  # every checkpoint complete: its marker (written last) and every file it lists
            marker = json.loads((root / name / checkpoint.MARKER).read_text())
            assert marker["step"] == int(name.removeprefix("step-")), marker
            assert checkpoint.verify(root / name) is None, name

        resumed = subprocess.run(
            [*ORCH, "run", str(spec_file), "--out", url],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"resumed from {url}/checkpoints/step-{stopped_at:08d} at step {stopped_at}" in resumed.stdout
