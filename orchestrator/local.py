"""`orch run`: the job's processes on this machine, through torch's elastic launcher (what torchrun uses).

The workers run exactly what a pod runs (`python -m orchestrator.trainer --config train.json`, or the
job's `command`), with the same ORCH_* environment, gloo on CPU or one process per local GPU.
torch is imported inside the functions: `orch --help` must stay light.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from orchestrator.errors import OrchError, UsageError

if TYPE_CHECKING:
    from orchestrator.spec import JobSpec, TrainSpec

TRAINER_MODULE = "orchestrator.trainer"


class RunFailed(OrchError):
    """A rank failed (after any elastic restarts); the message names it and its error."""

    exit_code = 1


class RunInterrupted(OrchError):
    """Ctrl-C (or SIGTERM): every rank was stopped."""

    exit_code = 130


@dataclass(frozen=True)
class LocalPlan:
    """Everything `orch run` decided before starting a process (pure data, printed to the user)."""

    world_size: int
    output_dir: Path
    train: TrainSpec | None
    command: list[str] | None
    env: dict[str, str]
    max_restarts: int

    @property
    def accumulation(self) -> int | None:
        return self.train.accumulation(self.world_size) if self.train else None


METRICS_ENV = ("ORCH_METRICS_PORT", "ORCH_GPU_SAMPLE_SECONDS", "ORCH_PEAK_TFLOPS")


def plan(
    spec: JobSpec,
    *,
    procs: int | None = None,
    steps: int | None = None,
    output_dir: str | None = None,
    now: datetime | None = None,
) -> LocalPlan:
    """Resolve world size, steps and output directory; refuse what cannot run. No side effects."""
    world_size = procs or spec.world_size
    if world_size < 1:
        raise UsageError(f"--procs must be at least 1, not {world_size}")
    train = spec.train
    if train is not None:
        if steps is not None:
            if steps < 1:
                raise UsageError(f"--steps must be at least 1, not {steps}")
            train = train.model_copy(update={"max_steps": steps, "epochs": None})
        if problem := train.batch_problem(world_size):
            source = f"--procs {procs}" if procs else f"{spec.nodes} nodes x {spec.procs_per_node} procs"
            raise UsageError(f"{source}: {problem}")
    elif steps is not None:
        raise UsageError("--steps applies to train jobs only; this job runs its own command")
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    out = Path(output_dir) if output_dir else Path("runs") / f"{spec.name}-{stamp}"
    env = {
        **_metrics_env(spec),
        **spec.env,
        "ORCH_JOB_NAME": spec.name,
        "ORCH_OUTPUT_DIR": str(out.resolve()),
        "PYTHONUNBUFFERED": "1",
    }
    return LocalPlan(
        world_size=world_size,
        output_dir=out,
        train=train,
        command=list(spec.command) if spec.command else None,
        env=env,
        max_restarts=spec.elastic.max_restarts if spec.elastic else 0,
    )


def _metrics_env(spec: JobSpec) -> dict[str, str]:
    """The exporter settings the pods get from render, for this machine's one endpoint (local rank 0 serves)."""
    if not spec.metrics.enabled:
        return {"ORCH_METRICS_PORT": "0"}
    env = {
        "ORCH_METRICS_PORT": str(spec.metrics.port),
        "ORCH_GPU_SAMPLE_SECONDS": str(spec.metrics.gpu_sample_seconds),
    }
    if spec.metrics.peak_tflops:
        env["ORCH_PEAK_TFLOPS"] = str(spec.metrics.peak_tflops)
    return env


