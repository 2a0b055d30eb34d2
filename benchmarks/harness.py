"""Running the loops as fresh processes and reading their step clocks; medians, ratios and tables.

Nothing here imports torch: the harness only starts processes (torchrun, orch) and reads the JSON each
rank's `benchmarks.workload` clock wrote when it exited.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import shutil
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

from benchmarks import turns

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
    from orchestrator.trainer.config import TrainSpec  # pydantic only: no torch in the harness

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


def scratch_dir(prefix: str) -> Path:
    """A temporary folder for this benchmark run's files, removed when the harness exits."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


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
    cpu_seconds: list[float] = field(default_factory=list)
    """CPU seconds of rank 0's process over the same steps: what the loop costs, whatever the load."""

    @property
    def median_step(self) -> float:
        return statistics.median(self.step_seconds)

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu_seconds)


class BenchError(RuntimeError):
    pass


def step_periods(
    report: dict[str, Any], warmup: int, turn_steps: int | None = None, clock: str = "step"
) -> list[float]:
    """Optimizer step durations from the clock: from one step's start (after any turn wait) to the next's
    start (before its wait). The first `warmup` steps (DDP bucket rebuild, allocator and cache warm-up)
    and, when taking turns, the first step of each turn are left out. `clock`: "step" for wall seconds,
    "cpu" for the CPU seconds rank 0's process used over the same intervals."""
    pre, post = report[f"{clock}_pre"], report[f"{clock}_post"]
    return [
        pre[k + 1] - post[k] for k in range(warmup, len(pre) - 1) if not (turn_steps and k % turn_steps == 0)
    ]


def run_training(
    cmd: list[str],
    env: dict[str, str],
    *,
    accumulation: int,
    steps: int,
    warmup: int,
    scrape_port: int | None = None,
    timeout: float = 300,
) -> Run:
    """Run one training command on its own, with a fresh clock directory; optionally scrape /metrics."""
    runs = run_in_turns({"run": (cmd, env, scrape_port)}, accumulation=accumulation, steps=steps,
                        warmup=warmup, turn_steps=None, timeout=timeout)  # fmt: skip
    return runs["run"]


def run_in_turns(
    loops: dict[str, tuple[list[str], dict[str, str], int | None]],
    *,
    accumulation: int,
    steps: int,
    warmup: int,
    turn_steps: int | None,
    timeout: float = 600,
) -> dict[str, Run]:
    """Start every loop at once; with `turn_steps`, they take turns of that many optimizer steps.

    `loops`: name -> (command, env, metrics port to scrape every second during that loop's turns).
    """
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        root = Path(tmp)
        names = list(loops)
        if turn_steps:
            turns.start(root / "turn.json", names)
        procs: dict[str, subprocess.Popen] = {}
        logs: dict[str, Any] = {}
        stop, scrapes = threading.Event(), {name: [0] for name in names}
        try:
            for index, (name, (cmd, env, _)) in enumerate(loops.items()):
                out = root / f"loop{index}"
                out.mkdir()
                env = dict(env, ORCH_BENCH_DIR=str(out), ORCH_OUTPUT_DIR=str(out / "out"),
                           ORCH_BENCH_ACCUMULATION=str(accumulation), ORCH_BENCH_STEPS=str(steps))  # fmt: skip
                if turn_steps:
                    env.update(
                        ORCH_BENCH_GATE_DIR=tmp, ORCH_BENCH_LOOP=name, ORCH_BENCH_TURN_STEPS=str(turn_steps)
                    )
                logs[name] = open(out / "log.txt", "w+")  # noqa: SIM115 (closed below)
                procs[name] = subprocess.Popen(
                    cmd, env=env, cwd=out, stdout=logs[name], stderr=subprocess.STDOUT
                )
            scrapers = [
                threading.Thread(
                    target=_scrape, args=(port, stop, scrapes[name], root / "turn.json", name), daemon=True
                )
                for name, (_, _, port) in loops.items()
                if port
            ]
            for scraper in scrapers:
                scraper.start()
            started, deadline = time.perf_counter(), time.monotonic() + timeout
            walls: dict[str, float] = {}
            while len(walls) < len(procs):
                for name, proc in procs.items():
                    if name in walls or proc.poll() is None:
                        continue
                    walls[name] = time.perf_counter() - started
                    if turn_steps:
                        turns.finished(root / "turn.json", name)
                    if proc.returncode != 0:
                        raise BenchError(f"{name}: {' '.join(loops[name][0][-4:])} failed (exit {proc.returncode}):\n"
                                         + _tail(logs[name]))  # fmt: skip
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"timed out after {timeout:.0f} s: " + ", ".join(set(procs) - set(walls))
                    )
                time.sleep(0.1)
        finally:
            stop.set()
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for log in logs.values():
                log.close()
        runs = {}
        for index, name in enumerate(names):
            report = json.loads((root / f"loop{index}" / "rank0.json").read_text())
            if report.get("cuda_seconds"):  # on GPU the events are the clock: the device's own timeline
                report["step_pre"] = report["step_post"] = report["cuda_seconds"][::accumulation]
            periods = step_periods(report, warmup, turn_steps)
            if len(periods) < 3:
                raise BenchError(f"{name}: only {len(periods)} timed steps; raise the step count")
            cpu = step_periods(report, warmup, turn_steps, clock="cpu") if report.get("cpu_pre") else []
            runs[name] = Run(step_seconds=periods, report=report, wall_seconds=walls[name], scrapes=scrapes[name][0],
                             cpu_seconds=cpu)  # fmt: skip
        return runs


def _tail(log: Any, lines: int = 15) -> str:
    log.flush()
    log.seek(0)
    return "\n".join(log.read().splitlines()[-lines:])


def _scrape(port: int, stop: threading.Event, count: list[int], turn_file: Path, name: str) -> None:
    """Prometheus' job, more often than it would do it (every second instead of every 15 s), and only
    while this loop has the turn (a scrape costs the scraped process CPU time)."""
    last = 0.0
    while not stop.wait(0.02):
        try:
            if time.monotonic() - last < 1.0:
                continue
            if turn_file.exists() and json.loads(turn_file.read_text())["turn"] != name:
                continue
            last = time.monotonic()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                if b"orch_" in response.read():
                    count[0] += 1
        except (OSError, ValueError):
            pass  # not serving yet (start-up), already gone, or the turn file mid-replace


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def timed_process(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> float:
    """Wall seconds of one fresh process, which must succeed."""
    return timed_process_cpu(cmd, env, cwd)[0]


def timed_process_cpu(
    cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[float, float]:
    """(wall, CPU) seconds of one fresh process, which must succeed. CPU = user + system time of the
    process and its children: what it costs whatever else the machine is doing."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu


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
