"""`orch top` without a server: errors, URL resolution, the table."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time

import pytest

from orchestrator import top
from orchestrator.commands import tables
from tests.metrics.conftest import REPO, free_port
from tests.metrics.test_top_answers import answering  # noqa: F401 (a fixture)

ORCH = [sys.executable, "-m", "orchestrator"]


def _run(*args, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    return subprocess.run(
        [*ORCH, "top", *args], cwd=REPO, env={**clean, **env}, capture_output=True, text=True, timeout=60
    )


def test_unreachable_prometheus_is_one_line_error():
    out = _run("j", "--prometheus", f"http://127.0.0.1:{free_port()}", "--once")
    assert out.returncode == 1
    assert out.stderr.startswith("error: cannot reach http://127.0.0.1:") and out.stderr.count("\n") == 1


def test_no_url_anywhere_is_a_usage_error(tmp_path):
    out = _run("j", "--once", XDG_CONFIG_HOME=str(tmp_path))
    assert out.returncode == 2 and "no Prometheus URL" in out.stderr and "Traceback" not in out.stderr
    out = _run("j", "--prometheus", "http://x", "--local")
    assert out.returncode == 2 and "not both" in out.stderr


def test_url_from_flag_env_then_config(tmp_path, monkeypatch):
    monkeypatch.delenv("ORCH_PROMETHEUS_URL", raising=False)
    monkeypatch.delenv("ORCH_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert top.prometheus_url(None) is None
    (tmp_path / "orch").mkdir()
    (tmp_path / "orch" / "config.yaml").write_text("prometheus_url: http://from-config:9090/\n")
    assert top.prometheus_url(None) == "http://from-config:9090"
    monkeypatch.setenv("ORCH_PROMETHEUS_URL", "http://from-env:9090")
    assert top.prometheus_url(None) == "http://from-env:9090"
    assert top.prometheus_url("http://flag:1/") == "http://flag:1"


def test_table_formatting():
    rows = [
        top.Row(
            rank=0,
            node_rank="0",
            hostname="node-a",
            gpu="0",
            gpu_uuid="GPU-a",
            step=120,
            loss=0.123456,
            samples_per_second=2048.0,
            gpu_utilization=0.915,
            memory_used_bytes=40 * 2**30,
            memory_total_bytes=80 * 2**30,
            power_watts=612.4,
        ),
        top.Row(rank=1, node_rank="0", hostname="node-a", step=119, loss=float("nan")),
    ]
    lines = tables.format_top(rows).splitlines()
    assert lines[0].split() == [
        "RANK",
        "NODE",
        "HOST",
        "GPU",
        "UTIL",
        "MEM",
        "GiB",
        "POWER",
        "W",
        "STEP",
        "SAMPLES/S",
        "LOSS",
    ]
    assert lines[1].split() == ["0", "0", "node-a", "0", "92%", "40.0/80.0", "612", "120", "2048.0", "0.1235"]
    assert lines[2].split() == ["1", "0", "node-a", "-", "-", "-", "-", "119", "-", "nan"]


EXPOSITION = """\
# TYPE orch_rank_info gauge
orch_rank_info{job="j",rank="0",node_rank="0",local_rank="0",hostname="node-a",gpu_uuid="GPU-a"} 1
orch_rank_info{job="j",rank="1",node_rank="0",local_rank="1",hostname="node-a",gpu_uuid="GPU-b"} 1
# TYPE orch_train_step gauge
orch_train_step{job="j",rank="0"} 120
orch_train_step{job="j",rank="1"} 119
# TYPE orch_train_samples counter
orch_train_samples_total{job="j",rank="0"} 3840
orch_train_samples_total{job="j",rank="1"} 3808
# TYPE orch_train_step_ready_seconds gauge
orch_train_step_ready_seconds{job="j",rank="0"} 0.2
orch_train_step_ready_seconds{job="j",rank="1"} 0.9
# TYPE orch_gpu_utilization_ratio gauge
orch_gpu_utilization_ratio{job="j",gpu="0",gpu_uuid="GPU-a",hostname="node-a"} 0.95
orch_gpu_utilization_ratio{job="j",gpu="1",gpu_uuid="GPU-b",hostname="node-a"} 0.3
"""


def test_the_python_api_reads_what_orch_top_prints(answering):  # noqa: F811 (the fixture)
    """`api.top` is `orch top`'s source and loop: its snapshot is what `-o json` prints (the exporter's numbers
    do not move, so samples/s is 0.0 in both), and `follow` reads again every `interval` seconds, samples/s
    from the previous snapshot."""
    from orchestrator import api
    from tests.fakes.cli import run_orch

    url = answering(EXPOSITION, "text/plain") + "/metrics"
    metrics = api.top("j", exporters=[url])
    assert metrics.source == url
    snapshot = metrics.snapshot(interval=0.05)
    assert [(r.rank, r.gpu, r.step, r.samples_per_second) for r in snapshot.rows] == [
        (0, "0", 120, 0.0),
        (1, "1", 119, 0.0),
    ]
    assert snapshot.summary is not None and [r.rank for r in snapshot.summary.slowest] == ["1", "0"]
    printed = run_orch("top", "j", "--exporter", url, "--interval", "0.1", "-o", "json")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == snapshot.to_dict()

    started = time.monotonic()
    followed = list(itertools.islice(metrics.follow(0.2), 2))
    assert time.monotonic() - started >= 0.2  # the second snapshot came `interval` later
    assert [s.rows for s in followed] == [snapshot.rows, snapshot.rows]


def test_the_python_api_takes_one_source(tmp_path, monkeypatch):
    from orchestrator import api
    from orchestrator.errors import UsageError

    monkeypatch.delenv("ORCH_PROMETHEUS_URL", raising=False)
    monkeypatch.setenv("ORCH_CONFIG", str(tmp_path / "none.yaml"))
    with pytest.raises(UsageError, match="not both"):
        api.top("j", prometheus="http://127.0.0.1:9", exporters=["http://127.0.0.1:9/metrics"])
    with pytest.raises(UsageError, match="^no Prometheus URL"):
        api.top("j")
