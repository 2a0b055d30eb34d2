"""A real MLflow tracking server on 127.0.0.1 (SQLite backend, artifacts proxied to a local folder), started by
the test and stopped after it, and readers for what the trainer recorded (MLflow's client, TensorBoard's
EventAccumulator).

The server comes from its own virtual environment (`make install` builds .venv-mlflow): the full `mlflow`
package pins python-dateutil below what the kubernetes client needs, so it cannot share orch's venv; the
trainer only needs the client (`mlflow-skinny`, in `orch-trainer[tracking]`). ORCH_MLFLOW_SERVER names
another `mlflow` executable to use.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import IN_CI

REPO = Path(__file__).resolve().parents[2]
SERVER_START_SECONDS = (
    180  # the first start creates the SQLite schema (dozens of migrations) on a busy machine
)


def mlflow_executable() -> str:
    path = os.environ.get("ORCH_MLFLOW_SERVER") or str(REPO / ".venv-mlflow" / "bin" / "mlflow")
    if not Path(path).is_file():
        message = (
            f"no MLflow server at {path} (`make install` builds .venv-mlflow; or set ORCH_MLFLOW_SERVER)"
        )
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class MlflowServer:
    """One `mlflow server` process group; stop() and start() again keep its database and artifacts."""

    executable: str
    root: Path
    port: int
    process: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "server.log", "a")  # noqa: SIM115 (the process owns it)
        self.process = subprocess.Popen(
            [
                self.executable,
                "server",
                "--backend-store-uri",
                f"sqlite:///{self.root / 'mlflow.db'}",
                "--artifacts-destination",
                str(self.root / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
            ],  # fmt: skip
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() ends the workers too
            env={k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
        )
        deadline = time.monotonic() + SERVER_START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer in {SERVER_START_SECONDS} s")

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)


@pytest.fixture(scope="session")
def _session_mlflow_server(tmp_path_factory):
    # One server for the session: a start costs minutes on a loaded machine. Tests use their own experiments.
    server = MlflowServer(mlflow_executable(), tmp_path_factory.mktemp("mlflow"), free_port())
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def mlflow_server(_session_mlflow_server):
    """The session's server, running (started again if a test stopped it)."""
    return running(_session_mlflow_server)


def running(server: MlflowServer) -> MlflowServer:
    """`server`, started if it is not answering (never started, or stopped after a test's outage)."""
    if not server.answers():
        server.stop()
        server.start()
    return server


def metric_history(client, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric of the run as [(step, value), ...] in step order."""
    run = client.get_run(run_id)
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in run.data.metrics
    }


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under `log_dir`, read by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0: keep every value
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.fixture(autouse=True)
def no_tracker_thread_outlives_its_test():
    """A tracker's thread still sending after its test (close() keeps to its deadline; the thread goes on
    until its request fails) would print its warning into whichever test runs next on this worker. Autouse,
    so set up before and torn down after the servers a test uses: the threads end once those are gone."""
    import threading

    before = set(threading.enumerate())
    yield
    for thread in set(threading.enumerate()) - before:
        if thread.name == "orch-mlflow":
            thread.join(timeout=60)
            assert not thread.is_alive(), "an MLflow tracker's thread is still sending 60 s after its test"


@pytest.fixture
def silent_server():
    """A server that accepts connections and never answers (a hung MLflow, a proxy that swallows
    requests): its URI. The connections are held open until the test ends."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(timeout=5)
    for connection in held:
        connection.close()
    listener.close()
