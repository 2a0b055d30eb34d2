"""The launch of a local run: the job's processes on this machine, through torch's elastic launcher (what
torchrun uses), waited for and turned into a result or one line naming the failure.

The workers run exactly what a pod runs (`python -m orchestrator.trainer --config train.json`, or the
job's `command`), with the same ORCH_* environment, gloo on CPU or one process per local GPU.
torch is imported inside the functions: `orch --help` must stay light.

The process tree: `orch run` (torch's elastic agent runs in this process, and hosts the rendezvous store)
-> one child per rank, each started through orchestrator/local/worker.py, which ties it to this process
(PR_SET_PDEATHSIG: SIGKILLed when the launcher dies, whatever killed it), appends its stdout and stderr to
OUT/logs/rank-N.log and execs the command. The console shows rank 0's log as it grows (tracebacks left in
the file) and, at the end, one line: the result, or the first failing rank with its error and its log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from orchestrator import exit_codes, launch, outputs, runtime_env
from orchestrator.errors import OrchError
from orchestrator.local import worker
from orchestrator.local.console import RunLogs, launcher_log, live_console
from orchestrator.local.index import register
from orchestrator.local.planning import LocalPlan, environment

TRAINER_MODULE = "orchestrator.trainer"


class RunFailed(OrchError):
    """A rank failed (after any elastic restarts); the message names it and its error. `exit_code` keeps the
    failure's class, as a pod's launcher does: 1 (permanent) for an exception or a run that did not finish,
    128 + N (retryable) for a rank killed by signal N, a rank's own code otherwise (2: it refused its input;
    exit_codes.RESULTS_NOT_KEPT: the training finished but its results could not all be written)."""

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class RunInterrupted(OrchError):
    """Ctrl-C (or SIGTERM): every rank was stopped. `stopped_at`: the step whose checkpoint the ranks wrote
    before they stopped (train.checkpoint.on_stop), None when they stopped without one. The exit code is
    128 + the first signal (130 for Ctrl-C, 143 for SIGTERM), what a shell reports for a process it killed."""

    def __init__(self, message: str, *, stopped_at: int | None = None, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.stopped_at, self.signum = stopped_at, signum
        self.exit_code = 128 + signum


class _StopSignals:
    """SIGINT, SIGTERM and SIGHUP for the length of one launch. While the ranks run, a signal raises torch's
    SignalException: torch's agent installs the same handler once it starts the ranks, and stops them on it
    (the first one forwarded, so they write their stop checkpoint; a second one stops them at once); ours
    covers the rendezvous before that. Once the launch has returned or raised, the run is over: a further
    signal is noted, not raised, so that what is left (rank 0's last lines on the console, the live-run
    index, the one line) finishes instead of ending in a traceback (#33: a second Ctrl-C just as the ranks
    had stopped). `restore` puts back the handlers found at `install` (orch's Python API may run in a
    notebook)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self.late: list[int] = []

    def install(self) -> None:
        for number in self.SIGNALS:
            self._previous[number] = signal.signal(number, launch.raise_signal)

    def settle(self) -> None:
        for number in self._previous:
            signal.signal(number, self._note)

    def restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _note(self, number: int, frame: Any) -> None:
        self.late.append(number)


