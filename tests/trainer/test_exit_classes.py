"""#33: what `orch run` and a pod's launcher make of torch's failed workers, in process: the exit code keeps
the class of the rank named as the cause (an exception 1, a signal death 128 + N, a shell's 137 its own), and
a rank that had exited 0 while the others ran is named first. The ProcessFailure stand-ins carry the fields
torch's (torch/distributed/elastic/multiprocessing/errors ProcessFailure) has; that torch leaves a rank that
exited 0 out of the failures is checked by a real run (test_faults.py, test_exit_codes.py)."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator import launch
from orchestrator.local import processes


@dataclass
class Failure:
    local_rank: int
    exitcode: int
    timestamp: int = 0
    error_file: str = "/nonexistent"
    error_file_data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Failed:
    failures: dict[int, Failure]

    def get_first_failure(self) -> tuple[int, Failure]:
        return next(iter(self.failures.items()))


def raised(rank: int, message: str) -> Failure:
    return Failure(
        rank, 1, error_file_data={"message": {"message": message, "extraInfo": {"py_callstack": ""}}}
    )


LOCAL = SimpleNamespace(world_size=2, max_restarts=0)


@pytest.mark.parametrize(
    ("failure", "code", "said"),
    [
        (raised(1, "ValueError: bad"), 1, "ValueError: bad"),
        (Failure(1, -signal.SIGKILL), 137, "killed by SIGKILL"),
        (Failure(1, -signal.SIGSEGV), 139, "killed by SIGSEGV"),
        (Failure(1, 137), 137, "128 + SIGKILL: a process it ran was killed by that signal"),
        (Failure(1, 143), 143, "stopped on SIGTERM"),
        (Failure(1, 3), 3, "no error recorded"),
    ],
    ids=["exception", "sigkill", "segfault", "exit-137", "stopped", "exit-3"],
)
def test_orch_run_exits_with_the_class_of_the_failing_rank(tmp_path, failure, code, said):
    """Before #33 `orch run` exited 1 for every failure, and called a shell's 137 'stopped on SIGKILL'."""
    stopped = Failure(0, -signal.SIGTERM)  # what the launcher stopped after the failure
    line, exit_code = processes._failure_message(Failed({1: failure, 0: stopped}), LOCAL, tmp_path)
    assert exit_code == code == launch.code_of(failure.exitcode)
    assert line == f"rank 1 failed (exit code {failure.exitcode}): {said}; its output: {tmp_path}/rank-1.log"


def test_a_rank_that_exited_0_early_is_named_before_the_failure_it_caused(tmp_path):
    failures = {0: raised(0, "RuntimeError: Connection reset by peer")}
    line, code = processes._failure_message(Failed(failures), LOCAL, tmp_path)
    assert code == 1
    assert line == (
        f"rank 1 exited 0 while the other ranks still ran (output: {tmp_path}/rank-1.log), and a rank that ends "
        "early leaves its peers waiting for it in their next collective; then rank 0 failed (exit code 1): "
        f"RuntimeError: Connection reset by peer; its output: {tmp_path}/rank-0.log"
    )


def test_the_pods_launcher_finds_the_local_ranks_missing_from_the_failures():
    # global ranks 4..7 on this pod's 4 workers: local rank 2 is not among the failures
    failures = {4: Failure(0, 1), 5: Failure(1, -15), 7: Failure(3, -15)}
    assert launch.exited_early(failures, 4) == [2]
    assert launch.exited_early({**failures, 6: Failure(2, -15)}, 4) == []
    assert launch.exit_code(failures) == 1
