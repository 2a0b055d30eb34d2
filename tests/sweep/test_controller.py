"""The sweep's bookkeeping, in process: asking, counting, `parallel`, max_failed, pruning, taking over what a
dead process left RUNNING, and two processes on one sweep. Trials run through a scripted TrialRunner (the
real one, `orch run` per trial, is tests/sweep/test_local_sweep.py's): each trial reports its objective at
steps 1..3, one step per poll, and ends with the value at step 3. The study and the locks are real (Optuna's
journal file, flock)."""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass, field

import optuna
import pytest

from orchestrator.errors import SpecError, UsageError
from orchestrator.sweep import controller, owners, spec
from orchestrator.sweep import study as studies
from orchestrator.sweep.trials import Outcome, TrialPlan
from tests.sweep.conftest import write_sweep

SWEEP = """\
job: job.yaml
objective: {metric: eval/loss, goal: minimize}
parameters:
  train.optimizer.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
max_trials: MAX
parallel: PARALLEL
max_failed: 2
"""


def load(tmp_path, *, max_trials=6, parallel=2, extra="") -> spec.Sweep:
    text = SWEEP.replace("MAX", str(max_trials)).replace("PARALLEL", str(parallel)) + extra
    return spec.load_sweep(write_sweep(tmp_path, text))


def loss(params: dict) -> float:
    return abs(params["train.optimizer.lr"] - 0.01)


@dataclass
class Scripted:
    """A trial that reports `value(step)` at steps 1..3, one per poll, then ends as `end` says."""

    plan: TrialPlan
    runner: Runner
    end: str = "complete"
    step: int = 0
    pruned: bool = False
    interrupted: bool = False

    def value(self, step: int) -> float:
        return loss(self.plan.params) * (4 - step) * (1000 if self.runner.hopeless(self.plan) else 1)

    def values(self) -> list[tuple[int, float]]:
        return [(s, self.value(s)) for s in range(1, self.step + 1)]

    def prune(self) -> None:
        self.pruned = True

    def interrupt(self, signum: int) -> None:
        self.interrupted = True

    def kill(self) -> None:
        self.interrupted = True

    def poll(self) -> Outcome | None:
        if self.interrupted:
            return self.runner.ended(self, Outcome("interrupted", exit_class="interrupted"))
        if self.pruned:
            return self.runner.ended(self, Outcome("pruned"))
        if self.step < 3:
            self.step += 1
            self.runner.on_step(self)
            return None
        if self.end == "fail":
            return self.runner.ended(self, Outcome("failed", exit_class="failed", error="rank 0 failed"))
        if self.end == "no objective":
            return self.runner.ended(
                self, Outcome("failed", exit_class="no objective", recorded=["eval/accuracy"])
            )
        return self.runner.ended(self, Outcome("complete", value=self.value(3)))


@dataclass
class Runner:
    """Counts what runs at once, over every controller that shares it."""

    end: str = "complete"
    taken_over: dict[int, object] = field(default_factory=dict)
    started: list[int] = field(default_factory=list)
    at_once: int = 0
    most_at_once: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    hopeless_lr: float | None = None
    interrupt_after: int | None = None
    where: str = "local"
    place: dict[str, str] = field(default_factory=dict)

    def prepare(self) -> None:
        pass

    def run_name(self, number: int) -> str:
        return f"trial-{number}"

    def describe(self, plan: TrialPlan) -> str:
        return f"{plan.run}/"

    def hopeless(self, plan: TrialPlan) -> bool:
        return plan.params["train.optimizer.lr"] == self.hopeless_lr

    def start(self, plan: TrialPlan) -> Scripted:
        with self.lock:
            self.started.append(plan.number)
            self.at_once += 1
            self.most_at_once = max(self.most_at_once, self.at_once)
        return Scripted(plan, self, end=self.end)

    def reconcile(self, plan: TrialPlan):  # type: ignore[no-untyped-def]
        what = self.taken_over.get(plan.number, Outcome("interrupted", exit_class="interrupted"))
        if what == "resume":
            return self.start(plan)
        return what

    def on_step(self, trial: Scripted) -> None:
        if self.interrupt_after is not None and len(self.started) >= self.interrupt_after and trial.step == 2:
            self.interrupt_after = None  # once: a second signal would kill the trials
            os.kill(os.getpid(), signal.SIGTERM)  # the controller runs on the main thread: its handler

    def ended(self, trial: Scripted, outcome: Outcome) -> Outcome:
        with self.lock:
            self.at_once -= 1
        return outcome


def run(sweep: spec.Sweep, runner: Runner, lines: list[str] | None = None) -> controller.SweepResult:
    return controller.run(sweep, runner, notice=(lines if lines is not None else []).append, poll_seconds=0)


