"""Task plug-ins for the tracking tests: `train.task: tests.tracking.hook_tasks:digits_with_hooks`.

The hooks add the task's own scalars, and can act at a given step on rank 0: stop the test's MLflow server
(a real outage, at a known point of the run) or fail once (a worker restart that resumes from a checkpoint).
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

from orchestrator import runtime_env
from orchestrator.trainer.tasks import Task, digits


def digits_with_hooks(
    stop_server_pgid: int = 0,
    stop_server_url: str = "",
    stop_at: int = 0,
    fail_once_at: int = 0,
    marker: str = "",
    scrape_at: int = 0,
    scrape_file: str = "",
) -> Task:
    task = digits.make()
    rank0 = os.environ.get("RANK") == "0"

    def on_log(step: int, metrics: dict[str, float]) -> dict[str, Any]:
        if rank0 and step == stop_at and stop_server_pgid:
            os.killpg(stop_server_pgid, signal.SIGTERM)
            _wait_until_down(stop_server_url)
        if rank0 and step == scrape_at:  # what this rank's exporter serves now (set at the previous log step)
            # where it listens, as announced: the job's port, or a free one when another program holds that
            url = json.loads(Path(os.environ[runtime_env.METRICS_ENDPOINT_FILE]).read_text())["url"]
            with urllib.request.urlopen(url, timeout=30) as response:
                Path(scrape_file).write_bytes(response.read())
        if rank0 and step == fail_once_at and not Path(marker).exists():
            Path(marker).touch()
            raise RuntimeError(f"deliberate failure at step {step}")
        return {"loss_x2": 2 * metrics["loss"], "phase": "warmup" if step <= 20 else "main"}

    def on_eval(step: int, results: dict[str, float]) -> dict[str, float]:
        return {"error_rate": 1.0 - results["accuracy"]}

    task.on_log, task.on_eval = on_log, on_eval
    return task


def _wait_until_down(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).close()
        except OSError:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{url} still answers")
