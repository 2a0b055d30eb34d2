"""The sweep's Optuna study: storage, sampler and pruner from the sweep file, and the trials as rows.

Optuna is imported here only, and this module only by `orch sweep` (orch --help and orch render never
load it). The study lives in a journal file in the sweep's folder (runs/NAME/study.journal) unless the sweep
names a database (`storage:`); docs/decisions.md says why a journal. What orch keeps about a trial besides
Optuna's own fields is in the trial's user attributes, under the keys below.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial, TrialState

from orchestrator.sweep.spec import CategoricalParameter, FloatParameter, Sweep

JOURNAL = "study.journal"
# A trial's user attributes (orch's; Optuna's own fields hold params, values, state, intermediate values)
RUN = "orch.run"  # where it ran: its run dir, relative to the sweep's folder (or its cluster job's name)
OWNER = "orch.owner"  # which `orch sweep` process runs it (sweep/owners.py): a trial whose owner died is reconciled
# why it failed: failed, invalid, stopped, killed by SIGKILL, no objective, nan; or interrupted (cut off while
# no sweep ran: asked again, not counted)
EXIT_CLASS = "orch.exit_class"
ERROR = "orch.error"  # its error line
# a trial cut off before its first checkpoint (or failed on suspected hardware), failed and asked again: it no
# longer counts
RERUN = "orch.rerun"
NODES = "orch.suspected_nodes"  # the nodes a trial's failure points at: every later trial is kept off them
# The study's own: where its trials run, "local" or "cluster" (a sweep is continued where it began), and a
# cluster sweep's cluster and namespace: {"server": API server URL, "namespace": ..., "shown": both as the user
# reads them, with the kubeconfig's context}
WHERE = "orch.where"
CLUSTER = "orch.cluster"

STATES = {
    TrialState.RUNNING: "running",
    TrialState.COMPLETE: "complete",
    TrialState.PRUNED: "pruned",
    TrialState.FAIL: "failed",
    TrialState.WAITING: "waiting",
}


def open_study(sweep: Sweep) -> optuna.Study:
    """The sweep's study, created on the first run and loaded on every later one (the same name and storage)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # orch says what happens, one line per trial
    return optuna.create_study(
        study_name=sweep.name,
        storage=storage(sweep),
        sampler=sampler(sweep),
        pruner=pruner(sweep),
        direction="maximize" if sweep.maximize else "minimize",
        load_if_exists=True,
    )


def storage(sweep: Sweep) -> optuna.storages.BaseStorage | str:
    if sweep.spec.storage is not None:
        return sweep.spec.storage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    sweep.folder.mkdir(parents=True, exist_ok=True)
    path = str(sweep.folder / JOURNAL)
    # the open lock (O_EXCL) rather than the default symlink one: it also works where symlinks do not
    return optuna.storages.JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))