def test_max_trials_parallel_at_once_best_first(tmp_path):
    sweep, runner, lines = load(tmp_path), Runner(), []
    result = run(sweep, runner, lines)
    assert [row.state for row in result.rows] == ["complete"] * 6
    assert sorted(runner.started) == list(range(6)) and runner.most_at_once == 2
    values = [row.value for row in result.rows]
    assert values == sorted(values) and result.best is result.rows[0]
    assert result.best.value == pytest.approx(loss(result.best.params) * 1)
    assert any(f"trial {result.best.number} complete: eval/loss" in line for line in lines)
    assert all(row.run == f"trial-{row.number}" for row in result.rows)
    # run again: nothing to do, nothing started
    again = Runner()
    assert len(run(sweep, again).rows) == 6 and again.started == []


def test_failures_stop_the_sweep_at_max_failed(tmp_path):
    sweep, runner = load(tmp_path, parallel=1), Runner(end="fail")
    with pytest.raises(controller.SweepFailed, match=r"2 trials failed \(max_failed 2\)"):
        run(sweep, runner)
    assert runner.started == [0, 1]  # none started after the second failure
    rows = studies.rows(studies.open_study(sweep), maximize=False)
    assert [(row.state, row.exit_class, row.error) for row in rows] == [
        ("failed", "failed", "rank 0 failed")
    ] * 2


def test_a_metric_no_trial_records_stops_the_sweep_as_a_spec_error(tmp_path):
    sweep = load(tmp_path, parallel=1)
    with pytest.raises(SpecError) as error:
        run(sweep, Runner(end="no objective"))
    assert error.value.exit_code == 2
    assert str(error.value).endswith(
        "sweep.yaml:2:13: objective.metric: trial 0 recorded eval/accuracy, not eval/loss"
    )


def test_median_prunes_the_hopeless_trial(tmp_path):
    sweep = load(tmp_path, max_trials=3, parallel=1, extra="early_stopping: {name: median, min_trials: 1}\n")
    runner = Runner()
    study = studies.open_study(sweep)
    for lr in (0.03, 0.02, 0.1):  # each better than the median before it, but the third: hopeless
        study.enqueue_trial({"train.optimizer.lr": lr})
    runner.hopeless_lr = 0.1
    result = run(sweep, runner)
    by_lr = {row.params["train.optimizer.lr"]: row for row in result.rows}
    assert by_lr[0.1].state == "pruned" and by_lr[0.1].step == 1  # judged at its first report
    assert by_lr[0.02].state == by_lr[0.03].state == "complete"


def test_trials_a_dead_process_left_running_are_taken_over(tmp_path):
    """Trial 0 had a checkpoint (resumed, same number), trial 1 finished while no sweep watched (recorded,
    not run again), trial 2 was cut off before its first checkpoint (failed as interrupted, its parameters
    asked again as a new trial, not counted)."""
    sweep = load(tmp_path, max_trials=4, parallel=3)
    study = studies.open_study(sweep)
    dead = f"{owners.Owner(sweep.folder).host}-999999-dead"  # this host, no lock file: gone
    asked = []
    for _ in range(3):
        trial = study.ask(studies.distributions(sweep))
        trial.set_user_attr(studies.OWNER, dead)
        trial.set_user_attr(studies.RUN, f"trial-{trial.number}")
        trial.report(5.0, 1)
        asked.append(trial.params)
    runner = Runner(taken_over={0: "resume", 1: Outcome("complete", value=0.5)})
    lines: list[str] = []
    result = run(sweep, runner, lines)
    rows = {row.number: row for row in result.rows}
    assert rows[0].state == "complete" and rows[1].state == "complete" and rows[1].value == 0.5
    assert rows[2].state == "failed" and rows[2].exit_class == "interrupted" and rows[2].rerun
    assert 1 not in runner.started and 2 not in runner.started and runner.started[0] == 0
    again = [row for row in result.rows if row.number > 2 and row.params == asked[2]]
    assert len(again) == 1 and again[0].state == "complete"  # trial 2's point, asked again
    assert sum(not row.rerun for row in result.rows) == 4  # exactly max_trials count
    assert "trial 0 resumed from its checkpoint" in lines[0]
    assert any("trial 2 was cut off before its first checkpoint" in line for line in lines)


def test_a_trial_whose_owner_lives_is_left_alone(tmp_path):
    sweep = load(tmp_path, max_trials=2, parallel=2)
    study = studies.open_study(sweep)
    with owners.Owner(sweep.folder) as other:
        trial = study.ask(studies.distributions(sweep))
        trial.set_user_attr(studies.OWNER, other.name)
        runner = Runner()
        result = run(sweep, runner)
    assert runner.started == [1]  # one slot left: the other process's trial counts and runs there
    assert {row.number: row.state for row in result.rows} == {0: "running", 1: "complete"}


