"""A local run whose rank 1 is slowed on purpose (its data loader sleeps per sample): the trainer's per-rank
time to the gradient reduction names it, through the live exporter, in `orch top`'s summary (#22)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.metrics.conftest import REPO, free_port
from tests.trainer.test_faults import steps_logged, wait_for

pytestmark = pytest.mark.slow


def test_a_slowed_rank_is_named_the_straggler(tmp_path):
    port = free_port()
    job = {
        "name": "straggle",
        "procs_per_node": 2,
        "metrics": {"port": port},
        "train": {
            "task": "tests.trainer.plugin_tasks:slow_on_rank",
            "task_args": {"rank": 1, "delay": 0.005},
            "batch_size": 16, "micro_batch_size": 8, "max_steps": 100000, "log_every": 10, "eval_every": 0,
            "num_workers": 0, "optimizer": {"name": "sgd", "lr": 0.01},
            "checkpoint": {"every_steps": 1000000},
        },
    }  # fmt: skip
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "PROMETHEUS_MULTIPROC"))}
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", str(tmp_path / "job.yaml"), "--out", str(tmp_path / "out")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        # Training first (a file to read), then `orch top` (a Python start each, ~0.5 CPU-s: not a poll to
        # repeat through the ranks' torch imports)
        wait_for(lambda: steps_logged(tmp_path / "out" / "progress.jsonl") >= 10, what="the first steps")
        deadline, seen = time.monotonic() + 180, None
        while time.monotonic() < deadline:
            top = subprocess.run(
                [sys.executable, "-m", "orchestrator", "top", "straggle", "--local", "--port", str(port), "-o",
                 "json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            if top.returncode == 0:
                seen = json.loads(top.stdout)
                ready = {r["rank"]: r["ready_seconds"] for r in seen["rows"] if r["rank"] is not None}
                steps = [r["step"] or 0 for r in seen["rows"] if r["rank"] is not None]
                if len(ready) == 2 and None not in ready.values() and min(steps) >= 5:
                    break
            time.sleep(1)
        else:
            pytest.fail(f"no metrics of both ranks: {seen}")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    # rank 1 reads 8 samples x 5 ms = 40 ms before it reaches the reduction; rank 0 reads from memory and
    # then waits in the reduction for rank 1 (its step time is as long, its time to the reduction is not)
    assert ready[1] > 3 * ready[0], ready
    assert seen["summary"]["slowest"][0]["rank"] == "1"
    assert seen["summary"]["spread"]["ready_seconds"]["max"] == pytest.approx(ready[1])
