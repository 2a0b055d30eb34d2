"""`orch run`: the job's processes on this machine, through torch's elastic launcher (what torchrun uses).

The workers run exactly what a pod runs (`python -m orchestrator.trainer --config train.json`, or the
job's `command`), with the same ORCH_* environment, gloo on CPU or one process per local GPU.
torch is imported inside the functions: `orch --help` must stay light.

The process tree: `orch run` (torch's elastic agent runs in this process, and hosts the rendezvous store)
-> one child per rank, each started through orchestrator.local_worker, which ties it to this process
(PR_SET_PDEATHSIG: SIGKILLed when the launcher dies, whatever killed it), appends its stdout and stderr to
OUT/logs/rank-N.log and execs the command. The console shows rank 0's log as it grows (tracebacks left in
the file) and, at the end, one line: the result, or the first failing rank with its error and its log.

The output directory is held by one run at a time (an flock on OUT/run.lock, released by the kernel when
the run ends however it ends); default directories are unique (runs/NAME-TIMESTAMP, then -2, -3, ...).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from orchestrator import runtime_env, storage
from orchestrator.errors import OrchError, UsageError
from orchestrator.trainer.metrics import pid_alive

if TYPE_CHECKING:
    from orchestrator.spec import JobSpec, TrainSpec

TRAINER_MODULE = "orchestrator.trainer"


class RunFailed(OrchError):
    """A rank failed (after any elastic restarts); the message names it and its error."""

    exit_code = 1


class RunInterrupted(OrchError):
    """Ctrl-C (or SIGTERM): every rank was stopped. `stopped_at`: the step whose checkpoint the ranks wrote
    before they stopped (train.checkpoint.on_stop), None when they stopped without one."""

    exit_code = 130

    def __init__(self, message: str, *, stopped_at: int | None = None) -> None:
        super().__init__(message)
        self.stopped_at = stopped_at


@dataclass(frozen=True)
class LocalPlan:
    """Everything `orch run` decided before starting a process (pure data, printed to the user)."""

    world_size: int
    output_dir: Path
    train: TrainSpec | None
    command: list[str] | None
    env: dict[str, str]
    max_restarts: int
    restart_policy: str = "none"
    """`job`: restart.policy job (all local ranks restart together); `elastic`: the elastic section's."""
    gpus_per_node: int = 0
    unique_output_dir: bool = False
    """The default runs/NAME-TIMESTAMP: `claim` adds -2, -3, ... when another run took it."""
    output_url: str | None = None
    """An object store that keeps the checkpoints, model.pt and summary.json (the trainer's ORCH_OUTPUT_URL)."""

    @property
    def accumulation(self) -> int | None:
        return self.train.accumulation(self.world_size) if self.train else None


# A local run serves metrics on the loopback interface only, unless ORCH_METRICS_ADDR says otherwise.
LOCAL_METRICS_ADDR = "127.0.0.1"
LOCK_FILE = "run.lock"
RUN_FILE = "run.json"
LOG_DIR = "logs"


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
    # An object store (--out s3://..., or output.url) keeps the checkpoints, model and summary; the logs,
    # the progress and the lock stay in a local directory (a new one per run, as without --out).
    output_url = spec.output.url if spec.output is not None else None
    if output_dir and storage.is_url(output_dir):
        if problem := storage.url_problem(output_dir):
            raise UsageError(f"--out {output_dir}: {problem}")
        output_url, output_dir = output_dir.rstrip("/"), None
    out = Path(output_dir) if output_dir else Path("runs") / f"{spec.name}-{stamp}"
    from orchestrator.images import git_revision

    runtime = runtime_env.RuntimeEnv.for_job(
        spec,
        name=spec.name,
        output_dir=str(out.resolve()),
        output_url=output_url,
        git_commit=git_revision("."),
    )
    env = {**runtime.to_env(), **spec.env, "PYTHONUNBUFFERED": "1"}
    policy, max_restarts = restart_budget(spec)
    return LocalPlan(
        world_size=world_size,
        output_dir=out,
        train=train,
        command=list(spec.command) if spec.command else None,
        env=env,
        max_restarts=max_restarts,
        restart_policy=policy,
        gpus_per_node=spec.gpus_per_node,
        unique_output_dir=not output_dir,
        output_url=output_url,
    )


