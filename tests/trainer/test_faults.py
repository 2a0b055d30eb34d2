"""Faults: a rank SIGKILLed mid-run (elastic, restart.policy job), resuming (once, twice), Ctrl-C, the
launcher itself killed. Real processes, real signals."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.trainer.conftest import ORCH, REPO, Run, assert_same_params, job, orch_run, write_job

pytestmark = pytest.mark.slow

# 2 "nodes" x 1 process: the spec allows elastic restarts only for multi-node jobs; locally both are ours.
ELASTIC = {"min_nodes": 1, "max_nodes": 2, "max_restarts": 1}


def fault_job(name: str, *, sample_delay: float = 0.0, parallel: str = "ddp") -> dict:
    """30 steps, a checkpoint every 10 (all kept). The delay slows the input only: same mathematics."""
    return job(
        name,
        parallel=parallel,
        nodes=2,
        elastic=ELASTIC,
        max_steps=30,
        log_every=5,
        checkpoint={"every_steps": 10, "keep": 5},
        task_args={"samples": 256, "eval_samples": 64, "sample_delay": sample_delay},
        optimizer={"name": "adamw", "lr": 0.01},  # optimizer state must survive the restart too
    )


def restart_job(name: str, *, max_restarts: int = 1, sample_delay: float = 0.004) -> dict:
    """The same training on one node of 2 processes under `restart.policy: job` (same world size, same data)."""
    spec = fault_job(name, sample_delay=sample_delay)
    del spec["elastic"]
    spec.update(nodes=1, procs_per_node=2, restart={"policy": "job", "max_restarts": max_restarts})
    return spec


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet has stopped: it cannot train or write)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def start(spec_file: Path, out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*ORCH, "run", str(spec_file), "--out", str(out), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def worker_pids(out: Path) -> dict[int, int]:
    """RANK -> pid of the trainer processes writing to `out` (read from /proc: they are our children)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = dict(
                item.split("=", 1) for item in (entry / "environ").read_text().split("\0") if "=" in item
            )
            cmdline = (entry / "cmdline").read_text()
        except OSError:
            continue
        if environ.get("ORCH_OUTPUT_DIR") == str(out.resolve()) and "orchestrator.trainer" in cmdline:
            found[int(environ["RANK"])] = int(entry.name)
    return found