def _first_signal(error: BaseException) -> int:
    """The signal that started the stop: a second one raised while torch's agent stopped the ranks carries the
    first in its context (`__context__`); KeyboardInterrupt is Ctrl-C."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    first, seen = int(signal.SIGINT), set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, SignalException):
            first = int(current.sigval)
        elif isinstance(current, KeyboardInterrupt):
            first = int(signal.SIGINT)
        current = current.__context__
    return first


# A local run serves metrics on the loopback interface only, unless ORCH_METRICS_ADDR says otherwise.
LOCAL_METRICS_ADDR = "127.0.0.1"


def run(local: LocalPlan, *, progress_bar: bool, stream: TextIO = sys.stdout) -> dict[str, Any] | None:
    """Start the processes and wait (inside `claim`). Returns summary.json (train jobs) or None; raises
    RunFailed or RunInterrupted with one line: every rank's output is in OUT/logs/rank-N.log."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    log_dir = local.output_dir / outputs.LOGS
    log_dir.mkdir(exist_ok=True)
    # A previous run in this directory (resuming) keeps its lines: logs and progress.jsonl grow by one
    # header per run (and per restart) and the console shows only what this run adds.
    started = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    env = dict(local.env)
    # The caller's environment overrides the job's exporter settings (e.g. ORCH_METRICS_PORT=0 turns it off).
    env.update({name: value for name, value in os.environ.items() if name in runtime_env.USER_OVERRIDES})
    # The trainer serves metrics; a `command:` job gets the same variables but nothing is promised.
    endpoint_file = _metrics_endpoint(env, local.output_dir) if local.train is not None else None
    env.update({worker.LAUNCHER_PID: str(os.getpid()), worker.LOG_DIR: str(log_dir.resolve())})
    # The goodput journal's start, when this is the job's first run (a resumed OUT keeps the first run's).
    launched = time.time()
    env[runtime_env.JOB_STARTED] = repr(launched)
    env.update(outputs.nccl_trace_env(local.output_dir.resolve(), env))  # GPUs: NCCL's dumps
    # the log keeps every line; the console drops the ones the progress bar shows
    env[runtime_env.LOG_LINES] = "1"
    if local.train is not None:
        config_file = local.output_dir / outputs.TRAIN_CONFIG
        config_file.write_text(runtime_env.train_json(local.train), encoding="utf-8")
        entrypoint, args = sys.executable, ["-m", TRAINER_MODULE, "--config", str(config_file.resolve())]
        progress_file = local.output_dir / outputs.PROGRESS
        with open(progress_file, "a") as events:
            events.write(json.dumps({"event": "run", "started": started, "pid": os.getpid()}) + "\n")
        env[runtime_env.PROGRESS_FILE] = str(progress_file.resolve())
    else:
        assert local.command is not None
        entrypoint, args, progress_file, progress_bar = local.command[0], local.command[1:], None, False
    # Every rank starts through the shim that ties it to this process and sends its output to its log.
    entrypoint, args = sys.executable, ["-m", worker.__name__, entrypoint, *args]
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
        logs_specs=RunLogs(log_dir),  # error files in OUT/logs, no torchelastic_* folder in /tmp
        **_shutdown_timeout(local),
    )
    record = register(local, endpoint_file)
    stops = _StopSignals()
    try:
        stops.install()
        try:
            with (
                environment(env),
                launcher_log(log_dir / outputs.LAUNCHER_LOG),
                live_console(
                    outputs.rank_log(log_dir, 0), progress_file if progress_bar else None, stream, local
                ),
                launch.restart_rule() as restarts,  # a refusal is not restarted, as in a pod
            ):
                try:
                    elastic_launch(config, entrypoint)(*args)
                finally:
                    stops.settle()  # the ranks are gone: from here a signal is noted, not raised
        except ChildFailedError as error:
            hang = _hang_line(local.output_dir, since=launched)
            message, code = _failure_message(error, local, log_dir, restarts)
            raise RunFailed(hang + message, exit_code=code) from None
        except (SignalException, KeyboardInterrupt) as error:
            stops.settle()  # (a signal before the launch began)
            signum = _first_signal(error)
            stopped_at = _stopped_at(progress_file) if progress_file is not None else None
            if stopped_at is None:
                raise RunInterrupted(
                    f"interrupted: stopped all {local.world_size} processes (their output: {log_dir}/)",
                    signum=signum,
                ) from None
            raise RunInterrupted(
                f"interrupted: all {local.world_size} processes stopped at step {stopped_at} after "
                f"writing a checkpoint (their output: {log_dir}/)",
                stopped_at=stopped_at,
                signum=signum,
            ) from None
    finally:
        stops.settle()
        record.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the index folders go with the last live run
            record.parent.rmdir()
            record.parent.parent.rmdir()
        shutil.rmtree(local.output_dir / outputs.METRICS_FILES, ignore_errors=True)
        if endpoint_file is not None:
            endpoint_file.unlink(missing_ok=True)
        stops.restore()
    return _summary(local.output_dir, log_dir) if local.train is not None else None


def _summary(output_dir: Path, log_dir: Path) -> dict[str, Any]:
    """summary.json, once every rank exited 0: the file may yet be missing (a task that called
    sys.exit(0)), unreadable or of another shape; each is one line, not a traceback."""
    try:
        summary = outputs.read_summary(output_dir)
    except outputs.UnreadableSummary as error:
        raise RunFailed(str(error)) from None
    if summary is None:
        raise RunFailed(
            f"every process exited 0 but the trainer wrote no {outputs.SUMMARY}: the run did not finish "
            f"(does the task call sys.exit()?); their output: {log_dir}/"
        )
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


def _hang_line(output_dir: Path, *, since: float) -> str:
    """The hang verdict a rank wrote during this run (OUT/hang.json, orchestrator/trainer/heartbeat.py), as
    the start of the failure line: which ranks stopped, at which step and phase; '' without one."""
    verdict = outputs.read_json(output_dir / outputs.HANG)
    at, line = verdict.get("at"), verdict.get("line")
    if not isinstance(at, (int, float)) or at < since or not isinstance(line, str):
        return ""
    return f"{line}, every rank's stack in its log; "


