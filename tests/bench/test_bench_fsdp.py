"""The bare FSDP loop of `make bench` section 7 runs (2 processes, a few steps). Measures nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_bare_fsdp_loop_trains(tmp_path):
    from benchmarks import harness

    config = harness.train_config(world=2, accumulation=4, steps=3, precision="bf16")
    config.update(task="synthetic", task_args={"samples": 256}, log_every=1)
    (tmp_path / "train.json").write_text(json.dumps(config))
    proc = subprocess.run(
        [*harness.torchrun(2, "benchmarks.bare_ddp", "--config", str(tmp_path / "train.json"), "--fsdp")],
        cwd=REPO, env=harness.base_env(), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line.split()[:2] for line in proc.stdout.splitlines() if line.startswith("step")] == [
        ["step", "0"], ["step", "1"], ["step", "2"],
    ]  # fmt: skip
