"""The sweep's loop: ask Optuna for trials, run them through a TrialRunner, report their objective as they go,
prune the hopeless ones, tell Optuna how each ended; and after a restart, take over what was cut off.

Optuna's ask-and-tell has no heartbeat (its docs say RetryFailedTrialCallback does not cover it), so the loop
reconciles itself: every trial the study holds as RUNNING whose `orch sweep` process is gone (sweep/owners.py)
is handed to the runner, which resumes it from its checkpoint, records how it ended while nobody watched, or
reports it lost; a lost trial is failed as `interrupted` (it does not count toward max_trials or max_failed)
and its parameters asked again with `enqueue_trial`. Asking, taking over and counting run under the sweep's
lock, so two processes never run one trial and never more than `parallel` run at once between them.

A SIGTERM or the first Ctrl-C stops the trials the way `orch run` stops (every rank checkpoints), leaves them
RUNNING in the study for the next `orch sweep` to resume, and ends with 128+signal; a second one kills them.
Cluster trials are jobs that do not need the sweep: they go on running, for the next `orch sweep --cluster` to
re-attach. The study keeps where its trials run (`orch.where`; a cluster sweep's cluster and namespace too),
and is continued only there.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from orchestrator.errors import OrchError, SpecError, UsageError
from orchestrator.sweep import owners
from orchestrator.sweep import study as studies
from orchestrator.sweep.spec import Sweep
from orchestrator.sweep.tracking import SweepTracking
from orchestrator.sweep.trials import Outcome, Running, TrialPlan, TrialRunner

POLL_SECONDS = 0.2


class SweepFailed(OrchError):
    """max_failed trials failed: the sweep stopped (its running trials were stopped, resumable)."""

    exit_code = 1


class SweepInterrupted(OrchError):
    """Ctrl-C or SIGTERM: the trials were stopped with their checkpoints; exit 128+signal."""

    def __init__(self, message: str, *, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


@dataclass(frozen=True)
class SweepResult:
    """What a sweep did: every trial (best first), and the best one (None while none completed)."""

    name: str
    folder: Path
    rows: list[studies.TrialRow]

    @property
    def best(self) -> studies.TrialRow | None:
        return next((row for row in self.rows if row.state == "complete"), None)


def run(
    sweep: Sweep,
    runner: TrialRunner,
    *,
    notice: Callable[[str], None],
    poll_seconds: float = POLL_SECONDS,
) -> SweepResult:
    """Run the sweep to its end (max_trials counted, or max_failed reached: SweepFailed); SweepInterrupted on
    SIGTERM/Ctrl-C (handlers installed when called from the main thread)."""
    study = studies.open_study(sweep)
    _claim_place(sweep, study, runner)
    runner.prepare()
    tracking = SweepTracking(sweep, study, notice)
    tracking.start()
    with owners.Owner(sweep.folder) as owner, _stop_signals() as stop:
        try:
            Controller(sweep, study, runner, owner, notice, stop, tracking).loop(poll_seconds)
        except (SweepFailed, SpecError):
            tracking.finish("FAILED")
            raise
    tracking.finish("FINISHED")
    return SweepResult(sweep.name, sweep.folder, studies.rows(study, maximize=sweep.maximize))


def _claim_place(sweep: Sweep, study: optuna.Study, runner: TrialRunner) -> None:
    """A study's trials all run in one place: here, or in one namespace of one cluster; a study without
    trials yet takes this run's. UsageError when this run would continue elsewhere a study that ran trials:
    each place would count the other's running trials as lost and ask them again. (A study from before orch
    kept the place ran its trials here; a cluster sweep's from before it kept the namespace keeps this run's.)"""
    ran = any(studies.RUN in trial.user_attrs for trial in study.get_trials(deepcopy=False))
    kept = study.user_attrs.get(studies.WHERE, "local") if ran else runner.where
    if kept != runner.where:
        if kept == "cluster":
            raise UsageError(
                f"sweep {sweep.name} runs its trials on the cluster: continue it with `orch sweep {sweep.file} "
                "--cluster`"
            )
        raise UsageError(
            f"sweep {sweep.name} ran its trials here: continue it with `orch sweep {sweep.file}` (or give the "
            f"cluster sweep a study of its own: another `name:` in {sweep.file})"
        )
    there, here = study.user_attrs.get(studies.CLUSTER) if ran else None, runner.place
    if there and (there.get("server"), there.get("namespace")) != (here.get("server"), here.get("namespace")):
        raise UsageError(
            f"sweep {sweep.name} runs its trials in namespace {there.get('namespace')} at {there.get('shown')}, "
            f"not in namespace {here.get('namespace')} at {here.get('shown')}: continue it "
            f"there (--context, --namespace), or give this sweep a study of its own: another `name:` in "
            f"{sweep.file}"
        )
    if study.user_attrs.get(studies.WHERE) != runner.where:
        study.set_user_attr(studies.WHERE, runner.where)
    if here and not there:
        study.set_user_attr(studies.CLUSTER, here)


class _Stop:
    """The signals received: the first stops the trials with checkpoints, the second kills them."""

    def __init__(self) -> None:
        self.signum = 0
        self.now = False

    def __call__(self, signum: int, frame: Any) -> None:
        if self.signum:
            self.now = True
        self.signum = self.signum or signum


@contextlib.contextmanager
def _stop_signals() -> Iterator[_Stop]:
    stop = _Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signals reach the main thread only: its caller handles them
        return
    previous = {number: signal.signal(number, stop) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


class Controller:
    def __init__(
        self,
        sweep: Sweep,
        study: optuna.Study,
        runner: TrialRunner,
        owner: owners.Owner,
        notice: Callable[[str], None],
        stop: _Stop,
        tracking: SweepTracking,
    ) -> None:
        self.sweep, self.study, self.runner, self.owner = sweep, study, runner, owner
        self.notice, self.stop, self.tracking = notice, stop, tracking
        self.distributions = studies.distributions(sweep)
        self.running: dict[int, Running] = {}
        self.trials: dict[int, optuna.Trial] = {}
        self.reported: dict[int, int] = {}  # the last step reported to Optuna, per trial
        self.pruning: set[int] = set()
        self.fatal: OrchError | None = None
        self.waiting_for_others = False

    def loop(self, poll_seconds: float) -> None:
        while True:
            if self.stop.signum:
                self._stop_all()
            if self.fatal is not None:
                self._interrupt_all(signal.SIGTERM)
                raise self.fatal
            with owners.exclusive(self.sweep.folder):
                self._take_over()
                can_ask = self._fill()
            self._poll()
            if not self.running and not can_ask and not self.waiting_for_others:
                break
            time.sleep(poll_seconds)
        failures = sum(studies.failed(t) for t in self.study.get_trials(deepcopy=False))
        if failures >= self.sweep.spec.max_failed:
            raise SweepFailed(
                f"sweep {self.sweep.name} stopped: {failures} trials failed (max_failed "
                f"{self.sweep.spec.max_failed}); `orch sweep status {self.sweep.file}` lists them"
            )

    # --- under the sweep's lock -------------------------------------------------------------------------

    def _take_over(self) -> None:
        """Trials RUNNING in the study whose process is gone: resume them, record them, or ask them again."""
        self.waiting_for_others = False
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if trial.number in self.running or self.owner.alive(trial.user_attrs.get(studies.OWNER)):
                continue
            plan = self._plan_of(trial)
            taken = self.runner.reconcile(plan)
            if taken is None:  # its trial process is still stopping: next time
                self.waiting_for_others = True
                continue
            live = studies.live(self.study, trial)
            live.set_user_attr(studies.OWNER, self.owner.name)
            self.trials[trial.number] = live
            self.reported[trial.number] = max(trial.intermediate_values, default=-1)
            if isinstance(taken, Outcome):
                self._record(trial.number, taken, cut_off=True)
            else:
                self.running[trial.number] = taken
                how = "re-attached" if self.runner.where == "cluster" else "resumed from its checkpoint"
                self.notice(f"trial {trial.number} {how} -> {self.runner.describe(plan)}")

    def _fill(self) -> bool:
        """Ask for trials while there is room; whether more may be asked later."""
        spec = self.sweep.spec
        while True:
            trials = self.study.get_trials(deepcopy=False)
            waiting = any(t.state == TrialState.WAITING for t in trials)
            counted = sum(studies.counted(t) for t in trials)
            running = sum(t.state == TrialState.RUNNING for t in trials)
            failures = sum(studies.failed(t) for t in trials)
            if failures >= spec.max_failed or self.fatal is not None or self.stop.signum:
                return False
            if counted >= self.sweep.trials and not waiting:
                return False
            if running >= spec.parallel or len(self.running) >= spec.parallel:
                return True
            trial = self.study.ask(self.distributions)
            trial.set_user_attr(studies.OWNER, self.owner.name)
            plan = self._plan(trial.number, dict(trial.params), self.runner.run_name(trial.number))
            trial.set_user_attr(studies.RUN, plan.run)
            self.trials[trial.number] = trial
            self.running[trial.number] = self.runner.start(plan)
            self.notice(
                f"trial {trial.number} started: {_params(plan.params)} -> {self.runner.describe(plan)}"
            )

    # --- outside it ---------------------------------------------------------------------------------------

    def _poll(self) -> None:
        for number, running in list(self.running.items()):
            trial = self.trials[number]
            for step, value in running.values():
                if step <= self.reported.get(number, -1):
                    continue
                trial.report(value, step)
                self.reported[number] = step
                if number not in self.pruning and trial.should_prune():
                    self.pruning.add(number)
                    running.prune()
                    self.notice(f"trial {number} pruned at step {step}: {self.sweep.metric} {value:.4g}")
            outcome = running.poll()
            if outcome is not None:
                del self.running[number]
                self._record(number, outcome)

    def _record(self, number: int, outcome: Outcome, *, cut_off: bool = False) -> None:
        trial, metric = self.trials[number], self.sweep.metric
        if outcome.state == "complete":
            assert outcome.value is not None
            self.study.tell(trial, outcome.value)
            self.tracking.completed(number, outcome.value)
            self.notice(f"trial {number} complete: {metric} {outcome.value:.4g}" + self._best(number))
        elif outcome.state == "pruned":
            self.study.tell(trial, state=TrialState.PRUNED)
            if number not in self.pruning:  # pruned by an earlier sweep process
                self.notice(f"trial {number} pruned")
        elif outcome.state == "interrupted" and not cut_off:
            return  # the sweep stops: the trial stays RUNNING, for the next `orch sweep` to resume
        else:
            # a hardware failure says nothing of the values: asked again elsewhere, max_failed times at most
            retry = outcome.state == "retry" and self._hardware_reruns() < self.sweep.spec.max_failed
            again = outcome.state == "interrupted" or retry
            if again:
                trial.set_user_attr(studies.RERUN, True)
            trial.set_user_attr(studies.EXIT_CLASS, outcome.exit_class or outcome.state)
            if outcome.error:
                trial.set_user_attr(studies.ERROR, outcome.error)
            if outcome.nodes:
                trial.set_user_attr(studies.NODES, list(outcome.nodes))
            self.study.tell(trial, state=TrialState.FAIL)
            if again:
                self.study.enqueue_trial(dict(trial.params))
                if retry:
                    why = (
                        f"failed on suspected hardware ({outcome.error}); the trials from now on are kept off "
                        + ", ".join(outcome.nodes)
                    )
                elif self.runner.where == "cluster":
                    why = f"was cut off ({outcome.error})"
                else:
                    why = "was cut off before its first checkpoint"
                self.notice(f"trial {number} {why}: its parameters asked again")
                return
            self.notice(
                f"trial {number} failed ({outcome.exit_class}): {outcome.error or 'no error recorded'}"
            )
            if outcome.exit_class == "no objective" and outcome.recorded:
                line, column = _position(self.sweep, ("objective", "metric"))
                self.fatal = SpecError(
                    f"trial {number} recorded {', '.join(outcome.recorded)}, not {metric}",
                    file=str(self.sweep.file), line=line, column=column, field="objective.metric",
                )  # fmt: skip

    def _interrupt_all(self, signum: int) -> None:
        for running in self.running.values():
            running.interrupt(signum)
        while self.running:
            if self.stop.now:
                for running in self.running.values():
                    running.kill()
            time.sleep(POLL_SECONDS)
            self._poll()

    def _stop_all(self) -> None:
        signum = self.stop.signum
        count = len(self.running)
        self._interrupt_all(signum)
        name = signal.Signals(signum).name
        trials = f"{count} running trial{'s' * (count != 1)}"
        if self.runner.where == "cluster":
            raise SweepInterrupted(
                f"interrupted by {name}: {trials} go on as jobs on the cluster; `orch sweep {self.sweep.file} "
                "--cluster` re-attaches them and continues the sweep",
                signum=signum,
            )
        raise SweepInterrupted(
            f"interrupted by {name}: stopped {trials}"
            + (" (with their checkpoints)" if count and not self.stop.now else "")
            + f"; `orch sweep {self.sweep.file}` continues the sweep",
            signum=signum,
        )

    # --- helpers --------------------------------------------------------------------------------------------

    def _plan_of(self, trial: FrozenTrial) -> TrialPlan:
        run = trial.user_attrs.get(studies.RUN) or self.runner.run_name(trial.number)
        return self._plan(trial.number, dict(trial.params), run)

    def _plan(self, number: int, params: dict[str, Any], run: str) -> TrialPlan:
        plan = TrialPlan(number, params, run)
        avoid = dict.fromkeys(
            node
            for t in self.study.get_trials(deepcopy=False)
            for node in t.user_attrs.get(studies.NODES, [])
        )
        return TrialPlan(number, params, run, env=self.tracking.env(plan), avoid_nodes=tuple(avoid))

    def _hardware_reruns(self) -> int:
        trials = self.study.get_trials(deepcopy=False)
        return sum(
            studies.RERUN in t.user_attrs and t.user_attrs.get(studies.EXIT_CLASS) == "hardware"
            for t in trials
        )

    def _best(self, number: int) -> str:
        try:
            best = self.study.best_trial
        except ValueError:
            return ""
        if best.number == number:
            return " (best so far)"
        return f" (best: trial {best.number}, {best.value:.4g})"


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{path}={_short(value)}" for path, value in params.items())


def _short(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4g}"
    return str(value)


def _position(sweep: Sweep, path: tuple[str, ...]) -> tuple[int | None, int | None]:
    return sweep.positions.get(path, (None, None))