def check_store(local: LocalPlan) -> None:
    """Before any process starts: the object store can be written to with the job's environment, or one
    line and exit 2 (a missing bucket, bad credentials, an endpoint that does not answer)."""
    if local.output_url is None:
        return
    with _environment(local.env):
        try:
            storage.check_writable(local.output_url)
        except storage.StorageError as error:
            raise UsageError(str(error)) from None


def restart_budget(spec: JobSpec) -> tuple[str, int]:
    """How many times the launcher restarts every local rank after a failure, and why.

    torch's elastic agent always restarts the whole local worker group together, which is what
    `restart.policy: job` asks of a cluster (every pod restarts, the trainer resumes from its last checkpoint).
    The pod policies (on-failure, exit-code, never) restart single pods, and one pod holds every local rank:
    locally they restart nothing, as before. An elastic section keeps its own max_restarts.
    """
    if spec.restart.policy == "job":
        return "job", spec.restart.max_restarts
    if spec.elastic is not None:
        return "elastic", spec.elastic.max_restarts
    return "none", 0


def check_devices(local: LocalPlan) -> list[str]:
    """Refuse more processes than local GPUs; return warnings to show once (a GPU job on a CPU machine)."""
    import torch

    # One process per GPU when there are GPUs (the trainer uses cuda:LOCAL_RANK); on CPU any number.
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus and local.world_size > gpus:
        raise UsageError(
            f"{local.world_size} processes need {local.world_size} GPUs; this machine has {gpus} "
            f"(use --procs {gpus}, or hide the GPUs with CUDA_VISIBLE_DEVICES= to run on CPU)"
        )
    if local.gpus_per_node and not gpus:
        return [
            f"the job asks for {local.gpus_per_node} GPU{'s' * (local.gpus_per_node != 1)} per node but this "
            f"machine has none (torch sees no CUDA device): running {local.world_size} "
            f"process{'es' * (local.world_size != 1)} on the CPU with gloo"
        ]
    return []


class OutputDirBusy(OrchError):
    """Another live `orch run` holds the output directory."""

    exit_code = 2


@contextmanager
def claim(local: LocalPlan) -> Iterator[LocalPlan]:
    """Create and lock the output directory for this run; yields the plan with the directory it got.

    The lock (flock on OUT/run.lock) lasts while the block runs and dies with this process, however it
    dies: a second run into the same directory is refused instead of mixing its files with this one's.
    """
    import fcntl

    directory = _create_output_dir(local.output_dir, unique=local.unique_output_dir)
    try:
        lock = open(directory / LOCK_FILE, "a+")  # noqa: SIM115 (held until the run ends)
    except OSError as error:
        raise UsageError(f"--out {directory}: cannot write in it: {error.strerror}") from None
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_json(directory / RUN_FILE).get("pid")
            raise OutputDirBusy(
                f"{directory}/ is in use by another orch run"
                + (f" (pid {holder})" if holder else "")
                + ": wait for it to finish, or pass another --out"
            ) from None
        if directory != local.output_dir:
            local = dataclasses.replace(
                local,
                output_dir=directory,
                env={**local.env, runtime_env.OUTPUT_DIR: str(directory.resolve())},
            )
        yield local
    finally:
        lock.close()


def _create_output_dir(directory: Path, *, unique: bool) -> Path:
    """mkdir, turning what the filesystem says into one line. A unique directory is claimed by an
    exclusive mkdir: two runs started in the same second get NAME-STAMP and NAME-STAMP-2."""
    candidate, number = directory, 1
    while True:
        try:
            candidate.mkdir(parents=True, exist_ok=not unique)
            return candidate
        except FileExistsError:
            if unique and candidate.is_dir():
                number += 1
                candidate = directory.with_name(f"{directory.name}-{number}")
                continue
            raise UsageError(f"--out {candidate}: exists and is not a directory") from None
        except OSError as error:
            raise UsageError(f"--out {candidate}: cannot create it: {error.strerror}") from None


