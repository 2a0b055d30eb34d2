"""`orch sweep` for real: each trial an `orch run` of the digits task (one process, 20 steps).

Every trial launches torch twice (the launcher and its rank, ~10 CPU-s a trial on this machine), so the file
runs two sweeps, each once, shared by its tests through module-scoped fixtures: six trials, 2 at once, cut by
a SIGTERM mid-sweep and run again to the end (8 trial launches); and a grid of 3, one at a time, whose last
trial (lr 10) the median pruner stops (3 launches). About 110 CPU-s in all.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest

from tests.fakes.cli import run_orch
from tests.sweep.conftest import DIGITS_JOB, write_sweep
from tests.sweep.plugin_tasks import HELD

ORCH = [sys.executable, "-m", "orchestrator"]
REPO = Path(__file__).resolve().parents[2]
LAUNCH_HEADER = (
    "--- orch run:"  # the first line of every start in a rank's log (orchestrator/local/worker.py)
)

SIX = """\
job: job.yaml
objective: {metric: eval/loss, goal: minimize}
parameters:
  train.optimizer.lr: {type: float, low: 1.0e-3, high: 3.0e-2, log: true}
max_trials: 6
parallel: 2
"""


@dataclass
class Resumed:
    sweep_file: Path
    folder: Path
    first: subprocess.CompletedProcess[str]
    complete_before: set[int]
    """Trials that had completed when the SIGTERM came."""
    second: subprocess.CompletedProcess[str]
    status: dict


HELD_TRIALS = {2, 3}
"""The trials the SIGTERM finds past their step-10 checkpoint, held at step 15 (tests/sweep/plugin_tasks.py):
the two that start once trials 0 and 1 have completed."""


def wait_for(condition, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline, pause = time.monotonic() + timeout, 0.05
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(pause)
        pause = min(pause * 2, 0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> Resumed:
    """Six trials, 2 at once; SIGTERM once trials 0 and 1 have completed and trials 2 and 3 are held mid-way
    (past their step-10 checkpoint, at step 15 of 20, until they are signalled: so on any machine load); then
    `orch sweep` again."""
    root = tmp_path_factory.mktemp("six")
    held = {"task": "tests.sweep.plugin_tasks:digits_held_until_signalled",
            "task_args": {"trials": sorted(HELD_TRIALS), "step": 15}}  # fmt: skip
    job = {**DIGITS_JOB, "train": {**DIGITS_JOB["train"], **held}}
    sweep_file = write_sweep(root, SIX, job=job)
    folder = root / "runs" / "sweep"
    # the trials' processes import the task from tests/
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    log = root / "first.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [*ORCH, "sweep", str(sweep_file)], cwd=root, env=env, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True, text=True,
        )  # fmt: skip
    try:
        wait_for(
            lambda: (
                all((folder / f"trial-{n}" / HELD).exists() for n in HELD_TRIALS)
                or process.poll() is not None
            ),
            600,
            "trials 2 and 3 held mid-way",
        )
        os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    text = log.read_text()
    first = subprocess.CompletedProcess(process.args, process.returncode, text, "")
    complete_before = {int(line.split()[1]) for line in text.splitlines() if " complete: " in line}
    second = subprocess.run(
        [*ORCH, "sweep", str(sweep_file)], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    status = run_orch("sweep", "status", str(sweep_file), "-o", "json", cwd=root)
    assert status.returncode == 0, status.stderr
    return Resumed(sweep_file, folder, first, complete_before, second, json.loads(status.stdout))


def test_sigterm_mid_sweep_then_a_rerun_finishes_with_exactly_max_trials(resumed):
    assert resumed.first.returncode == 128 + signal.SIGTERM, resumed.first.stdout
    assert (
        "error: interrupted by SIGTERM: stopped 2 running trials (with their checkpoints)"
        in resumed.first.stdout
    )
    assert resumed.complete_before == {0, 1}, resumed.first.stdout
    assert resumed.second.returncode == 0, resumed.second.stdout + resumed.second.stderr
    counted = [trial for trial in resumed.status["trials"] if not trial["rerun"]]
    assert len(counted) == 6 and {t["state"] for t in counted} == {"complete"}
    assert len(resumed.status["trials"]) == 6  # none asked again
    # a trial complete before the SIGTERM never ran again: its rank started once
    for number in resumed.complete_before:
        log = (resumed.folder / f"trial-{number}" / "logs" / "rank-0.log").read_text()
        assert log.count(LAUNCH_HEADER) == 1, number
        assert f"trial {number} " not in resumed.second.stdout
    # those stopped past a checkpoint were resumed from it by the rerun, under their own numbers
    lines = resumed.second.stdout.splitlines()
    resumed_trials = {int(line.split()[1]) for line in lines if "resumed from its checkpoint" in line}
    assert resumed_trials == HELD_TRIALS, resumed.second.stdout
    for number in resumed_trials:
        console = (resumed.folder / f"trial-{number}" / "console.log").read_text()
        assert "stopped by SIGTERM at step 16/20" in console and "resumed from" in console
        assert f"trial {number} complete: " in resumed.second.stdout
        log = (resumed.folder / f"trial-{number}" / "logs" / "rank-0.log").read_text()
        assert log.count(LAUNCH_HEADER) == 2, number


def test_the_best_row_is_the_best_value_and_every_run_dir_holds_its_result(resumed):
    trials = resumed.status["trials"]
    values = [t["value"] for t in trials if t["state"] == "complete"]
    assert trials[0]["value"] == min(values) and resumed.status["best"] == trials[0]["number"]
    for trial in trials:
        if trial["state"] != "complete":
            continue
        run_dir = Path(trial["run_dir"])
        summary = json.loads((run_dir / "summary.json").read_text())
        objective = json.loads((run_dir / "objective.json").read_text())
        assert summary["steps"] == 20 and summary["eval"]["loss"] == pytest.approx(trial["value"])
        assert objective["final"] == pytest.approx(trial["value"]) and objective["values"][-1][0] == 20
        assert [step for step, _ in objective["values"]] == [5, 10, 15, 20]  # once each, resumed or not


def test_status_prints_the_trials_best_first_and_draws_them(resumed):
    result = run_orch("sweep", "status", str(resumed.sweep_file), cwd=resumed.sweep_file.parent)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["TRIAL", "STATE", "EVAL/LOSS", "LR", "RUN", "DIR"]
    assert lines[1].split()[0] == str(resumed.status["best"])
    assert "6 of 6 trials" in result.stdout
    plot = Path(resumed.status["plot"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- pruning -------------------------------------------------------------------------------------------------

HOPELESS = 10.0


def grid_order(values: list[float]) -> list[float]:
    """The order Optuna's GridSampler asks a one-parameter grid in (it shuffles, with a fixed seed)."""
    study = optuna.create_study(sampler=optuna.samplers.GridSampler({"lr": values}))
    return [study.ask().suggest_categorical("lr", values) for _ in values]


