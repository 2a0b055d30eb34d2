"""`make bench`'s cluster section runs end to end at one small size (section 10). It measures nothing and asserts
no timing: that every row is there, and that `orch wait` made the same requests whatever the job's size."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is the benchmark's reference")
def test_quick_cluster_benchmark_runs_and_prints_every_row(tmp_path):
    results = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "cluster", "--pods", "2,4", "--json", str(results)],
        cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    cluster = json.loads(results.read_text())["cluster"]
    commands = {(row["api"], row["command"]) for row in cluster["rows"]}
    for api in ("pytorchjob", "trainjob"):
        for command in (
            "submit",
            "status",
            "logs --all --tail 1",
            "wait (finished job)",
            "delete",
            "list (200 jobs)",
        ):
            assert (api, command) in commands
    window = {(w["api"], w["pods"]): w["orch"]["requests"] for w in cluster["wait_window"]}
    assert window[("pytorchjob", 2)] == window[("pytorchjob", 4)]  # watched, not polled per pod
    assert "10. Cluster commands vs kubectl" in proc.stdout
