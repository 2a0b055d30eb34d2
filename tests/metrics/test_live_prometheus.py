"""A real Prometheus scraping the exporter of two local ranks (driver processes that call the exporter exactly
like the trainer does); the dashboard's queries and `orch top` read the result.

GPU series come from a fake GPU reader (tests/metrics/fake_gpu.py): there is no GPU here.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.metrics.conftest import REPO, concrete, panel_queries
from tests.metrics.fake_gpu import FAKE_DEVICES
from tests.metrics.helpers import start_driver

pytestmark = pytest.mark.slow
JOB = "drive-live"
ORCH = [sys.executable, "-m", "orchestrator"]
# Panels that need a CUDA device in the training process itself (torch's allocator): empty on a CPU rank.
CUDA_ONLY = {"Torch CUDA memory", "Alloc retries and OOMs"}


@pytest.fixture(scope="module")
def drive_run(live_prometheus, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("drive")
    stop, port = tmp / "stop", live_prometheus.targets["drive"]
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp / "mp"), "ORCH_PEAK_TFLOPS": "1"}
    started = time.time()
    ranks = [
        start_driver(
            "--port",
            str(port),
            "--job",
            JOB,
            "--rank",
            str(r),
            "--local-rank",
            str(r),
            "--steps",
            "100000",
            "--sleep",
            "0.05",
            "--stop-file",
            str(stop),
            *(["--fake-gpus"] if r == 0 else []),
            env=env,
        )
        for r in (0, 1)
    ]
    try:
        # Enough scrapes for rate() over the panels' 4 s window (the first one comes >= 5 s after Prometheus starts).
        result = live_prometheus.wait_for(
            f'count_over_time(orch_train_step{{job="{JOB}"}}[1m]) >= 6', lambda r: len(r) == 2, timeout=40
        )
        assert len(result) == 2, [p.poll() for p in ranks]
        yield live_prometheus, started
    finally:
        stop.touch()
        for process in ranks:
            out, err = process.communicate(timeout=30)
            assert process.returncode == 0, err


def test_one_endpoint_serves_both_ranks(drive_run):
    prom, _ = drive_run
    series = prom.query(f'orch_train_samples_total{{job="{JOB}"}}')
    assert {s["metric"]["rank"] for s in series} == {"0", "1"}
    assert len({s["metric"]["instance"] for s in series}) == 1  # one scrape target for the node
    # samples counter and step gauge of each rank agree (32 samples a step; one step may be in flight)
    diff = prom.query(
        f'orch_train_samples_total{{job="{JOB}"}} - on (rank) (32 * orch_train_step{{job="{JOB}"}})'
    )
    assert len(diff) == 2 and all(abs(float(s["value"][1])) <= 32 for s in diff)


def test_gpu_series_carry_uuid_and_host(drive_run):
    prom, _ = drive_run
    util = prom.query(f'orch_gpu_utilization_ratio{{job="{JOB}"}}')
    assert {s["metric"]["gpu_uuid"] for s in util} == {d.uuid for d in FAKE_DEVICES}
    assert {s["metric"]["hostname"] for s in util} == {socket.gethostname()}
    assert {float(s["value"][1]) for s in util} == {0.87}
    # ranks join their GPU through orch_rank_info
    joined = prom.query(
        f'orch_gpu_power_watts * on (gpu_uuid) group_left (rank) orch_rank_info{{job="{JOB}"}}'
    )
    assert [s["metric"]["rank"] for s in joined] == ["0"]


@pytest.mark.parametrize(("row", "title", "expr"), panel_queries())
def test_dashboard_panel_has_data(drive_run, row, title, expr):
    prom, started = drive_run
    if title in CUDA_ONLY:
        pytest.skip("needs torch.cuda in the training process; covered by the backfill test")
    result = prom.query_range(concrete(expr, job=JOB, rate_interval="4s"), started, time.time(), 1)
    values = [float(v) for s in result for _, v in s["values"]]
    assert any(math.isfinite(v) for v in values), f"{title}: {concrete(expr, job=JOB)} -> {result}"


def test_orch_top_from_prometheus(drive_run):
    prom, _ = drive_run
    out = subprocess.run(
        [*ORCH, "top", JOB, "--prometheus", prom.url, "-o", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows = {row["rank"]: row for row in json.loads(out.stdout)["rows"]}
    assert set(rows) == {0, 1, None}  # both ranks, plus fake GPU 1 that no rank claims
    assert rows[0]["gpu_uuid"] == FAKE_DEVICES[0].uuid and rows[0]["gpu_utilization"] == 0.87
    assert rows[0]["power_watts"] == 512.5 and rows[0]["memory_total_bytes"] == 80e9
    assert rows[1]["gpu_uuid"] == "" and rows[None]["gpu_uuid"] == FAKE_DEVICES[1].uuid
    assert all(
        rows[r]["samples_per_second"] > 0 and rows[r]["step"] > 0 and rows[r]["loss"] > 0 for r in (0, 1)
    )


def test_orch_top_from_the_exporter(drive_run):
    prom, _ = drive_run
    port = prom.targets["drive"]
    out = subprocess.run(
        [*ORCH, "top", JOB, "--exporter", f"http://127.0.0.1:{port}/metrics", "--once"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].split()[:4] == ["RANK", "NODE", "HOST", "GPU"]
    assert [line.split()[0] for line in lines[1:]] == ["0", "1", "-"]
    assert "87%" in lines[1] and "512" in lines[1]
    env = {**os.environ, "ORCH_METRICS_PORT": str(port)}
    out = subprocess.run(
        [*ORCH, "top", JOB, "--local", "-o", "json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    rows = json.loads(out.stdout)["rows"]
    assert [r["rank"] for r in rows] == [0, 1, None] and rows[0]["samples_per_second"] > 0