def run(local: LocalPlan, *, progress_bar: bool, stream: TextIO = sys.stdout) -> dict[str, Any] | None:
    """Start the processes and wait (inside `claim`). Returns summary.json (train jobs) or None; raises
    RunFailed or RunInterrupted with one line: every rank's output is in OUT/logs/rank-N.log."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    log_dir = local.output_dir / LOG_DIR
    log_dir.mkdir(exist_ok=True)
    # A previous run in this directory (resuming) keeps its lines: logs and progress.jsonl grow by one
    # header per run (and per restart) and the console shows only what this run adds.
    started = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    env = dict(local.env)
    # The caller's environment overrides the job's exporter settings (e.g. ORCH_METRICS_PORT=0 turns it off).
    env.update({name: value for name, value in os.environ.items() if name in runtime_env.USER_OVERRIDES})
    # The trainer serves metrics; a `command:` job gets the same variables but nothing is promised.
    metrics_url = _choose_metrics_endpoint(env, local.output_dir, stream) if local.train is not None else None
    env.update(
        ORCH_LAUNCHER_PID=str(os.getpid()),
        ORCH_LOG_DIR=str(log_dir.resolve()),
    )
    # the log keeps every line; the console drops the ones the progress bar shows
    env[runtime_env.LOG_LINES] = "1"
    if local.train is not None:
        config_file = local.output_dir / "train.json"
        config_file.write_text(runtime_env.train_json(local.train), encoding="utf-8")
        entrypoint, args = sys.executable, ["-m", TRAINER_MODULE, "--config", str(config_file.resolve())]
        progress_file = local.output_dir / "progress.jsonl"
        with open(progress_file, "a") as events:
            events.write(json.dumps({"event": "run", "started": started, "pid": os.getpid()}) + "\n")
        env[runtime_env.PROGRESS_FILE] = str(progress_file.resolve())
    else:
        assert local.command is not None
        entrypoint, args, progress_file, progress_bar = local.command[0], local.command[1:], None, False
    # Every rank starts through the shim that ties it to this process and sends its output to its log.
    entrypoint, args = sys.executable, ["-m", WORKER_MODULE, entrypoint, *args]
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
        logs_specs=_RunLogs(log_dir),  # error files in OUT/logs, no torchelastic_* folder in /tmp
        **_shutdown_timeout(local),
    )
    record = _register(local, metrics_url)
    try:
        with (
            _environment(env),
            _launcher_log(log_dir / "launcher.log"),
            _console(log_dir / "rank-0.log", progress_file if progress_bar else None, stream, local),
        ):
            try:
                elastic_launch(config, entrypoint)(*args)
            except ChildFailedError as error:
                raise RunFailed(_failure_message(error, local, log_dir)) from None
            except (SignalException, KeyboardInterrupt):
                stopped_at = _stopped_at(progress_file) if progress_file is not None else None
                if stopped_at is None:
                    raise RunInterrupted(
                        f"interrupted: stopped all {local.world_size} processes (their output: {log_dir}/)"
                    ) from None
                raise RunInterrupted(
                    f"interrupted: all {local.world_size} processes stopped at step {stopped_at} after "
                    f"writing a checkpoint (their output: {log_dir}/)",
                    stopped_at=stopped_at,
                ) from None
    finally:
        record.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the index folders go with the last live run
            record.parent.rmdir()
            record.parent.parent.rmdir()
        shutil.rmtree(local.output_dir / METRICS_DB_DIR, ignore_errors=True)
    return read_summary(local.output_dir / "summary.json", log_dir) if local.train is not None else None


def read_summary(summary_file: Path, log_dir: Path) -> dict[str, Any]:
    """summary.json as the trainer left it, read defensively: every rank exited 0, yet the file may be
    missing (a task that called sys.exit(0)), unreadable or of another shape; each is one line, not a
    traceback."""
    try:
        summary = json.loads(summary_file.read_text())
    except FileNotFoundError:
        raise RunFailed(
            f"every process exited 0 but the trainer wrote no {summary_file.name}: the run did not finish "
            f"(does the task call sys.exit()?); their output: {log_dir}/"
        ) from None
    except (OSError, ValueError) as error:
        raise RunFailed(f"cannot read {summary_file}: {error}") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("steps"), int):
        raise RunFailed(f"{summary_file} is not a summary of a run (no step count)")
    return summary


def _shutdown_timeout(local: LocalPlan) -> dict[str, Any]:
    """How long the launcher waits, after forwarding a Ctrl-C or SIGTERM, for the ranks to write their stop
    checkpoint before it SIGKILLs them: train.checkpoint.on_stop. LaunchConfig has the field from torch 2.12;
    older releases keep their fixed 30 s."""
    from torch.distributed.launcher.api import LaunchConfig

    budget = local.train.checkpoint.on_stop if local.train is not None else 0
    if not budget or "shutdown_timeout" not in {f.name for f in dataclasses.fields(LaunchConfig)}:
        return {}
    return {"shutdown_timeout": budget}


def _stopped_at(progress_file: Path) -> int | None:
    """The step of this run's `stopped` event (the trainer's stop checkpoint), if it wrote one."""
    step = None
    with contextlib.suppress(OSError):
        for line in progress_file.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == "run":
                    step = None  # an earlier run's stop does not count
                elif event.get("event") == "stopped":
                    step = int(event["step"])
    return step


WORKER_MODULE = "orchestrator.local_worker"
METRICS_DB_DIR = ".metrics"  # prometheus-client's multiprocess files, removed when the run ends


def _failure_message(error: Any, local: LocalPlan, log_dir: Path) -> str:
    """One line: the first failing rank, its exception and where it was raised, and its log file."""
    rank, failure = _first_failure(error)
    data = failure.error_file_data.get("message") if isinstance(failure.error_file_data, dict) else None
    if isinstance(data, dict):  # written by @record (trainer) or local_worker: the exception, the traceback
        reason = str(data.get("message", "")).strip().splitlines()[-1:] or [""]
        where = _raised_at(str((data.get("extraInfo") or {}).get("py_callstack", "")))
        text = reason[0] + (f" (at {where})" if where else "")
    elif failure.exitcode < 0:
        text = f"killed by {_signal_name(-failure.exitcode)}"
    elif (
        failure.exitcode > 128
    ):  # the trainer's stop on a signal (its checkpoint written), or a shell's report
        text = f"stopped on {_signal_name(failure.exitcode - 128)}"
    else:
        text = "no error recorded"
    restarts = (
        f" after {local.max_restarts} restart{'s' * (local.max_restarts != 1)}" if local.max_restarts else ""
    )
    return f"rank {rank} failed{restarts} (exit code {failure.exitcode}): {text}; its output: {log_dir}/rank-{rank}.log"


def _first_failure(error: Any) -> tuple[int, Any]:
    """The rank that failed first. A rank killed by a signal other than the agent's SIGTERM (SIGKILL, an
    OOM kill, a segfault) is taken as the cause; otherwise the earliest error file (torch's own choice
    compares whole seconds, and the peers of a failed rank raise connection errors within milliseconds),
    and a rank that failed on its own before one the launcher stopped (SIGTERM, or the trainer's 128+signal
    exit after its stop checkpoint), which has no error file either."""
    failures = dict(error.failures)
    killed = [r for r, f in failures.items() if f.exitcode < 0 and -f.exitcode not in STOP_SIGNALS]
    if killed:
        return min(killed), failures[min(killed)]

    def order(item: tuple[int, Any]) -> tuple[bool, float]:
        exitcode = item[1].exitcode
        stopped = -exitcode in STOP_SIGNALS or exitcode - 128 in STOP_SIGNALS
        try:
            return stopped, os.stat(item[1].error_file).st_mtime_ns
        except OSError:
            return stopped, float("inf")

    recorded = sorted(failures.items(), key=order)
    return recorded[0] if recorded else error.get_first_failure()


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # what the launcher sends the ranks it stops


def _raised_at(callstack: str) -> str:
    """`file.py:LINE in function` of the innermost frame of a Python traceback, or ''."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', callstack)
    if not frames:
        return ""
    file, line, function = frames[-1]
    with contextlib.suppress(ValueError):
        file = os.path.relpath(file) if not os.path.relpath(file).startswith("..") else file
    return f"{file}:{line} in {function}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _RunLogs(log_dir: Path) -> Any:  # noqa: N802 (a class made on first use)
    """torch's LogsSpecs for a run: workers keep their stdio (local_worker redirects it to
    logs/rank-N.log, appending across restarts); error files go to logs/errors/attempt-K/rank-N.json."""
    from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs

    class RunLogs(LogsSpecs):
        def __init__(self) -> None:
            super().__init__(log_dir=str(log_dir))

        @property
        def root_log_dir(self) -> str:
            return str(log_dir)

        def reify(self, envs: dict[int, dict[str, str]]) -> Any:
            attempt = next(iter(envs.values()), {}).get("TORCHELASTIC_RESTART_COUNT", "0")
            errors = log_dir / "errors" / f"attempt-{attempt}"
            shutil.rmtree(errors, ignore_errors=True)
            errors.mkdir(parents=True)
            files = {}
            for local_rank, worker_env in envs.items():
                files[local_rank] = str(errors / f"rank-{worker_env.get('RANK', local_rank)}.json")
                worker_env["TORCHELASTIC_ERROR_FILE"] = files[local_rank]
            empty = dict.fromkeys(envs, "")  # "": the launcher's own stdout/stderr
            return LogsDest(stdouts=empty, stderrs=dict(empty), error_files=files)

    return RunLogs()