def _failure_message(
    error: Any, local: LocalPlan, log_dir: Path, restarts: launch.Restarts | None = None
) -> tuple[str, int]:
    """One line and `orch run`'s exit code: the first failing rank, its exception and where it was raised, its
    log file, and before it any rank that had exited 0 while the others ran (what they failed waiting for).
    The code keeps the named rank's class as a pod's launcher does (launch.code_of): 1 for an exception,
    128 + N for a rank killed by signal N, the rank's own code otherwise (137 from a shell, say). A rank
    whose results could not be kept (the training finished) is said in its own words."""
    rank, failure = _first_failure(error)
    data = failure.error_file_data.get("message") if isinstance(failure.error_file_data, dict) else None
    if failure.exitcode == exit_codes.RESULTS_NOT_KEPT and isinstance(data, dict):
        said = (str(data.get("message", "")).strip().splitlines() or [""])[-1]
        said = re.sub(r"^[A-Za-z_][\w.]*: ", "", said, count=1)  # @record's `ResultsNotKept: ` before it
        return f"{said}; its output: {outputs.rank_log(log_dir, rank)}", exit_codes.RESULTS_NOT_KEPT
    if isinstance(data, dict):  # written by @record (trainer) or worker.py: the exception, the traceback
        reason = str(data.get("message", "")).strip().splitlines()[-1:] or [""]
        where = _raised_at(str((data.get("extraInfo") or {}).get("py_callstack", "")))
        text = reason[0] + (f" (at {where})" if where else "")
    elif failure.exitcode < 0:
        text = f"killed by {_signal_name(-failure.exitcode)}"
    elif failure.exitcode - 128 in STOP_SIGNALS:  # the trainer's stop on a signal (its checkpoint written)
        text = f"stopped on {_signal_name(failure.exitcode - 128)}"
    elif failure.exitcode > 128:  # a shell's report of a child killed by that signal (an OOM kill: 137)
        text = f"128 + {_signal_name(failure.exitcode - 128)}: a process it ran was killed by that signal"
    else:
        text = "no error recorded"
    restarts = restarts or launch.Restarts()  # (what the agent did: none, when not told)
    done = f" after {restarts.done} restart{'s' * (restarts.done != 1)}" if restarts.done else ""
    code = f"exit code {failure.exitcode}"
    if restarts.refused_by is not None:  # restart.policy job / elastic would have restarted any other failure
        code += ", not restarted: a restart would end the same way"
    log = outputs.rank_log(log_dir, rank)
    line = f"rank {rank} failed{done} ({code}): {text}; its output: {log}"
    early = launch.exited_early(error.failures, local.world_size)
    if early:
        ranks = ", ".join(str(r) for r in early)
        logs = ", ".join(str(outputs.rank_log(log_dir, r)) for r in early)
        line = (
            f"rank{'s' * (len(early) > 1)} {ranks} exited 0 while the other ranks still ran (output: {logs}), "
            f"and a rank that ends early leaves its peers waiting for it in their next collective; then {line}"
        )
    return line, launch.code_of(failure.exitcode)


def _first_failure(error: Any) -> tuple[int, Any]:
    """The rank that failed first. A rank killed by a signal other than the agent's SIGTERM (SIGKILL, an
    OOM kill, a segfault) is taken as the cause; otherwise the earliest error file (torch's own choice
    compares whole seconds, and the peers of a failed rank raise connection errors within milliseconds),
    and a rank that failed on its own before one the launcher stopped (SIGTERM, or the trainer's 128+signal
    exit after its stop checkpoint), which has no error file either. Results not kept are the lowest such
    rank's (rank 0 writes them; every other rank ends with the line it was told, at the same moment)."""
    failures = dict(error.failures)
    killed = [r for r, f in failures.items() if f.exitcode < 0 and -f.exitcode not in STOP_SIGNALS]
    if killed:
        return min(killed), failures[min(killed)]
    not_kept = [r for r, f in failures.items() if f.exitcode == exit_codes.RESULTS_NOT_KEPT]
    if not_kept:
        return min(not_kept), failures[min(not_kept)]

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


def _metrics_endpoint(env: dict[str, str], output_dir: Path) -> Path | None:
    """Loopback unless ORCH_METRICS_ADDR says otherwise. The port is not probed here: local rank 0 binds the
    job's port (or a free one when it is taken) and then writes the address to the returned file and says it
    on the console (docs/decisions.md, Local runs)."""
    if runtime_env.RuntimeEnv.from_environ(env).metrics_port <= 0:
        return None
    env.setdefault(runtime_env.METRICS_ADDR, LOCAL_METRICS_ADDR)
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:  # the ranks' series files, inside the run
        env["PROMETHEUS_MULTIPROC_DIR"] = str((output_dir / outputs.METRICS_FILES).resolve())
    endpoint_file = (output_dir / outputs.METRICS_ENDPOINT).resolve()
    endpoint_file.unlink(missing_ok=True)  # an earlier run's, in a directory resumed
    env[runtime_env.METRICS_ENDPOINT_FILE] = str(endpoint_file)
    return endpoint_file
