"""Tasks for tests/spec/test_exit_codes.py, loaded by the trainer as `tests.spec.exit_code_tasks:NAME`."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from orchestrator.trainer.tasks import Task, synthetic


def dies_by_signal(rank: int, signal_name: str) -> Task:
    """Rank `rank` kills itself with `signal_name` (a segfault, an OOM kill, NCCL's abort look like this)."""
    if int(os.environ["RANK"]) == rank:
        os.kill(os.getpid(), signal.Signals[signal_name])
    return synthetic.make(samples=256)


def raises(rank: int) -> Task:
    """Rank `rank` raises: a program error."""
    if int(os.environ["RANK"]) == rank:
        raise ValueError(f"deliberate error on rank {rank}")
    return synthetic.make(samples=256)


def slow(**synthetic_args) -> Task:
    """The synthetic task, slowed down; each rank writes ORCH_OUTPUT_DIR/started-RANK once it is built."""
    Path(os.environ["ORCH_OUTPUT_DIR"]).mkdir(parents=True, exist_ok=True)
    Path(os.environ["ORCH_OUTPUT_DIR"], f"started-{os.environ['RANK']}").write_text(str(os.getpid()))
    return synthetic.make(**synthetic_args)


def exits_0_on_rank(rank: int, at_step: int = 3, **synthetic_args) -> Task:
    """Rank `rank`'s loss function calls sys.exit(0) at its `at_step`-th call: one rank ends early and quietly
    (a task's or script's bug) while its peers go on to their next collective."""
    from tests.trainer import plugin_tasks

    if int(os.environ["RANK"]) != rank:
        return synthetic.make(**synthetic_args)
    return plugin_tasks.exits_early(at_step, **synthetic_args)


def refuses(rank: int) -> Task:
    """Rank `rank` refuses its input, as a resume on changed data does (`DataError`: one line, exit 2); each
    start of the rank appends a line to ORCH_OUTPUT_DIR/starts-RANK."""
    from orchestrator.trainer.data import DataError

    if int(os.environ["RANK"]) == rank:
        Path(os.environ["ORCH_OUTPUT_DIR"]).mkdir(parents=True, exist_ok=True)
        with open(Path(os.environ["ORCH_OUTPUT_DIR"], f"starts-{rank}"), "a") as starts:
            starts.write("started\n")
        raise DataError(f"deliberate refusal on rank {rank}")
    return synthetic.make(samples=256)