def _choose_metrics_endpoint(env: dict[str, str], output_dir: Path, stream: TextIO) -> str | None:
    """Loopback unless ORCH_METRICS_ADDR says otherwise; the job's port, or a free one when it is taken."""
    port = runtime_env.RuntimeEnv.from_environ(env).metrics_port
    if port <= 0:
        return None
    addr = env.setdefault(runtime_env.METRICS_ADDR, LOCAL_METRICS_ADDR)
    chosen = _free_port(addr, port)
    env[runtime_env.METRICS_PORT] = str(chosen)
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:  # the ranks' series files, inside the run
        env["PROMETHEUS_MULTIPROC_DIR"] = str((output_dir / METRICS_DB_DIR).resolve())
    host = "127.0.0.1" if addr in ("0.0.0.0", "") else addr
    url = f"http://{host}:{chosen}/metrics"
    taken = f" (port {port} is in use)" if chosen != port else ""
    stream.write(f"metrics: {url}{taken}\n")
    stream.flush()
    return url


def _free_port(addr: str, port: int) -> int:
    """`port` when it can be bound on `addr`, else a free port the kernel picks."""
    for candidate in (port, 0):
        with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the exporter's HTTP server does
            try:
                sock.bind((addr, candidate))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    return port  # cannot bind at all: the exporter will say why, and training goes on


