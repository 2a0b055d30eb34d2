"""`make gpu-check`'s logic on CPU (`--tiny`): every row runs, CUDA-only rows skip and say so, nothing fails.

The device run is short and rare; this is what keeps a typo in a row from being found there.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.bench.test_bench_smoke import REPO

pytestmark = pytest.mark.slow

ROWS = ["versions", "pytest-gpu", "bf16-eager", "bf16-eager-metrics-off", "bf16-compile", "fp16", "resume",
        "exporter", "fsdp"]  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant; make gpu-check covers a GPU machine")
def test_gpu_check_tiny_runs_every_row_on_cpu(tmp_path):
    report_file = tmp_path / "gpu-check.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--check", "--tiny", "--json", str(report_file)],
        cwd=REPO, capture_output=True, text=True, timeout=1500, check=False,
    )  # fmt: skip
    report = json.loads(report_file.read_text())
    rows = {row["name"]: row for row in report["rows"]}
    assert list(rows) == ROWS
    assert proc.returncode == 0 and report["ok"], proc.stdout[-4000:] + proc.stderr[-2000:]
    statuses = {name: row["status"] for name, row in rows.items()}
    # What needs CUDA says so; everything else ran for real on the CPU.
    assert statuses["pytest-gpu"] == "skip" and "no CUDA here" in rows["pytest-gpu"]["detail"]
    assert statuses["exporter"] == "skip" and "no GPU" in rows["exporter"]["detail"]
    for name in ("versions", "bf16-eager", "bf16-eager-metrics-off", "bf16-compile", "fp16", "resume"):
        assert statuses[name] == "pass", (name, rows[name]["detail"])
    values = {name: row["values"] for name, row in rows.items()}
    assert values["versions"]["torch"] == str(torch.__version__)
    assert (
        values["bf16-eager"]["tokens_per_second"] > 0 and values["bf16-eager"]["mfu"] is None
    )  # no CPU peak
    assert values["bf16-eager-metrics-off"]["exporter_ratio"] > 0
    assert (values["bf16-compile"]["recompiles"], values["bf16-compile"]["graph_breaks"]) == (0, 0)
    assert values["fp16"]["loss_scale"] is not None and values["fp16"]["skipped_steps"] < 10
    assert values["resume"]["resumed_from_step"] == 10
    assert values["exporter"]["series"] > 0
    # The table and the verdict are printed.
    assert "row" in proc.stdout and "OK: 9/9 rows pass or skip" in proc.stdout