def wait_for(condition, timeout: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """references(parallel) -> an uninterrupted run: the result every faulty run must reproduce."""
    runs: dict[str, Run] = {}

    def reference_for(parallel: str) -> Run:
        if parallel not in runs:
            tmp = tmp_path_factory.mktemp(f"reference-{parallel}")
            run = orch_run(write_job(tmp, fault_job("reference", parallel=parallel)), tmp / "out")
            assert run.returncode == 0, run.stderr
            runs[parallel] = run
        return runs[parallel]

    return reference_for


@pytest.fixture(scope="module")
def reference(references) -> Run:
    return references("ddp")


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_sigkill_of_a_rank_restarts_from_the_last_checkpoint(tmp_path, references, parallel):
    reference = references(parallel)
    out = tmp_path / "out"
    spec = fault_job("killed", sample_delay=0.004, parallel=parallel)
    process = subprocess.Popen(
        [*ORCH, "run", str(write_job(tmp_path, spec)), "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = out / "checkpoints" / "step-00000010"  # a directory, renamed into place when complete
    wait_for(first.exists, what="the step-10 checkpoint")
    pids = worker_pids(out)
    assert set(pids) == {0, 1}
    os.kill(pids[1], signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=180)
    assert process.returncode == 0, stderr
    summary = Run(0, stdout, stderr, out).summary
    assert summary["restarts"] == 1
    assert summary["resumed_from_step"] in (10, 20)  # the newest checkpoint when rank 1 died
    assert "resumed from" in stdout
    assert_same_params(reference.state_dict(), Run(0, "", "", out).state_dict())


def test_restart_policy_job_restarts_every_rank_from_the_last_checkpoint(tmp_path, reference):
    """#11: one of 2 local ranks SIGKILLed; both restart, resume from the newest checkpoint, and the
    final parameters equal the uninterrupted run's."""
    out = tmp_path / "out"
    process = start(write_job(tmp_path, restart_job("jobpolicy")), out)
    wait_for((out / "checkpoints" / "step-00000010").exists, what="the step-10 checkpoint")
    first = worker_pids(out)
    assert set(first) == {0, 1}
    os.kill(first[1], signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    summary = Run(0, stdout, stderr, out).summary
    assert summary["restarts"] == 1
    assert summary["resumed_from_step"] in (10, 20)
    assert "restarting all 2 ranks together: restart 1 of 1 (restart.policy job)" in stdout
    assert "resumed from" in stdout
    assert not alive(first[0])  # the survivor was restarted too, not left running beside the new group
    for rank in (0, 1):  # each rank's log holds both attempts
        log = (out / "logs" / f"rank-{rank}.log").read_text()
        assert "attempt 0," in log and "attempt 1," in log
    assert_same_params(reference.state_dict(), Run(0, "", "", out).state_dict())


def test_restart_policy_job_gives_up_after_max_restarts(tmp_path):
    out = tmp_path / "out"
    spec = restart_job("giveup", max_restarts=1, sample_delay=0.02)
    spec["train"]["max_steps"] = 100000
    process = start(write_job(tmp_path, spec), out)
    for attempt in range(2):
        wait_for(lambda: len(worker_pids(out)) == 2, what=f"both ranks of attempt {attempt}")
        pids = worker_pids(out)
        os.kill(pids[1], signal.SIGKILL)
        wait_for(lambda pid=pids[1]: not alive(pid), what="rank 1 gone")
        wait_for(
            lambda old=pids: set(worker_pids(out).values()).isdisjoint(old.values()), what="old group gone"
        )
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1
    assert stderr.strip().splitlines() == [
        f"error: rank 1 failed after 1 restart (exit code -9): killed by SIGKILL; its output: {out}/logs/rank-1.log"
    ]


def test_killing_the_launcher_kills_its_workers(tmp_path):
    """#12: `kill -9` of orch run runs no cleanup; the workers must not go on training and checkpointing."""
    out = tmp_path / "out"
    spec = job("orphans", max_steps=100000, checkpoint={"every_steps": 5, "keep": 2},
               task_args={"samples": 256, "sample_delay": 0.01})  # fmt: skip
    process = start(write_job(tmp_path, spec), out, "--procs", "2")
    wait_for(lambda: len(worker_pids(out)) == 2, what="both ranks")
    pids = worker_pids(out)
    process.kill()  # SIGKILL: no handler runs in the launcher
    process.communicate(timeout=60)
    try:
        wait_for(lambda: not any(alive(pid) for pid in pids.values()), timeout=60, what="the workers to die")
    finally:  # when this fails, do not leave the orphans training on the shared machine
        for pid in pids.values():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_resuming_twice_equals_resuming_once_equals_no_resume(tmp_path, reference):
    spec_file = write_job(tmp_path, fault_job("resume"))

    def run_from(checkpoint_file: Path, name: str) -> Run:
        out = tmp_path / name
        (out / "checkpoints").mkdir(parents=True)
        shutil.copytree(checkpoint_file, out / "checkpoints" / checkpoint_file.name)
        run = orch_run(spec_file, out)
        assert run.returncode == 0, run.stderr
        return run

    once = run_from(reference.out / "checkpoints" / "step-00000010", "once")  # 10 -> 30
    assert once.summary["resumed_from_step"] == 10
    # Resume again from a checkpoint that a resumed run wrote: 10 -> 20 (run "once"), then 20 -> 30.
    twice = run_from(once.out / "checkpoints" / "step-00000020", "twice")
    assert twice.summary["resumed_from_step"] == 20
    assert_same_params(reference.state_dict(), once.state_dict())
    assert_same_params(once.state_dict(), twice.state_dict())
    assert twice.summary["final_loss"] == pytest.approx(reference.summary["final_loss"], rel=1e-6)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_every_rank(tmp_path, sig):
    out = tmp_path / "out"
    spec = job("interrupt", max_steps=100000, task_args={"samples": 256, "sample_delay": 0.002})
    process = subprocess.Popen(
        [*ORCH, "run", str(write_job(tmp_path, spec)), "--out", str(out), "--procs", "2"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: len(worker_pids(out)) == 2, what="both ranks")
    pids = worker_pids(out)
    progress = out / "progress.jsonl"
    wait_for(lambda: progress.exists() and progress.stat().st_size > 0, what="the first steps")  # in the loop
    process.send_signal(sig)  # SIGINT: what Ctrl-C sends to the launcher
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    # One line: no traceback per rank, no launcher messages (they are in logs/launcher.log).
    assert stderr.strip().splitlines() == [
        f"error: interrupted: stopped all 2 processes (their output: {out}/logs/)"
    ]
    assert "Traceback" not in stdout
    for pid in pids.values():
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_orch_run_help_does_not_import_torch():
    code = "import sys, orchestrator.local, orchestrator.commands.run_cmd; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr
