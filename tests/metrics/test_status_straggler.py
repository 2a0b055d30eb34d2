"""`orch status` names the rank every other one waits for, from the Prometheus `orch top` reads, and the Python
API's `Client.status` returns the same straggler (#32). A real Prometheus scrapes a fixed exposition of four
ranks, rank 2 reaching the gradient reduction 0.7 s after the others; the job is on the API emulator (no
operator runs: the test marks it Running, as the operator would)."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from orchestrator import api
from tests.fakes.cli import FAST, Env, write_kubeconfig
from tests.fakes.emulator import serve

NS = "team-a"
READY = {0: 0.2, 1: 0.21, 2: 0.9, 3: 0.2}  # seconds to the gradient reduction, per rank
LINE = (
    "straggler: rank 2 (pod demo-worker-2, host node-2) takes 0.900s per step to reach the gradient reduction, "
    "the job's median 0.205s: every other rank waits for it (orch top demo)"
)


def exposition() -> str:
    """What the exporters of job demo's four ranks serve (the pod label as the PodMonitor's relabeling adds)."""
    labels = {
        r: f'job="demo",namespace="{NS}",rank="{r}",node_rank="{r}",pod="demo-worker-{r}"' for r in READY
    }
    lines = ["# TYPE orch_rank_info gauge"]
    lines += [f'orch_rank_info{{{labels[r]},hostname="node-{r}"}} 1' for r in READY]
    lines += ["# TYPE orch_train_step_ready_seconds gauge"]
    lines += [f"orch_train_step_ready_seconds{{{labels[r]}}} {seconds}" for r, seconds in READY.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture
def exporter(live_prometheus):
    body = exposition().encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", live_prometheus.targets["status"]), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    scraped = live_prometheus.wait_for('orch_train_step_ready_seconds{job="demo"}', lambda r: len(r) == 4)
    assert len(scraped) == 4, scraped
    yield live_prometheus
    server.shutdown()
    server.server_close()


def test_status_names_the_straggler_on_the_cli_and_in_python(exporter, tmp_path, monkeypatch):
    with serve() as kube:
        home = tmp_path / "home"
        home.mkdir()
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, contexts={"dev": NS}, current="dev")
        env = Env(kube, kubeconfig, home, {"KUBECONFIG": str(kubeconfig), "HOME": str(home), **FAST,
                                           "ORCH_PROMETHEUS_URL": exporter.url})  # fmt: skip
        (tmp_path / "job.yaml").write_text("name: demo\nimage: registry.example/trainer:1\nnodes: 4\n"
                                           "train:\n  task: digits\n  batch_size: 64\n")  # fmt: skip
        assert env.orch("submit", str(tmp_path / "job.yaml")).exit_code == 0
        kube.set_conditions(NS, "demo", ("Created", "True"), ("Running", "True"))

        table = env.orch("status", "demo")
        assert table.exit_code == 0, table.stderr
        assert table.stdout.splitlines()[-1] == LINE
        printed = env.orch("status", "demo", "-o", "json")
        assert printed.exit_code == 0, printed.stderr

        for key, value in env.vars.items():
            monkeypatch.setenv(key, value)
        state = api.Client().status("demo")
    assert state.straggler is not None
    assert (state.straggler.rank, state.straggler.pod, state.straggler.hostname) == (
        "2",
        "demo-worker-2",
        "node-2",
    )
    assert (state.straggler.seconds, state.straggler.median_seconds) == (
        pytest.approx(0.9),
        pytest.approx(0.205),
    )
    assert json.loads(printed.stdout) == state.to_dict()  # the CLI prints what Python gets
