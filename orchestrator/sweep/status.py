"""`orch sweep status`: every trial of a sweep, best first, and the plot of them, read from its study."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import optuna

from orchestrator.errors import UsageError
from orchestrator.sweep import plot
from orchestrator.sweep import study as studies
from orchestrator.sweep.spec import Sweep


@dataclass(frozen=True)
class SweepStatus:
    name: str
    folder: Path
    metric: str
    goal: str
    max_trials: int
    rows: list[studies.TrialRow]
    plot: Path | None
    """The PNG written (None: no trials with a value yet, or matplotlib not installed)."""
    where: str = "local"
    """Where its trials run: local (each row's run is its run dir in `folder`) or cluster (its job's name)."""

    @property
    def best(self) -> studies.TrialRow | None:
        return next((row for row in self.rows if row.state == "complete"), None)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "folder": str(self.folder),
            "metric": self.metric,
            "goal": self.goal,
            "max_trials": self.max_trials,
            "best": self.best.number if self.best else None,
            "plot": str(self.plot) if self.plot else None,
            "where": self.where,
            "trials": [{**row.to_json(), **self._where(row)} for row in self.rows],
        }

    def _where(self, row: studies.TrialRow) -> dict[str, str | None]:
        if self.where == "cluster":
            return {"job": row.run, "run_dir": None}
        return {"run_dir": str(self.folder / row.run) if row.run else None}


def status(sweep: Sweep, *, draw: bool = True) -> SweepStatus:
    """The sweep's trials as its study holds them (UsageError when it never ran), and its plot."""
    if sweep.spec.storage is None and not (sweep.folder / studies.JOURNAL).exists():
        raise UsageError(
            f"sweep {sweep.name} has not run yet (no {sweep.folder / studies.JOURNAL}): orch sweep {sweep.file}"
        )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=sweep.name, storage=studies.storage(sweep))
    except KeyError:
        raise UsageError(
            f"sweep {sweep.name} has not run yet (no such study in its storage): orch sweep {sweep.file}"
        ) from None
    rows = studies.rows(study, maximize=sweep.maximize)
    drawn = plot.write(sweep, rows) if draw and any(row.value is not None for row in rows) else None
    where = str(study.user_attrs.get(studies.WHERE, "local"))
    return SweepStatus(
        sweep.name, sweep.folder, sweep.metric, sweep.spec.objective.goal, sweep.trials, rows, drawn, where
    )
