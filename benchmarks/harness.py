"""Running the loops as fresh processes and reading their step clocks; medians, ratios and tables.

Nothing here imports torch: the harness only starts processes (torchrun, orch) and reads the JSON each
rank's `benchmarks.workload` clock wrote when it exited.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# The workload of the CPU benchmarks: a 2-layer MLP (512 -> 2048 -> 16, 1.08M parameters, a 4.3 MB
# gradient) on a synthetic classification set. Big enough that the all-reduce and the optimizer cost
# something, small enough that a step takes ~20 ms on one core: per-step overhead shows up clearly.
CPU_TASK_ARGS = {
    "inner": "synthetic",
    "kind": "classification",
    "samples": 16384,
    "eval_samples": 0,
    "features": 512,
    "hidden": 2048,
    "classes": 16,
}
MICRO_BATCH = 32


def train_config(
    *, world: int, accumulation: int, steps: int, task_args: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    """A full train.json (TrainSpec serialised), read alike by orch's trainer and the two other loops."""
    from orchestrator.spec import TrainSpec  # pydantic only: no torch in the harness

    micro = extra.pop("micro_batch_size", MICRO_BATCH)
    spec = TrainSpec.model_validate(
        {
            "task": "benchmarks.workload:timed",
            "task_args": task_args or CPU_TASK_ARGS,
            "batch_size": micro * world * accumulation,
            "micro_batch_size": micro,
            "precision": "fp32",
            "optimizer": {"name": "adamw", "lr": 1e-3},
            "schedule": {"name": "constant"},
            "max_steps": steps,
            "grad_clip": 1.0,
            "log_every": 10,
            "eval_every": 0,  # evaluation only after the last step: outside the timed window
            "checkpoint": {"every_steps": 10**9},  # only the final one, after the timed window
            **extra,
        }
    )
    return spec.model_dump(mode="json")


def torchrun(nproc: int, module: str, *args: str) -> list[str]:
    """The same launcher for every loop: torch's elastic launcher, standalone rendezvous."""
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", module, *args]  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def base_env(**overrides: str | None) -> dict[str, str]:
    """This environment, with the repo importable and orch's knobs reset; None removes a variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "TORCHELASTIC_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env["ORCH_LOG_LINES"] = "1"
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@dataclass
class Run:
    """What one training run's rank 0 saw."""

    step_seconds: list[float]
    """Seconds per optimizer step, warm-up steps and the last step excluded."""
    report: dict[str, Any]
    wall_seconds: float
    scrapes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median_step(self) -> float:
        return statistics.median(self.step_seconds)


class BenchError(RuntimeError):
    pass


def step_periods(times: Sequence[float], accumulation: int, warmup: int) -> list[float]:
    """Optimizer step durations from the times of every micro-step's loss call.

    Step k starts at micro-step k*accumulation; its duration is the gap to the start of step k+1. The
    first `warmup` steps (DDP bucket rebuild, allocator and cache warm-up) are dropped.
    """
    starts = list(times[::accumulation])
    return [b - a for a, b in zip(starts[warmup:], starts[warmup + 1 :], strict=False)]


def run_training(
    cmd: list[str],
    env: dict[str, str],
    *,
    accumulation: int,
    warmup: int,
    scrape_port: int | None = None,
    timeout: float = 300,
) -> Run:
    """Run one training command with a fresh clock directory; optionally scrape /metrics every second."""
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        env = dict(env, ORCH_BENCH_DIR=tmp, ORCH_OUTPUT_DIR=str(Path(tmp) / "out"))
        stop, scrapes = threading.Event(), [0]
        scraper = None
        if scrape_port:
            scraper = threading.Thread(target=_scrape, args=(scrape_port, stop, scrapes), daemon=True)
            scraper.start()
        started = time.perf_counter()
        proc = subprocess.run(
            cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=timeout, check=False
        )
        wall = time.perf_counter() - started
        stop.set()
        if scraper:
            scraper.join()
        report_path = Path(tmp) / "rank0.json"
        if proc.returncode != 0 or not report_path.exists():
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
            raise BenchError(f"{' '.join(cmd[-4:])} failed (exit {proc.returncode}):\n{tail}")
        report = json.loads(report_path.read_text())
    times = report.get("cuda_seconds") or report["loss_calls"]
    periods = step_periods(times, accumulation, warmup)
    if len(periods) < 3:
        raise BenchError(f"only {len(periods)} timed steps; raise the step count")
    return Run(step_seconds=periods[:-1] or periods, report=report, wall_seconds=wall, scrapes=scrapes[0])


def _scrape(port: int, stop: threading.Event, count: list[int]) -> None:
    """Prometheus' job, more often than it would do it (every second instead of every 15 s)."""
    while not stop.wait(1.0):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                if b"orch_" in response.read():
                    count[0] += 1
        except OSError:
            pass  # not serving yet (start-up) or already gone


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def timed_process(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> float:
    """Wall seconds of one fresh process, which must succeed."""
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return seconds


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in cells]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join("  " + line for line in lines)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def ratio(value: float) -> str:
    return f"{value:.3f}x"
