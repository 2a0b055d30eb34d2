"""`orch top` without a server: errors, URL resolution, the table."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestrator import top
from tests.metrics.conftest import REPO, free_port

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
    lines = top.format_table(rows).splitlines()
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
