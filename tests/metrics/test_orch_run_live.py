"""A real `orch run` (2 processes, the synthetic task, fp16 so the AMP panels have data) scraped by a real
Prometheus: every training panel of the dashboard returns data, both ranks come through one endpoint."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.metrics.conftest import REPO, concrete, panel_queries

pytestmark = pytest.mark.slow
JOB = "synthetic"  # examples/synthetic.yaml


@pytest.fixture(scope="module")
def orch_run(live_prometheus, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("orch-run")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "PROMETHEUS_MULTIPROC"))}
    env.update(
        ORCH_METRICS_PORT=str(live_prometheus.targets["run"]),
        ORCH_PEAK_TFLOPS="0.5",
        PROMETHEUS_MULTIPROC_DIR=str(tmp / "mp"),
    )
    started = time.time()
    # Many steps; the run is stopped once Prometheus holds enough of it (CPU speed varies too much for a fixed count).
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "examples/synthetic.yaml",
            "--procs",
            "2",
            "--steps",
            "200000",
            "--out",
            str(tmp / "out"),
            "--set",
            "train.precision=fp16",
            # no evaluation in the window scraped (the example's plateau schedule needs one eventually: a real
            # interval, past where the run is stopped)
            "--set",
            "train.eval_every=100000",
            "--set",
            "train.checkpoint.every_steps=1000000",
            # ~15 steps a second, mostly asleep: the run waits for Prometheus's scrapes, and at full speed
            # its two ranks spent two cores on steps nobody reads
            "--set",
            "train.task_args.sample_delay=0.002",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        result = live_prometheus.wait_for(
            f'count_over_time(orch_train_loss{{job="{JOB}"}}[1m]) >= 6', lambda r: len(r) == 2, timeout=90
        )
        if len(result) != 2:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"orch run was not scraped: {process.communicate(timeout=30)[0][-3000:]}")
        yield live_prometheus, started
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # our own process group: orch run and its workers
            try:
                process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()


def test_both_ranks_through_one_endpoint(orch_run):
    prom, _ = orch_run
    series = prom.query(f'orch_train_step{{job="{JOB}"}}')
    assert {s["metric"]["rank"] for s in series} == {"0", "1"}
    assert len({s["metric"]["instance"] for s in series}) == 1
    assert all(float(s["value"][1]) > 0 for s in series)
    assert not prom.query('{__name__=~"orch_gpu_.+"}')  # no GPU here: no GPU series, nothing failed


TRAINING_PANELS = [p for p in panel_queries() if p[0] == "Training"]


@pytest.mark.parametrize(("row", "title", "expr"), TRAINING_PANELS)
def test_training_panel_has_data(orch_run, row, title, expr):
    prom, started = orch_run
    result = prom.query_range(concrete(expr, job=JOB, rate_interval="4s"), started, time.time(), 1)
    values = [float(v) for s in result for _, v in s["values"]]
    assert any(math.isfinite(v) for v in values), f"{title}: {concrete(expr, job=JOB)} -> {result}"