def test_two_sweeps_at_once_never_run_one_trial(tmp_path):
    sweep = load(tmp_path, max_trials=8, parallel=3)
    runner = Runner()
    errors: list[BaseException] = []

    def sweep_in_a_thread() -> None:
        try:
            run(sweep, runner)
        except BaseException as error:  # noqa: BLE001 (reported by the assertion below)
            errors.append(error)

    threads = [threading.Thread(target=sweep_in_a_thread) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    assert sorted(runner.started) == list(range(8))  # every trial once, none twice
    assert runner.most_at_once <= 3  # `parallel` holds over both
    study = optuna.load_study(study_name=sweep.name, storage=studies.storage(sweep))
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 8


def test_sigterm_stops_the_trials_and_leaves_them_to_resume(tmp_path):
    sweep = load(tmp_path, max_trials=6, parallel=2)
    runner = Runner(interrupt_after=4)
    with pytest.raises(controller.SweepInterrupted) as stopped:
        run(sweep, runner)
    assert stopped.value.exit_code == 128 + signal.SIGTERM
    assert "interrupted by SIGTERM: stopped 2 running trials (with their checkpoints)" in str(stopped.value)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is gone again
    study = optuna.load_study(study_name=sweep.name, storage=studies.storage(sweep))
    states = [t.state.name for t in study.trials]
    assert states.count("RUNNING") == 2 and states.count("COMPLETE") == 2
    # the next sweep takes them over (resumed: same numbers) and finishes with exactly max_trials
    resumed = Runner(taken_over={n: "resume" for n, s in enumerate(states) if s == "RUNNING"})
    result = run(sweep, resumed)
    assert [row.state for row in result.rows] == ["complete"] * 6
    assert sorted(resumed.started) == [n for n, s in enumerate(states) if s == "RUNNING"] + [4, 5]


def test_exit_classes_of_a_trials_orch_run():
    from orchestrator.sweep.trials import exit_class

    assert [exit_class(code) for code in (1, 2, 130, 143, 137, -9, 200)] == [
        "failed", "invalid", "stopped", "stopped", "killed by SIGKILL", "killed by SIGKILL", "hardware",
    ]  # fmt: skip


def test_a_sweep_is_continued_only_where_its_trials_ran(tmp_path):
    """The study keeps where its trials run: a local sweep's trials are run dirs, a cluster sweep's are jobs;
    continued elsewhere, each would count the other's running trials as lost and ask them again."""
    sweep, lines = load(tmp_path, max_trials=2), []
    run(sweep, Runner(), lines)
    with pytest.raises(UsageError) as refused:
        run(sweep, Runner(where="cluster"))
    assert str(refused.value) == (
        f"sweep sweep ran its trials here: continue it with `orch sweep {sweep.file}` (or give the cluster "
        f"sweep a study of its own: another `name:` in {sweep.file})"
    )
    other = load(tmp_path / "cluster", max_trials=2)
    run(other, Runner(where="cluster"))
    with pytest.raises(
        UsageError, match=r"runs its trials on the cluster: continue it with `orch sweep .* --cluster`"
    ):
        run(other, Runner())
    study = studies.open_study(other)
    assert study.user_attrs[studies.WHERE] == "cluster" and len(study.trials) == 2  # nothing was started


def test_a_cluster_sweep_goes_on_through_any_context_that_reaches_its_namespace(tmp_path):
    """The study keeps the API server and namespace its trials run in; a context of another name (another
    user's kubeconfig, other credentials) that reaches the same ones continues it; another namespace does not
    (tests/sweep/test_cluster_sweep.py refuses it through the CLI and the emulator)."""
    sweep = load(tmp_path, max_trials=2)
    place = {
        "server": "https://10.0.0.1:6443",
        "namespace": "team-a",
        "shown": "https://10.0.0.1:6443 (context dev)",
    }
    run(sweep, Runner(where="cluster", place=place))
    other_context = {**place, "shown": "https://10.0.0.1:6443 (context alice)"}
    again = load(tmp_path, max_trials=3)  # one more trial: the study goes on
    run(again, Runner(where="cluster", place=other_context))
    study = studies.open_study(again)
    assert len(study.trials) == 3 and study.user_attrs[studies.CLUSTER] == place  # the first one kept
    with pytest.raises(UsageError, match="runs its trials in namespace team-a at https://10.0.0.1:6443 "):
        run(again, Runner(where="cluster", place={**place, "namespace": "team-b"}))
