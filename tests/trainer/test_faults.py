"""Faults: a rank SIGKILLed mid-run (elastic, restart.policy job), resuming (once, twice), Ctrl-C, the
launcher itself killed. Real processes, real signals."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import goodput, outputs
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


def held(spec: dict, release: Path, *, steps_after: int = 0) -> dict:
    """The job with its input held once the step-10 checkpoint is on disk (and `steps_after` more steps are
    done) until `release` exists (tests/trainer/plugin_tasks.py): a kill after that checkpoint lands before
    the end on any load."""
    train = spec["train"]
    args = {k: v for k, v in train["task_args"].items() if k != "sample_delay"}
    per_step = train["batch_size"] // spec["nodes"] // spec["procs_per_node"]  # samples a rank reads per step
    train.update(task="tests.trainer.plugin_tasks:held_after_checkpoint",
                 task_args={**args, "step": 10, "release": str(release), "samples_after": steps_after * per_step})  # fmt: skip
    return spec


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
            if "orchestrator.trainer" not in (entry / "cmdline").read_text():  # short; the environ is not
                continue
            environ = dict(
                item.split("=", 1) for item in (entry / "environ").read_text().split("\0") if "=" in item
            )
        except OSError:
            continue
        if environ.get("ORCH_OUTPUT_DIR") == str(out.resolve()):
            found[int(environ["RANK"])] = int(entry.name)
    return found


def wait_for(condition, timeout: float = 300, what: str = "condition") -> None:
    """Poll `condition`; the deadline is for a hang only (an FSDP run's start alone took > 100 s at load 13).
    The pause between polls grows from 20 ms to 250 ms: a condition like `worker_pids` reads every process
    of the machine, which polled every 20 ms through a torch start cost seconds of CPU per wait."""
    deadline, pause = time.monotonic() + timeout, 0.02
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(pause)
        pause = min(pause * 1.5, 0.25)


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
    release = tmp_path / "release"
    spec = held(fault_job("killed", parallel=parallel), release)
    process = subprocess.Popen(
        [*ORCH, "run", str(write_job(tmp_path, spec)), "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = out / "checkpoints" / "step-00000010"  # a directory, renamed into place when complete
    wait_for(first.exists, what="the step-10 checkpoint")
    pids = worker_pids(out)  # both held after the checkpoint
    assert set(pids) == {0, 1}
    os.kill(pids[1], signal.SIGKILL)
    release.touch()
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    summary = Run(0, stdout, stderr, out).summary
    assert summary["restarts"] == 1
    assert summary["resumed_from_step"] == 10  # the newest checkpoint when rank 1 died
    assert "resumed from" in stdout
    assert_same_params(reference.state_dict(), Run(0, "", "", out).state_dict())


@pytest.fixture(scope="module")
def restarted(tmp_path_factory) -> tuple[Run, dict[int, int]]:
    """A `restart.policy: job` run whose rank 1 is SIGKILLed at step 13, 3 steps after the step-10 checkpoint,
    and the pids of its first attempt. It resumed once (from 10, redoing 11-13), so its step-20 checkpoint is
    what a resumed run wrote."""
    tmp = tmp_path_factory.mktemp("restarted")
    out, release = tmp / "out", tmp / "release"
    process = start(write_job(tmp, held(restart_job("jobpolicy"), release, steps_after=3)), out)
    wait_for(
        lambda: all((tmp / f"held-{rank}").exists() for rank in (0, 1)), what="both ranks held at step 13"
    )
    first = worker_pids(out)
    assert set(first) == {0, 1}
    # rank 0's goodput journal knows step 13 (its heartbeat thread writes it every few seconds)
    wait_for(lambda: journal_step(out) == 13, what="the journal at step 13")
    os.kill(first[1], signal.SIGKILL)
    release.touch()
    stdout, stderr = process.communicate(timeout=300)
    return Run(process.returncode, stdout, stderr, out), first


def test_restart_policy_job_restarts_every_rank_from_the_last_checkpoint(restarted, reference):
    """#11: one of 2 local ranks SIGKILLed; both restart, resume from the newest checkpoint, and the
    final parameters equal the uninterrupted run's."""
    run, first = restarted
    assert run.returncode == 0, run.stderr
    summary = run.summary
    assert summary["restarts"] == 1
    assert summary["resumed_from_step"] == 10
    assert "restarting all 2 ranks together: restart 1 of 1 (restart.policy job)" in run.stdout
    assert "resumed from" in run.stdout
    assert not alive(first[0])  # the survivor was restarted too, not left running beside the new group
    for rank in (0, 1):  # each rank's log holds both attempts
        log = (run.out / "logs" / f"rank-{rank}.log").read_text()
        assert "attempt 0," in log and "attempt 1," in log
    assert_same_params(reference.state_dict(), run.state_dict())


def journal_step(out: Path) -> int:
    """The step the newest attempt's goodput record says it completed (0 without one)."""
    _, attempts = goodput.read_journal(out / outputs.GOODPUT)
    return max(attempts, key=lambda a: a.started).step if attempts else 0


def test_a_clean_run_accounts_for_its_wall_time_by_cause(reference):
    """#31: goodput > 0, every cause present, the ones this run had measured, the parts adding up to the
    wall time since `orch run` started (its run.json); the result line says it."""
    result = reference.summary["goodput"]
    badput = result["badput_seconds"]
    assert list(badput) == list(goodput.CAUSES)
    assert 0 < result["ratio"] < 1
    for cause in ("program_startup", "training_prep", "unproductive_checkpoint_restore_time", "data_loading_sync",
                  "eval", "unproductive_checkpoint_save_time"):  # fmt: skip
        assert badput[cause] > 0, cause  # looking for a checkpoint to resume is a load; eval: the final one
    for cause in ("queued", "wasted_progress_from_disruption", "infrastructure_recovery_from_disruption"):
        assert badput[cause] == 0, cause
    parts = result["goodput_seconds"] + sum(badput.values())
    assert parts == pytest.approx(result["wall_seconds"], rel=0.03)
    started = outputs.read_run_record(reference.out)["started"]
    assert result["started"] == pytest.approx(started, abs=1.0)  # the job's start is orch run's
    assert (result["attempts"], result["lost_steps"]) == (1, 0)
    assert f"goodput {100 * result['ratio']:.0f}% of" in reference.stdout.splitlines()[-1]


def test_a_restart_reports_the_steps_it_redid_and_the_time_it_took_to_restart(restarted):
    run, _ = restarted
    assert run.returncode == 0, run.stderr
    result = run.summary["goodput"]
    badput = result["badput_seconds"]
    assert (result["attempts"], result["lost_steps"]) == (2, 3)
    assert badput["wasted_progress_from_disruption"] > 0  # steps 11-13, and the hold at 14
    assert badput["infrastructure_recovery_from_disruption"] > 0  # rank 1's death -> the new processes
    assert badput["unproductive_checkpoint_restore_time"] > 0
    parts = result["goodput_seconds"] + sum(badput.values())
    assert parts == pytest.approx(result["wall_seconds"], rel=0.03)
    _, attempts = goodput.read_journal(run.out / outputs.GOODPUT)
    assert [(a.outcome, a.resumed_from) for a in sorted(attempts, key=lambda a: a.started)] == [
        ("failed", None),
        ("finished", 10),
    ]
    assert "1 restart, 3 steps redone" in run.stdout


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
    assert process.returncode == 128 + signal.SIGKILL  # the rank's class, as a pod's launcher says it (#33)
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


def test_resuming_twice_equals_resuming_once_equals_no_resume(tmp_path, reference, restarted):
    """Once: the restarted run (10 -> 30, after its rank 1 was killed). Twice: a new `orch run` from the
    step-20 checkpoint that resumed run wrote (20 -> 30). Both end with the uninterrupted run's parameters."""
    once, _ = restarted
    assert once.returncode == 0, once.stderr
    assert once.summary["resumed_from_step"] == 10
    out = tmp_path / "twice"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(once.out / "checkpoints" / "step-00000020", out / "checkpoints" / "step-00000020")
    twice = orch_run(write_job(tmp_path, fault_job("resume")), out)
    assert twice.returncode == 0, twice.stderr
    assert twice.summary["resumed_from_step"] == 20
    assert_same_params(reference.state_dict(), once.state_dict())
    assert_same_params(once.state_dict(), twice.state_dict())
    assert twice.summary["final_loss"] == pytest.approx(reference.summary["final_loss"], rel=1e-6)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_without_on_stop_stops_every_rank_at_once(tmp_path, sig):
    out = tmp_path / "out"
    spec = job("interrupt", max_steps=100000, task_args={"samples": 256, "sample_delay": 0.002},
               checkpoint={"on_stop": False})  # fmt: skip
    process = start(write_job(tmp_path, spec), out, "--procs", "2")
    wait_for(lambda: len(worker_pids(out)) == 2, what="both ranks")
    pids = worker_pids(out)
    progress = out / "progress.jsonl"
    wait_for(lambda: steps_logged(progress) > 0, what="the first steps")  # in the loop
    process.send_signal(sig)  # SIGINT: what Ctrl-C sends to the launcher
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + sig  # 130 for Ctrl-C, 143 for SIGTERM (#33)
    # One line: no traceback per rank, no launcher messages (they are in logs/launcher.log).
    assert stderr.strip().splitlines() == [
        f"error: interrupted: stopped all 2 processes (their output: {out}/logs/)"
    ]
    assert "Traceback" not in stdout
    assert list((out / "checkpoints").glob("step-*")) == []
    for pid in pids.values():
        assert not alive(pid)


def steps_logged(progress: Path) -> int:
    """The newest step rank 0 logged to progress.jsonl (0 before the first)."""
    if not progress.exists():
        return 0
    steps = [
        json.loads(line).get("step", 0) for line in progress.read_text().splitlines() if '"step"' in line
    ]
    return max(steps, default=0)


def stop_job(name: str, **extra) -> Run:
    """The reference's training (2 ranks, same data and optimizer) with no interval checkpoint in its 30
    steps: whatever checkpoint exists was written by the stop."""
    spec = restart_job(name, sample_delay=0.03, **extra)
    spec["train"]["checkpoint"] = {"every_steps": 1000, "keep": 5}
    return spec


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_stop_signal_mid_interval_checkpoints_and_the_rerun_resumes_at_that_step(tmp_path, reference, sig):
    """#24.2: SIGTERM (preemption) or the first Ctrl-C: every rank finishes its step, a checkpoint of that
    step is written, orch run prints the resume command; running it continues at exactly that step and ends
    with the uninterrupted run's parameters. The logs keep both runs."""
    out = tmp_path / "out"
    spec_file = write_job(tmp_path, stop_job("stopped"))
    process = start(spec_file, out)
    wait_for(lambda: steps_logged(out / "progress.jsonl") >= 5, what="5 steps")
    pids = worker_pids(out)
    process.send_signal(sig)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + sig, stderr  # 130 or 143 (#33)
    (saved,) = sorted((out / "checkpoints").glob("step-*"))
    stopped_at = int(saved.name.removeprefix("step-"))
    assert 5 <= stopped_at < 30
    assert f"stopped by {signal.Signals(sig).name} at step {stopped_at}/30: checkpoint written" in stdout
    assert stderr.strip().splitlines() == [
        f"error: interrupted: all 2 processes stopped at step {stopped_at} after writing a checkpoint "
        f"(their output: {out}/logs/); resume: orch run {spec_file} --out {out}"
    ]
    for pid in pids.values():
        assert not alive(pid)

    resumed = orch_run(spec_file, out)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.summary["resumed_from_step"] == stopped_at
    assert f"resumed from {saved} at step {stopped_at}" in resumed.stdout
    assert_same_params(reference.state_dict(), resumed.state_dict())
    for rank in (0, 1):  # both runs' output, each behind its header
        log = (out / "logs" / f"rank-{rank}.log").read_text()
        assert log.count(f"--- orch run: rank {rank}, attempt 0,") == 2
    rank0 = (out / "logs" / "rank-0.log").read_text()
    assert rank0.index("stopped by") < rank0.rindex("--- orch run:") < rank0.index("resumed from")
    events = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("run") == 2
    assert [e for e in events if e["event"] == "stopped"][0]["step"] == stopped_at


def test_sigterm_to_one_rank_stops_all_at_one_step_and_the_restart_resumes_there(tmp_path, reference):
    """A drained node: only one rank gets SIGTERM. The ranks agree on the step, all write the checkpoint and
    exit 143 (retryable); restart.policy job restarts them and they resume at that step, not from step 0."""
    out = tmp_path / "out"
    process = start(write_job(tmp_path, stop_job("drained")), out)
    wait_for(lambda: steps_logged(out / "progress.jsonl") >= 5, what="5 steps")
    first = worker_pids(out)
    os.kill(first[1], signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    summary = Run(0, stdout, stderr, out).summary
    assert summary["restarts"] == 1
    saved = [int(p.name.removeprefix("step-")) for p in (out / "checkpoints").glob("step-*")]
    assert sorted(saved) == [summary["resumed_from_step"], 30]  # the stop's, then the final one
    assert "stopped by SIGTERM at step" in stdout
    assert_same_params(reference.state_dict(), Run(0, "", "", out).state_dict())


def test_a_second_ctrl_c_stops_at_once(tmp_path):
    """Steps of ~2 s: the first Ctrl-C waits for the step; the second one does not."""
    out = tmp_path / "out"
    spec = job("impatient", max_steps=1000, task_args={"samples": 256, "sample_delay": 0.25})
    process = start(write_job(tmp_path, spec), out, "--procs", "2")
    wait_for(lambda: len(worker_pids(out)) == 2, timeout=180, what="both ranks")
    pids = worker_pids(out)
    wait_for(lambda: (out / "logs" / "rank-0.log").exists() and "training" in (out / "logs" / "rank-0.log").read_text(),
             timeout=180, what="the loop")  # fmt: skip
    process.send_signal(signal.SIGINT)
    # The second Ctrl-C once the first has reached both ranks (torch's agent logs each signal it forwards): sent
    # any earlier, two SIGINTs can arrive as one.
    launcher_log = out / "logs" / "launcher.log"
    wait_for(lambda: launcher_log.read_text().count("closing signal SIGINT") == 2, timeout=60,
             what="the launcher to forward the first Ctrl-C")  # fmt: skip
    process.send_signal(signal.SIGINT)
    started = time.monotonic()
    _, stderr = process.communicate(timeout=60)
    assert time.monotonic() - started < 10
    assert process.returncode == 130
    assert stderr.strip().splitlines() == [
        f"error: interrupted: stopped all 2 processes (their output: {out}/logs/)"
    ]
    wait_for(lambda: not any(alive(pid) for pid in pids.values()), timeout=10, what="the ranks to die")
    assert list((out / "checkpoints").glob("step-*")) == []


def test_orch_run_help_does_not_import_torch():
    code = "import sys, orchestrator.local, orchestrator.commands.run_cmd; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_sigterm_before_the_first_step_checkpoints_it_exits_143_and_later_signals_change_nothing(tmp_path):
    """#33: SIGTERM to `orch run` while both ranks wait for their first sample (set up, stop handlers in place):
    they finish step 1, checkpoint it and stop; orch run exits 143 (128 + SIGTERM; it said 130) with its one
    line. Ctrl-Cs sent while the ranks stop and orch run winds down (a second Ctrl-C 0.5 s after the first
    printed a 40-line SignalException traceback and exited 1) change neither the code nor the line. On disk:
    the complete step-1 checkpoint, and the run's lock free for the rerun."""
    import fcntl

    from orchestrator.trainer import checkpoint

    out, release = tmp_path / "out", tmp_path / "release"
    spec = job("early", procs=2, max_steps=30, task="tests.trainer.plugin_tasks:held_at_start",
               task_args={"release": str(release), "samples": 256}, checkpoint={"every_steps": 1000})  # fmt: skip
    spec_file = write_job(tmp_path, spec)
    process = start(spec_file, out)
    wait_for(lambda: (out / "waiting-0").exists() and (out / "waiting-1").exists(), what="both ranks set up")
    process.send_signal(signal.SIGTERM)
    launcher_log = out / "logs" / "launcher.log"
    wait_for(lambda: launcher_log.read_text().count("closing signal SIGTERM") == 2, timeout=60,
             what="the launcher to forward SIGTERM")  # fmt: skip
    release.touch()
    wait_for(lambda: '"stopped"' in (out / "progress.jsonl").read_text(), what="the stop checkpoint")
    while process.poll() is None:  # from the ranks' last moments to orch run's own exit
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGINT)
        time.sleep(0.02)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr and "SignalException" not in stderr
    assert stderr.strip().splitlines() == [
        f"error: interrupted: all 2 processes stopped at step 1 after writing a checkpoint (their output: "
        f"{out}/logs/); resume: orch run {spec_file} --out {out}"
    ]
    assert "stopped by SIGTERM at step 1/30: checkpoint written" in stdout
    assert [p.name for p in checkpoint.list_checkpoints(out / "checkpoints")] == ["step-00000001"]
    newest, skipped = checkpoint.newest_valid(out / "checkpoints")
    assert newest is not None and newest.name == "step-00000001" and not skipped
    with open(out / "run.lock", "a") as lock:  # released: a rerun may take it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_sigterm_twice_during_a_checkpoint_save_leaves_no_checkpoint_to_load_and_exits_143(tmp_path):
    """#33: the second SIGTERM lands while the stop checkpoint is being written (rank 1 held inside the save,
    rank 0 at its barrier with the `.tmp` folder made): every rank stops at once, orch run exits 143 with one
    line, and what is on disk is the complete checkpoint of step 4 and a `.tmp` that nothing loads (the next
    start removes it); both locks (the run's, the checkpoint directory's) are free."""
    import fcntl

    from orchestrator.trainer import checkpoint
    from orchestrator.trainer.checkpoint import lock as checkpoint_lock

    out, hold, release = tmp_path / "out", tmp_path / "hold", tmp_path / "release"
    spec = job("twice", procs=2, max_steps=1000, task="tests.trainer.plugin_tasks:held_in_save",
               task_args={"hold": str(hold), "release": str(release), "samples": 256, "sample_delay": 0.01},
               checkpoint={"every_steps": 4, "keep": 5})  # fmt: skip
    process = start(write_job(tmp_path, spec), out)
    wait_for(lambda: (out / "checkpoints" / "step-00000004").exists(), what="the step-4 checkpoint")
    hold.touch()  # the next save holds: the stop's, or the interval's if it comes first
    process.send_signal(signal.SIGTERM)
    wait_for(lambda: (out / "saving-1").exists(), what="a save in flight")
    launcher_log = out / "logs" / "launcher.log"
    wait_for(lambda: launcher_log.read_text().count("closing signal SIGTERM") >= 2, timeout=60,
             what="the launcher to forward the first SIGTERM")  # fmt: skip
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert stderr.strip().splitlines() == [
        f"error: interrupted: stopped all 2 processes (their output: {out}/logs/)"
    ]
    saved = out / "checkpoints"
    assert [p.name for p in checkpoint.list_checkpoints(saved)] == ["step-00000004"]
    (partial,) = [p.name for p in saved.iterdir() if p.name.startswith(".")]
    assert re.fullmatch(r"\.step-\d{8}\.tmp", partial)  # the save cut off, under the name nothing loads
    newest, _ = checkpoint.newest_valid(saved)
    assert newest is not None and newest.name == "step-00000004"  # what a resume loads
    for lock_file in (out / "run.lock", checkpoint_lock.lock_path(saved)):
        with open(lock_file, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