def run(local: LocalPlan, *, progress_bar: bool, stream: TextIO = sys.stdout) -> dict[str, Any] | None:
    """Start the processes and wait. Returns summary.json (train jobs) or None; raises RunFailed."""
    import torch
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # One process per GPU when there are GPUs (the trainer uses cuda:LOCAL_RANK); on CPU any number.
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus and local.world_size > gpus:
        raise UsageError(
            f"{local.world_size} processes need {local.world_size} GPUs; this machine has {gpus} "
            f"(use --procs {gpus}, or hide the GPUs with CUDA_VISIBLE_DEVICES= to run on CPU)"
        )
    local.output_dir.mkdir(parents=True, exist_ok=True)
    env = dict(local.env)
    # The caller's environment overrides the job's exporter settings (e.g. ORCH_METRICS_PORT=0 turns it off).
    env.update({name: value for name, value in os.environ.items() if name in METRICS_ENV})
    if local.train is not None:
        config_file = local.output_dir / "train.json"
        config_file.write_text(json.dumps(local.train.model_dump(mode="json"), indent=2) + "\n")
        entrypoint, args = sys.executable, ["-m", TRAINER_MODULE, "--config", str(config_file.resolve())]
        progress_file = local.output_dir / "progress.jsonl"
        progress_file.unlink(missing_ok=True)
        env["ORCH_PROGRESS_FILE"] = str(progress_file.resolve())
        env["ORCH_LOG_LINES"] = "0" if progress_bar else "1"
    else:
        assert local.command is not None
        entrypoint, args, progress_file, progress_bar = local.command[0], local.command[1:], None, False
    # Processes share this machine's cores: one thread pool each, sized to its share (as torchrun does).
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // local.world_size)))

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=local.world_size,
        run_id=f"orch-{os.getpid()}",
        rdzv_backend="c10d",  # torchrun --standalone: a TCP store on a free local port
        rdzv_endpoint="localhost:0",
        max_restarts=local.max_restarts,
        monitor_interval=0.1,
    )
    with _environment(env), _progress(progress_file if progress_bar else None, stream):
        try:
            elastic_launch(config, entrypoint)(*args)
        except ChildFailedError as error:
            raise RunFailed(_failure_message(error, local.max_restarts)) from None
        except (SignalException, KeyboardInterrupt):
            raise RunInterrupted(f"interrupted: stopped all {local.world_size} processes") from None
    summary_file = local.output_dir / "summary.json"
    return json.loads(summary_file.read_text()) if local.train is not None else None


def _failure_message(error: Any, max_restarts: int) -> str:
    rank, failure = error.get_first_failure()
    message = failure.message  # with @record: {"message": "<traceback, ending in the exception>", ...}
    if isinstance(message, dict):
        message = str(message.get("message", ""))
    lines = [line for line in message.strip().splitlines() if line.strip()]
    reason = lines[-1] if lines else f"exit code {failure.exitcode}"
    restarts = f" after {max_restarts} restart{'s' * (max_restarts != 1)}" if max_restarts else ""
    return f"rank {rank} failed{restarts} (exit code {failure.exitcode}): {reason}"


@contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """Workers inherit the launcher's environment: set ours for the run, restore it afterwards."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def _progress(events_file: Path | None, stream: TextIO) -> Iterator[None]:
    """Draw a progress bar from rank 0's JSON events while the run lasts (terminal only)."""
    if events_file is None:
        yield
        return
    stop = threading.Event()
    thread = threading.Thread(target=_follow, args=(events_file, stop, stream), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=2)


def _follow(events_file: Path, stop: threading.Event, stream: TextIO) -> None:
    position, pending = 0, ""
    while True:
        finished = stop.is_set()
        if events_file.exists():
            with open(events_file) as file:
                file.seek(position)
                pending += file.read()
                position = file.tell()
            *complete, pending = pending.split("\n")
            for line in complete:
                stream.write(progress_text(json.loads(line)))
            stream.flush()
        if finished:
            stream.write("\n")
            return
        time.sleep(0.2)


def progress_text(event: dict[str, Any]) -> str:
    """One event as terminal text: the bar redraws itself in place (carriage return)."""
    from orchestrator.trainer.report import format_duration

    if event["event"] == "step":
        width, done = 30, event["step"] / event["max_steps"]
        bar = "#" * int(width * done) + "-" * (width - int(width * done))
        return (
            f"\r[{bar}] step {event['step']}/{event['max_steps']}  loss {event['loss']:.4f}  "
            f"{event['samples_per_second']:,.0f} samples/s  ETA {format_duration(event['eta_seconds'])} "
        )
    if event["event"] == "eval":
        values = "  ".join(f"{k} {v:.4f}" for k, v in event.items() if k not in ("event", "step"))
        return f"\r\x1b[2Keval at step {event['step']}: {values}\n"
    return ""
