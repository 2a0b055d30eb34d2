"""The benchmark harness runs: a quick CLI pass end to end. It measures nothing and asserts no timing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_cli_benchmark_runs_and_prints_every_row(tmp_path):
    env = dict(os.environ, ORCH_BENCH_TORCHX_SITE=str(tmp_path / "no-torchx"))  # keep it cheap: no TorchX
    results = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "cli", "--json", str(results)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for row in ("orch --help", "orch render (2-node DDP job)", "python -c pass"):
        assert row in proc.stdout
    assert results.read_text().count('"orch --help"') >= 1
