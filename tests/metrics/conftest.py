"""Fixtures for the metrics tests: a real Prometheus server (Debian's `prometheus`) on 127.0.0.1.

Prometheus 2.42 delivers its first sample >= 5 s after start (target-update throttle), so the live server is
started once per session and scrapes a fixed set of ports that the tests then serve exporters on.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import require_tool

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "manifests" / "monitoring"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rule_groups() -> dict:
    """The PrometheusRule's groups as a plain Prometheus rules file."""
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    return {"groups": rule["spec"]["groups"]}


class Prometheus:
    """A Prometheus process we started, and its HTTP API."""

    def __init__(
        self, binary: str, workdir: Path, config: dict | None, *, storage: Path | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "rules.yml").write_text(yaml.safe_dump(rule_groups()))
        config = dict(config or {})
        config.setdefault(
            "global", {"scrape_interval": "1s", "scrape_timeout": "800ms", "evaluation_interval": "1s"}
        )
        config["rule_files"] = [str(workdir / "rules.yml")]
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={storage or workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=1).read()
                break
            except OSError as error:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"prometheus did not start: {(workdir / 'prometheus.log').read_text()}"
                    ) from error
                time.sleep(0.05)

    def api(self, path: str, **params) -> dict:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        return self.api("query", query=expr, time=at)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self.api("query_range", query=expr, start=start, end=end, step=step)["result"]

    def wait_for(self, expr: str, ok, timeout: float = 30.0) -> list[dict]:
        """Poll an instant query until `ok(result)`; the last result on timeout (for the assertion message)."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if ok(result) or time.monotonic() > deadline:
                return result
            time.sleep(0.25)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture(scope="session")
def live_prometheus(tmp_path_factory):
    """Prometheus scraping three exporter ports every second: `targets["drive"]`, `targets["run"]` and
    `targets["status"]`.

    honor_labels is on, as in the PodMonitor: the exporter's `job` label (the orch job) wins over the scrape job.
    """
    binary = require_tool("prometheus")
    targets = {"drive": free_port(), "run": free_port(), "status": free_port()}
    config = {
        "scrape_configs": [
            {"job_name": name, "honor_labels": True, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
            for name, port in targets.items()
        ]
    }
    server = Prometheus(binary, tmp_path_factory.mktemp("prometheus"), config)
    server.targets = targets
    yield server
    server.stop()


def dashboard() -> dict:
    return json.loads((MONITORING / "orch-training-dashboard.json").read_text())


def panel_queries() -> list[tuple[str, str, str]]:
    """(row title, panel title, expr) of every dashboard query."""
    out, row = [], ""
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            continue
        out += [(row, panel["title"], target["expr"]) for target in panel["targets"]]
    return out


def concrete(expr: str, *, job: str = ".+", rate_interval: str = "5s") -> str:
    """A panel query as Grafana would send it with all variables on "All" (or one job)."""
    return (
        expr.replace("$__rate_interval", rate_interval)
        .replace("$__range", "1h")
        .replace('"$namespace"', '".*"')
        .replace('"$job"', f'"{job}"')
        .replace('"$rank"', '".*"')
        .replace('"$gpu"', '".*"')
    )