def sampler(sweep: Sweep) -> optuna.samplers.BaseSampler:
    algorithm = sweep.spec.algorithm
    if algorithm == "grid":
        return _Grid({path: parameter.grid() or [] for path, parameter in sweep.spec.parameters.items()})
    if algorithm == "random":
        return optuna.samplers.RandomSampler()
    # TPE's first trials are random: n_startup_trials (10 by default) of them, fewer in a short sweep
    return optuna.samplers.TPESampler(n_startup_trials=min(10, max(1, sweep.trials // 4)))


class _Grid(optuna.samplers.GridSampler):
    """Optuna's grid, without the `study.stop()` it calls once every point was asked: that works inside
    `study.optimize` only (elsewhere it raises); the sweep stops at max_trials, the grid's size by default."""

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Any) -> None:
        pass


def pruner(sweep: Sweep) -> optuna.pruners.BasePruner:
    stopping = sweep.spec.early_stopping
    if stopping.name == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=stopping.min_trials, n_warmup_steps=stopping.min_steps
        )
    if stopping.name == "hyperband":
        train = sweep.job.train
        max_steps = train.max_steps if train is not None and train.max_steps else "auto"
        return optuna.pruners.HyperbandPruner(min_resource=max(1, stopping.min_steps), max_resource=max_steps)
    return optuna.pruners.NopPruner()


def distributions(sweep: Sweep) -> dict[str, BaseDistribution]:
    """Each parameter's search space as Optuna's distribution (asked with `study.ask(fixed_distributions)`)."""
    found: dict[str, BaseDistribution] = {}
    for path, parameter in sweep.spec.parameters.items():
        if isinstance(parameter, CategoricalParameter):
            found[path] = CategoricalDistribution(parameter.values)
        elif isinstance(parameter, FloatParameter):
            found[path] = FloatDistribution(
                parameter.low, parameter.high, log=parameter.log, step=parameter.step
            )
        else:
            step = None if parameter.log else parameter.step
            found[path] = IntDistribution(parameter.low, parameter.high, log=parameter.log, step=step or 1)
    return found


def live(study: optuna.Study, trial: FrozenTrial) -> optuna.Trial:
    """A trial the study already holds, to report to and set attributes on: after a restart only the frozen
    record is left, and Optuna's ask-and-tell has no public way back to its Trial (its `_trial_id` is the
    storage's key; optuna>=5,<6 is pinned for it)."""
    return optuna.trial.Trial(study, trial._trial_id)


def counted(trial: FrozenTrial) -> bool:
    """Whether the trial counts toward max_trials: all but those cut off and asked again (RERUN)."""
    return RERUN not in trial.user_attrs


def failed(trial: FrozenTrial) -> bool:
    """A failure that counts toward max_failed: not a trial the sweep itself cut off."""
    return (
        trial.state == TrialState.FAIL
        and counted(trial)
        and trial.user_attrs.get(EXIT_CLASS) != "interrupted"
    )


# --- what `orch sweep status` shows ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialRow:
    """One trial as `orch sweep status` shows it."""

    number: int
    state: str
    """running, complete, pruned, failed (or waiting: asked again, not started yet)."""
    params: dict[str, Any]
    value: float | None
    """The objective: the final value (complete), the last reported one (pruned, running), None (failed)."""
    run: str | None
    """Its run dir, relative to the sweep's folder (or its cluster job's name)."""
    step: int | None = None
    """The last step it reported the objective at."""
    exit_class: str | None = None
    error: str | None = None
    rerun: bool = False
    """Cut off before its first checkpoint and asked again as a new trial (does not count)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "state": self.state,
            "params": self.params,
            "value": self.value,
            "step": self.step,
            "run": self.run,
            "exit_class": self.exit_class,
            "error": self.error,
            "rerun": self.rerun,
        }


def rows(study: optuna.Study, *, maximize: bool) -> list[TrialRow]:
    """Every trial, best first: complete by value, then pruned by their last value, running, waiting, failed."""
    found = [row_of(trial) for trial in study.get_trials(deepcopy=False)]
    order = {"complete": 0, "pruned": 1, "running": 2, "waiting": 3, "failed": 4}

    def key(row: TrialRow) -> tuple[int, float, int]:
        value = row.value if row.value is not None and math.isfinite(row.value) else math.inf
        return order.get(row.state, 5), -value if maximize and value != math.inf else value, row.number

    return sorted(found, key=key)


def row_of(trial: FrozenTrial) -> TrialRow:
    steps = trial.intermediate_values
    last_step = max(steps) if steps else None
    value = trial.value if trial.state == TrialState.COMPLETE else None
    if value is None and trial.state in (TrialState.PRUNED, TrialState.RUNNING) and last_step is not None:
        value = steps[last_step]
    attrs: Mapping[str, Any] = trial.user_attrs
    return TrialRow(
        number=trial.number,
        state=STATES.get(trial.state, trial.state.name.lower()),
        params=dict(trial.params),
        value=value,
        run=attrs.get(RUN),
        step=last_step,
        exit_class=attrs.get(EXIT_CLASS),
        error=attrs.get(ERROR),
        rerun=RERUN in attrs,
    )