@pytest.fixture(scope="module")
def pruned(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], dict, str]:
    """A grid of three learning rates, one at a time, median pruning after one finished trial: the first
    learns slowly, the second faster (never pruned: below the median), the last (lr 10) cannot learn. The job
    records to MLflow (a `file:` store: the same client calls as a server's, without starting one)."""
    wanted = [3.0e-4, 3.0e-3, HOPELESS]  # the order they should run in
    order = grid_order([0.0, 1.0, 2.0])
    values = [0.0] * 3
    for position, index in enumerate(order):
        values[int(index)] = wanted[position]
    assert grid_order(values) == wanted
    root = tmp_path_factory.mktemp("pruned")
    mlruns = f"file:{root / 'mlruns'}"
    job = {**DIGITS_JOB, "tracking": {"mlflow": {"tracking_uri": mlruns, "experiment": "lr"}}}
    sweep_file = write_sweep(
        root,
        "job: job.yaml\n"
        "objective: {metric: eval/loss, goal: minimize}\n"
        f"parameters:\n  train.optimizer.lr: {{type: categorical, values: {json.dumps(values)}}}\n"
        "algorithm: grid\nparallel: 1\nearly_stopping: {name: median, min_trials: 1}\n",
        job=job,
    )
    result = subprocess.run(
        [*ORCH, "sweep", str(sweep_file)], cwd=root, capture_output=True, text=True, timeout=600
    )
    status = run_orch("sweep", "status", str(sweep_file), "-o", "json", cwd=root)
    return result, json.loads(status.stdout), mlruns


def test_median_pruning_stops_the_hopeless_trial_with_its_checkpoint(pruned):
    result, status, _ = pruned
    assert result.returncode == 0, result.stdout + result.stderr
    by_lr = {trial["params"]["train.optimizer.lr"]: trial for trial in status["trials"]}
    hopeless = by_lr[HOPELESS]
    assert hopeless["state"] == "pruned" and hopeless["step"] < 20, status
    assert by_lr[3.0e-4]["state"] == by_lr[3.0e-3]["state"] == "complete"
    assert re.search(rf"trial {hopeless['number']} pruned at step \d+: eval/loss", result.stdout)
    run_dir = Path(hopeless["run_dir"])
    summary = json.loads((run_dir / "summary.json").read_text())  # its orch run exited 0, as a finished run
    assert summary["pruned"] is True and summary["steps"] < 20
    assert any((run_dir / "checkpoints").glob(f"step-{summary['steps']:08d}"))  # kept, to resume or inspect
    assert not (run_dir / "model.pt").exists()
    assert f"pruned by orch sweep at step {summary['steps']}/20" in (run_dir / "console.log").read_text()


def test_mlflow_has_a_parent_run_for_the_sweep_and_a_child_per_trial(pruned, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads file stores only when told
    from mlflow.tracking import MlflowClient

    _, status, mlruns = pruned
    client = MlflowClient(tracking_uri=mlruns)
    experiment = client.get_experiment_by_name("lr")
    runs = client.search_runs([experiment.experiment_id])
    parents = [run for run in runs if run.data.tags.get("orch.sweep") == "sweep"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.params["sweep.algorithm"] == "grid"
    children = {
        run.info.run_name: run
        for run in runs
        if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    assert sorted(children) == [f"digits-sweep-trial-{n}" for n in range(3)]
    best = min(t["value"] for t in status["trials"] if t["state"] == "complete")
    assert parent.data.metrics["best/eval/loss"] == pytest.approx(best)
    for trial in status["trials"]:  # each child holds its trial's own evaluations
        child = children[f"digits-sweep-trial-{trial['number']}"]
        history = client.get_metric_history(child.info.run_id, "eval/loss")
        assert history[-1].value == pytest.approx(trial["value"])