# --- the live-run index: how `orch top NAME --local` finds a run's exporter --------------------------------


def runs_index() -> Path:
    """One small JSON file per live local run (this user's), removed when the run ends."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"orch-{os.getuid()}" / "runs"


def _register(local: LocalPlan, metrics_url: str | None) -> Path:
    record = {
        "job": local.env[runtime_env.JOB_NAME],
        "pid": os.getpid(),
        "started": time.time(),
        "output_dir": str(local.output_dir.resolve()),
        "procs": local.world_size,
        "metrics": metrics_url,
    }
    (local.output_dir / RUN_FILE).write_text(json.dumps(record, indent=2) + "\n")
    index = runs_index()
    entry = index / f"{record['job']}-{os.getpid()}.json"
    try:
        index.mkdir(parents=True, exist_ok=True)
        entry.write_text(json.dumps(record) + "\n")
    except OSError:
        pass  # only `orch top --local` needs it
    return entry


def live_runs(job: str) -> list[dict[str, Any]]:
    """The local runs of `job` that are still running, newest first (stale entries are removed)."""
    found = []
    for entry in runs_index().glob(f"{job}-*.json"):
        record = _read_json(entry)
        if record.get("job") != job:
            continue
        if not pid_alive(int(record.get("pid") or 0)):
            entry.unlink(missing_ok=True)
            continue
        found.append(record)
    return sorted(found, key=lambda r: r.get("started", 0), reverse=True)


def metrics_url_of(job: str) -> str | None:
    """The exporter URL of the newest live local run of `job`, if it serves metrics."""
    return next((r["metrics"] for r in live_runs(job) if r.get("metrics")), None)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@contextmanager
def _launcher_log(path: Path) -> Iterator[None]:
    """torch's launcher and agent log to OUT/logs/launcher.log, not the console (one line is ours to print)."""
    handler = logging.FileHandler(path, mode="a")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    loggers = [
        logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.distributed.launcher")
    ]
    saved = [(lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
        lg.propagate = False
    try:
        yield
    finally:
        for lg, (level, propagate) in zip(loggers, saved, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)
            lg.propagate = propagate
        handler.close()


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
def _console(rank0_log: Path, events_file: Path | None, stream: TextIO, local: LocalPlan) -> Iterator[None]:
    """Show rank 0's output while the run lasts (and a progress bar from its events on a terminal)."""
    console = _Console(rank0_log, events_file, stream, local)
    stop = threading.Event()
    thread = threading.Thread(target=console.follow, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


# The first line of a Python traceback; torch prefixes a rank's uncaught exception with "[rankN]:".
_TRACEBACK = re.compile(r"(\[rank\d+\]:\s*)?Traceback \(most recent call last\):")
# Lines of the trainer's reporter that the progress bar replaces on a terminal.
_BAR_SHOWS = re.compile(r"(step \d+/\d+  |eval at step \d+: |training |done: )")


class _Console:
    """Follows OUT/logs/rank-0.log (every attempt of this run) and, with a bar, rank 0's progress events.

    A Python traceback is left in the log: the run ends with one line naming the failure and the file.
    """

    def __init__(self, log: Path, events: Path | None, stream: TextIO, local: LocalPlan) -> None:
        self.log, self.events, self.stream, self.local = log, events, stream, local
        # an earlier run's lines (same --out) were shown then: follow from the current ends
        self.positions = {path: _size(path) for path in (log, events)}
        self.pending = {log: "", events: ""}
        self.hiding_traceback = False
        self.bar = ""

    def follow(self, stop: threading.Event) -> None:
        while True:
            finished = stop.is_set()  # read once more after the workers are gone: nothing is lost
            for line in self._new_lines(self.log):
                self._log_line(line)
            if self.events is not None:
                for line in self._new_lines(self.events):
                    text = progress_text(json.loads(line))
                    if text.startswith("\r["):
                        self.bar = text
                    self.stream.write(text)
            self.stream.flush()
            if finished:
                if self.events is not None and self.bar:
                    self.stream.write("\n")
                    self.stream.flush()
                return
            time.sleep(0.2)

    def _new_lines(self, path: Path | None) -> list[str]:
        if path is None or not path.exists():
            return []
        with open(path, errors="replace") as file:
            file.seek(self.positions[path])
            self.pending[path] += file.read()
            self.positions[path] = file.tell()
        *complete, self.pending[path] = self.pending[path].split("\n")
        return complete

    def _log_line(self, line: str) -> None:
        from orchestrator.local_worker import HEADER

        if line.startswith(HEADER):
            self.hiding_traceback = False
            attempt = re.search(r"attempt (\d+)", line)
            if attempt and int(attempt.group(1)) > 0:
                policy = (
                    f"restart.policy {self.local.restart_policy}"
                    if self.local.restart_policy == "job"
                    else ("elastic.max_restarts")
                )
                self._print(
                    f"restarting all {self.local.world_size} ranks together: restart {attempt.group(1)} "
                    f"of {self.local.max_restarts} ({policy})"
                )
            return
        if _TRACEBACK.match(line):
            self.hiding_traceback = True
        if self.hiding_traceback or (self.events is not None and _BAR_SHOWS.match(line)):
            return
        self._print(line)

    def _print(self, line: str) -> None:
        if self.events is not None and self.bar:  # clear the bar, print the line, draw the bar again
            self.stream.write(f"\r\x1b[2K{line}\n{self.bar}")
        else:
            self.stream.write(line + "\n")


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def progress_text(event: dict[str, Any]) -> str:
    """One event as terminal text: the bar redraws itself in place (carriage return)."""
    from orchestrator.trainer.report import format_duration, format_value

    if event["event"] == "step":
        width, done = 30, event["step"] / event["max_steps"]
        bar = "#" * int(width * done) + "-" * (width - int(width * done))
        return (
            f"\r[{bar}] step {event['step']}/{event['max_steps']}  loss {event['loss']:.4f}  "
            f"{event['samples_per_second']:,.0f} samples/s  ETA {format_duration(event['eta_seconds'])} "
        )
    if event["event"] == "eval":
        values = "  ".join(f"{k} {format_value(v)}" for k, v in event.items() if k not in ("event", "step"))
        return f"\r\x1b[2Keval at step {event['step']}: {values}\n"
    return ""


def tracking_links(output_dir: Path) -> dict[str, str]:
    """Where the trainer recorded the run (its tracking.json in the output dir), for `orch run`'s last line."""
    from orchestrator.trainer.tracking import read_links

    return read_links(output_dir)
