"""#31: a rank that stops is named, with its step and phase, before the collective timeout fails the run; every
live rank's stack goes into its log, and `orch stacks` prints them while the run still lives. One launch."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time

import pytest

from tests.fakes.cli import run_orch
from tests.trainer.conftest import ORCH, REPO, job, write_job
from tests.trainer.test_faults import wait_for

pytestmark = pytest.mark.slow

TIMEOUT = 20  # train.collective_timeout here: a verdict after 10 s, the collective's failure at 20


def test_a_stopped_rank_is_named_with_its_step_and_phase_and_every_live_rank_logs_its_stack(tmp_path):
    spec = job(
        "hang", procs=2, max_steps=1000, log_every=1, collective_timeout=f"{TIMEOUT}s",
        checkpoint={"every_steps": 0, "on_stop": False},  # the launcher's SIGTERM ends the sleeper at once
        task="tests.trainer.plugin_tasks:stops_at_step",
        task_args={"rank": 1, "step": 5, "accumulation": 2, "samples": 256, "eval_samples": 0},
    )  # fmt: skip
    out = tmp_path / "out"
    index = {"XDG_RUNTIME_DIR": str(tmp_path)}  # the live-run index `orch stacks --local` reads
    process = subprocess.Popen(
        [*ORCH, "run", str(write_job(tmp_path, spec)), "--out", str(out)], cwd=REPO, env={**os.environ, **index},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for((out / "stopped-1").exists, what="rank 1 to stop at step 5")
        stopped = float((out / "stopped-1").read_text())
        # the run is slow, not dead: orch stacks shows where each rank is (faulthandler: py-spy is not here)
        shown = run_orch("stacks", "hang", "--local", env=index)
        assert shown.returncode == 0, shown.stderr
        blocks = shown.stdout.split("--- rank ")[1:]
        assert [b.split(" ", 1)[0] for b in blocks] == ["0", "1"]
        assert all("faulthandler) ---" in b.splitlines()[0] for b in blocks)
        assert " in stopping" in blocks[1] and "plugin_tasks.py" in blocks[1]  # rank 1: the task's sleep
        assert " in train_step" in blocks[0]  # rank 0: inside the step, waiting for rank 1
        stdout, stderr = process.communicate(timeout=TIMEOUT + 240)
        ended = time.time()
    finally:
        if process.poll() is None:
            process.kill()
            with contextlib.suppress(Exception):
                process.communicate(timeout=60)
    assert process.returncode == 1
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("error: hang: rank 1 stopped at step 5 in forward "), line
    assert "rank 0 waits at step 5 in backward" in line  # in the gradient reduction rank 1 never joins
    assert "rank 0 failed (exit code 1)" in line  # then the collective timed out, as before
    # It failed at the collective timeout (plus the machine's load), not later: no wait beyond it.
    assert ended - stopped < TIMEOUT + 60
    verdict = json.loads((out / "hang.json").read_text())
    assert [(s["rank"], s["step"], s["phase"]) for s in verdict["stopped"]] == [(1, 5, "forward")]
    assert (
        "orch: hang: rank 1 stopped at step 5 in forward" in stdout
    )  # the noticing rank said it on the console
    for rank, frame in ((0, " in train_step"), (1, " in stopping")):  # every live rank's stack, in its log
        log = (out / "logs" / f"rank-{rank}.log").read_text()
        assert f"rank {rank} is at step 5 in" in log and "(most recent call first)" in log, log[-3000:]
        assert frame in log.split(f"rank {rank} is at step 5 in", 1)[1]
