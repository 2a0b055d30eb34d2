"""The container's main process on a cluster: torchrun, ending with an exit code that keeps the failure's class.

    python -m orchestrator.launch --nproc-per-node=4 -m orchestrator.trainer --config /orch/config/train.json

takes torchrun's arguments (and its PET_* environment) unchanged. torchrun itself ends with exit code 1 for
every failure: its `main` is wrapped in `@record`, which re-raises the `ChildFailedError` of a failed worker
and the `SignalException` of its own SIGTERM (torch/distributed/run.py, launcher/api.py), and Python exits 1
on an uncaught exception. So a worker killed by a signal (an OOM kill, a segfault, NCCL's watchdog abort)
and the pod's SIGTERM (eviction, preemption, a node drain) looked like a bug, and `restart.policy:
exit-code` (the v1 operator's ExitCode, the Job's podFailurePolicy: >= 128 is retried, 1-127 fails the job)
could not work. This runs torchrun's own `run(args)` in this process and picks the exit code itself:

- this process got a signal (the kubelet's SIGTERM): 128 + signal, once torch's agent has stopped the
  workers (SIGTERM, then SIGKILL after `--shutdown-timeout` / TORCH_ELASTIC_SHUTDOWN_TIMEOUT);
- otherwise the failed worker's: 128 + signal for a signal death, else its own code (1-127 for a Python
  exception or `sys.exit(N)`; >= 128 where it says so itself, e.g. after a checkpoint on SIGTERM, or 137
  from a shell whose child the OOM killer ended). A worker that had exited 0 while the others still ran is
  named on a line of its own (`exited_early`): it is what the others then failed waiting for.

With ORCH_RETRY_LIMIT set (a PyTorchJob with `restart.policy: exit-code`), it also bounds the retries: the
v1 operator recreates a pod that failed with a retryable code, and its backoffLimit counts only the
restarts of running pods' containers (pkg/core/job.go PastBackoffLimit; kubeflow/trainer#2045), so nothing
else stops a job that keeps dying. Each start is counted in ORCH_OUTPUT_DIR/.orch-starts/ (one file per
pod, named by its hostname; per `orch submit` when ORCH_SUBMISSION holds its id), and a start beyond
ORCH_RETRY_LIMIT retries, summed over the job's pods, exits RETRIES_EXHAUSTED (permanent) without
training. A run that the pod's SIGTERM ended (preemption, eviction) does not make the next start a retry,
so preemption does not spend the budget. The count outlives a pod only where the output dir does: on a
PersistentVolumeClaim.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import exit_codes, hardware, outputs

RETRIES_EXHAUSTED = 3  # 1-127: the operator does not retry it, the job fails
ENV_RETRY_LIMIT = "ORCH_RETRY_LIMIT"
ENV_SUBMISSION = "ORCH_SUBMISSION"  # the pod's orch.dev/submission annotation (downward API); "" without one
SIGNAL_BASE = 128  # a shell's (and the kubelet's) exit code of a process killed by signal N is 128 + N


# Signals torch's agent never sends (it stops the other workers with SIGTERM, then SIGKILL after the
# shutdown timeout): a worker that died by one of these is a cause, never a consequence.
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE})


# torch's agent SIGKILLs a worker only after it ignored the agent's SIGTERM for the shutdown timeout
# (PContext.close's 30 s); failures' timestamps are whole seconds, taken when a rank raised (its error
# file) or when the agent saw the exit (monitor interval 0.1 s by default). A SIGKILL seen within this of
# the first failure is not the agent's: it died in the same poll as the others, so it is a cause (an OOM
# kill), and a rank that raised next to it most likely raised because it lost its peer.
SAME_POLL_S = 2


def exit_code(failures: dict[int, Any]) -> int:
    """The container's exit code for torch's failed workers ({rank: ProcessFailure}; `exitcode` is -N for a
    worker killed by signal N). After the first failure torch's agent stops the other workers and adds
    them too (multiprocessing/api.py `_poll`): so the first entry is the cause, unless another worker
    crashed (a segfault, NCCL's watchdog abort) or was SIGKILLed before the agent stopped anything, which
    then is. torch lists the workers it saw fail in one poll in rank order, not in the order they died:
    a SIGKILLed worker (no error file) and the peer that raised on the lost connection come in one poll."""
    crashed = [f.exitcode for f in failures.values() if f.exitcode < 0 and -f.exitcode in CRASH_SIGNALS]
    killed = [f.exitcode for f in failures.values() if f.exitcode == -signal.SIGKILL and _early(f, failures)]
    cause: int = (crashed or killed or [next((f.exitcode for f in failures.values()), 1)])[0]
    return code_of(cause)


def code_of(exitcode: int) -> int:
    """The exit code that keeps a worker's failure class, from torch's `exitcode` (-N: killed by signal N):
    128 + N for a signal death (retryable), the worker's own code otherwise (1-127 permanent; >= 128
    where it says so itself: 143 after a stop checkpoint, 137 from a shell whose child was SIGKILLed)."""
    if exitcode < 0:
        return SIGNAL_BASE + min(-exitcode, 127)
    return min(exitcode, 255) if exitcode > 0 else 1


def exited_early(failures: dict[int, Any], local_world_size: int) -> list[int]:
    """This launcher's local ranks that had exited 0 while the others ran: once one worker fails, torch's
    agent stops every worker still running and records it among the failures too (multiprocessing/api.py
    `_poll`), so a local rank missing from them had ended with exit code 0 before. A rank that ends early
    (a task's sys.exit(0), a script that returns) leaves its peers waiting for it in their next collective:
    they fail at once on a closed connection (gloo) or at train.collective_timeout (NCCL)."""
    failed = {getattr(f, "local_rank", rank) for rank, f in failures.items()}
    return [rank for rank in range(local_world_size) if rank not in failed]


def _early(failure: Any, failures: dict[int, Any]) -> bool:
    """Whether `failure` was seen in the agent's first poll with failures, not after it stopped the rest."""
    stamps = [
        f.timestamp
        for f in failures.values()
        if isinstance(getattr(f, "timestamp", None), int) and f.timestamp > 0
    ]
    if not isinstance(getattr(failure, "timestamp", None), int) or not stamps:
        return next(iter(failures.values())) is failure  # no times: torch's order
    return bool(failure.timestamp - min(stamps) <= SAME_POLL_S)


@dataclass(frozen=True)
class StartCount:
    """One pod's line in ORCH_OUTPUT_DIR/.orch-starts/<submission>/<pod>: how often it started, and how
    many of those runs ended with the pod's SIGTERM (preemption, eviction, a drain): those are not the
    job's failures, so the restart after them is not a retry."""

    path: Path

    def read(self) -> tuple[int, int]:
        try:
            starts, _, stops = self.path.read_text(encoding="utf-8").partition(" ")
            return int(starts), int(stops or 0)
        except (OSError, ValueError):
            return 0, 0

    def write(self, starts: int, stops: int) -> None:
        partial = self.path.with_name(f".{self.path.name}.tmp")
        partial.write_text(f"{starts} {stops}\n", encoding="utf-8")
        partial.replace(self.path)  # atomic: another pod of the job may be adding the counts up right now

    def retries(self) -> int:
        starts, stops = self.read()
        return max(0, starts - 1 - stops)


def count_start(output_dir: Path, submission: str, pod: str, limit: int) -> tuple[StartCount, str | None]:
    """Record this start of `pod`; with it, the reason not to train when the job's pods (summed) have been
    retried more than `limit` times, else None."""
    starts_dir = output_dir / outputs.STARTS / (submission or "unsubmitted")
    starts_dir.mkdir(parents=True, exist_ok=True)
    mine = StartCount(starts_dir / pod)
    starts, stops = mine.read()
    mine.write(starts + 1, stops)
    pods = [StartCount(path) for path in starts_dir.iterdir() if not path.name.startswith(".")]
    retries = sum(count.retries() for count in pods)
    if retries <= limit:
        return mine, None
    return mine, (
        f"the pods of this job have been started again {retries} times, more than restart.backoff_limit "
        f"({limit}); not starting again (counts in {starts_dir})"
    )


@dataclass
class Restarts:
    """What torch's agent did under `restart_rule`: how often it restarted the workers, and the exit code that
    ended its restarts early (exit_codes.NOT_RESTARTED), if one did."""

    done: int = 0
    refused_by: int | None = None


@contextlib.contextmanager
def restart_rule() -> Iterator[Restarts]:
    """The launch inside runs torch's elastic agent with orch's restart rule (exit_codes.restartable): a
    failure whose exit code says that a restart would end the same way (a refusal, results that could not be
    kept) ends the agent's restarts, which otherwise follow any failure while max_restarts allows
    (agent/server/api.py `_invoke_run`). Both launchers use it: `orch run` (restart.policy job, elastic) and
    a pod's torchrun (PET_MAX_RESTARTS under restart.policy job or elastic:).

    torch's launcher builds its agent itself (launcher/api.py `launch_agent` names LocalElasticAgent), so
    the agent is a subclass of it for the length of the launch, which ends restarts the way torch's own
    does for a worker stuck in uninterruptible sleep (local_elastic_agent.py sets `_remaining_restarts` to
    0). One launch at a time per process: the name is the module's."""
    from torch.distributed.launcher import api as launcher

    restarts = Restarts()
    agent_class = launcher.LocalElasticAgent

    class RuledAgent(agent_class):  # type: ignore[misc, valid-type]  # torch's elastic API is untyped
        def _monitor_workers(self, worker_group: Any) -> Any:
            result = super()._monitor_workers(worker_group)
            if result.is_failed() and self._remaining_restarts > 0:  # type: ignore[has-type]  # restarts next, unless
                codes = [failure.exitcode for failure in result.failures.values()]
                if exit_codes.restartable(codes):
                    restarts.done += 1
                else:
                    restarts.refused_by = next(c for c in codes if c in exit_codes.NOT_RESTARTED)
                    self._remaining_restarts = 0
            return result

    launcher.LocalElasticAgent = RuledAgent  # type: ignore[misc]  # (a class: mypy sees a type assigned)
    try:
        yield restarts
    finally:
        launcher.LocalElasticAgent = agent_class  # type: ignore[misc]


def raise_signal(signum: int, frame: Any) -> None:
    """A signal handler that raises torch's SignalException, as torch's agent's own handler does once it runs
    the workers (this launcher's and `orch run`'s cover the time before that)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    raise SignalException(f"process {os.getpid()} got signal {signum}", sigval=signal.Signals(signum))


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(argv)  # type: ignore[no-untyped-call]  # torch.distributed.run is untyped
    count = None
    if limit := os.environ.get(ENV_RETRY_LIMIT):
        count, refused = count_start(
            Path(os.environ.get(outputs.ENV) or "."),
            os.environ.get(ENV_SUBMISSION, ""),
            socket.gethostname(),
            int(limit),
        )
        if refused:
            print(f"orch: {refused}", file=sys.stderr, flush=True)
            return RETRIES_EXHAUSTED
    set_worker_env(os.environ)
    # Until torch's agent installs its own handlers (when it starts the workers), a SIGTERM during the
    # rendezvous ends this process the same way; as PID 1 it would otherwise be ignored until SIGKILL.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, raise_signal)
    try:
        try:
            with restart_rule():
                torchrun.run(args)  # type: ignore[no-untyped-call]  # as above
        finally:
            # The workers are gone; what is left is this process's lines and exit code. torch's handler (it
            # raises) stays installed, and a second signal here would end PID 1 in a traceback and exit 1.
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(signum, signal.SIG_IGN)
    except ChildFailedError as error:
        record = classify(error.failures, exit_code(error.failures), Path(os.environ.get(outputs.ENV) or "."))
        # What torchrun's @record prints: each failed rank. (torch's elastic errors are untyped.)
        print(error.format_msg(), file=sys.stderr)  # type: ignore[no-untyped-call]
        if str(args.nproc_per_node).isdigit():
            for rank in exited_early(error.failures, int(args.nproc_per_node)):
                print(f"orch: local rank {rank} had exited 0 while the other workers still ran: a rank that "
                      "ends early leaves its peers waiting for it in their next collective", file=sys.stderr)  # fmt: skip
        code = record.exit_code
        print(f"orch: a worker failed; exit code {code} ({record.exit_class})", file=sys.stderr, flush=True)
        for suspect in record.suspects:
            print(f"orch: suspected node: host {suspect.host} (node rank {suspect.node_rank}"
                  f"{', ' + suspect.device if suspect.device else ''}): {suspect.reason}", file=sys.stderr)  # fmt: skip
        hardware.write_record(record)
        return code
    except SignalException as error:
        code = SIGNAL_BASE + int(error.sigval)
        if count is not None and error.sigval == signal.SIGTERM:  # stopped from outside: not a failure
            starts, stops = count.read()
            count.write(starts, stops + 1)
        print(
            f"orch: stopped by {error.sigval.name}; exit code {code} (retryable)", file=sys.stderr, flush=True
        )
        hardware.write_record(hardware.Record(code, hardware.CLASS_RETRYABLE))
        return code
    return 0


def classify(
    failures: dict[int, Any], code: int, output_dir: Path, *, host: str | None = None
) -> hardware.Record:
    """The failure's class, its exit code and the nodes it points at ({rank: ProcessFailure}, `code`: the
    cause's exit code, `host`: this pod's host name). Hardware, exit hardware.EXIT_CODE: a rank failed the
    pre-flight check (its suspects are in OUT/preflight.json), or a rank's error says bad hardware
    (hardware.signature: this pod's node, that rank's GPU). Otherwise retryable (>= 128) or permanent
    (1-127)."""
    if any(f.exitcode == hardware.EXIT_CODE for f in failures.values()):
        verdict = outputs.read_json(output_dir / outputs.PREFLIGHT)
        return hardware.Record(
            hardware.EXIT_CODE, hardware.CLASS_HARDWARE, hardware.preflight_suspects(verdict)
        )
    suspects = []
    for rank, failure in sorted(failures.items()):
        text = str(getattr(failure, "message", "") or "")
        if meaning := hardware.signature(text):
            said = next((line for line in text.strip().splitlines() if line.strip()), "")[:200]
            suspects.append(hardware.Suspect(
                host=host or socket.gethostname(), node_rank=_node_rank(), reason=f"{meaning}: {said}", rank=rank,
                device=f"cuda:{failure.local_rank}",
            ))  # fmt: skip
    if suspects:
        return hardware.Record(hardware.EXIT_CODE, hardware.CLASS_HARDWARE, tuple(suspects))
    return hardware.Record(
        code, hardware.CLASS_RETRYABLE if code >= SIGNAL_BASE else hardware.CLASS_PERMANENT
    )


def _node_rank() -> int:
    """This pod's node rank where the controller says it (a static rendezvous's PET_NODE_RANK), else -1."""
    value = os.environ.get("PET_NODE_RANK", "")
    return int(value) if value.isdigit() else -1


def set_worker_env(environ: MutableMapping[str, str]) -> None:
    """What the ranks inherit from this launcher besides the pod's env: NCCL's flight recorder, dumping
    into the output directory (outputs.nccl_trace_env), where the job's env does not say otherwise."""
    environ.update(outputs.nccl_trace_env(environ.get(outputs.ENV) or ".", environ))


if __name__ == "__main__":
    sys.exit(main())
