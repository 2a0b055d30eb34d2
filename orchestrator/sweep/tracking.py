"""MLflow for a sweep whose job has `tracking.mlflow`: one parent run for the sweep, each trial's run its child.

The sweep creates the parent run (in the job's experiment) on its first start and keeps its id in the study
(user attribute `orch.mlflow_parent_run`), so every later `orch sweep` of the same study goes on with the
same run. Each trial's trainer creates its own run, as any `orch run` does, named NAME-trial-N and tagged
`mlflow.parentRunId` (MLflow's own tag: its UI nests the trials under the sweep) through the trial's
environment. The parent gets the sweep's settings as params and, as the sweep goes, the best value so far
(`best/<metric>`, by trial number as its step); it ends FINISHED, FAILED (max_failed), or stays RUNNING when
the sweep was interrupted.

MLflow never stops a sweep: a server that does not answer is one notice, and the trials still train (their
own runs are the trainer's business). mlflow (the `tracking` extra) is imported only here, only then.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import optuna

from orchestrator import runtime_env
from orchestrator.sweep.spec import Sweep
from orchestrator.sweep.trials import TrialPlan

PARENT_RUN = "orch.mlflow_parent_run"
TAG_SWEEP = "orch.sweep"


class SweepTracking:
    """The sweep's MLflow parent run, or nothing when the job does not track with MLflow."""

    def __init__(self, sweep: Sweep, study: optuna.Study, notice: Callable[[str], None]) -> None:
        self.sweep, self.study, self.notice = sweep, study, notice
        self.run_id: str | None = None
        self._client: Any = None
        self._best: float | None = None

    def start(self) -> None:
        mlflow = self.sweep.job.tracking.mlflow
        if mlflow is None:
            return
        settings = runtime_env.TrackingSettings.for_job(
            self.sweep.job, name=self.sweep.job.name, api_kind="local"
        )
        uri = (
            os.environ.get(runtime_env.ENV_MLFLOW_TRACKING_URI)
            or settings.mlflow_tracking_uri
            or os.environ.get("MLFLOW_TRACKING_URI")
        )
        experiment = os.environ.get(runtime_env.ENV_MLFLOW_EXPERIMENT) or settings.mlflow_experiment
        # as the trainer's tracker: a short HTTP budget, and `file:` stores allowed (MLflow 3 refuses them unless told)
        defaults = {
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
            "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
            "MLFLOW_ALLOW_FILE_STORE": "true",
        }
        for name, value in defaults.items():
            os.environ.setdefault(name, value)
        try:
            self.run_id = self._parent(uri, experiment or self.sweep.job.name)
        except Exception as error:  # noqa: BLE001 (MLflow's and the network's errors: the sweep goes on)
            self.notice(f"tracking: no MLflow run for the sweep ({' '.join(str(error).split())[:200]})")
            self.run_id = None

    def env(self, plan: TrialPlan) -> dict[str, str]:
        """What a trial's environment gets: its run's name, and its parent."""
        if self.sweep.job.tracking.mlflow is None:
            return {}
        base = self.sweep.job.tracking.mlflow.run_name or self.sweep.job.name
        found = {runtime_env.ENV_MLFLOW_RUN_NAME: f"{base}-trial-{plan.number}"}
        if self.run_id is not None:
            found[runtime_env.ENV_MLFLOW_PARENT_RUN] = self.run_id
        return found

    def completed(self, number: int, value: float) -> None:
        better = self._best is None or (value > self._best if self.sweep.maximize else value < self._best)
        if self.run_id is None or not better:
            return
        self._best = value
        self._call(
            lambda: self._client.log_metric(self.run_id, f"best/{self.sweep.metric}", value, step=number)
        )

    def finish(self, status: str) -> None:
        """FINISHED or FAILED; an interrupted sweep's run stays RUNNING (the next `orch sweep` goes on with it)."""
        if self.run_id is not None:
            self._call(lambda: self._client.set_terminated(self.run_id, status))

    def _parent(self, uri: str | None, experiment: str) -> str:
        from mlflow.tracking import MlflowClient

        self._client = client = MlflowClient(tracking_uri=uri)
        known = self.study.user_attrs.get(PARENT_RUN)
        if known:
            client.update_run(known, status="RUNNING")
            return str(known)
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
        run = client.create_run(
            experiment_id, run_name=f"sweep {self.sweep.name}", tags={TAG_SWEEP: self.sweep.name}
        )
        run_id = str(run.info.run_id)
        spec = self.sweep.spec
        params = {
            "sweep.algorithm": spec.algorithm,
            "sweep.metric": spec.objective.metric,
            "sweep.goal": spec.objective.goal,
            "sweep.max_trials": self.sweep.trials,
            "sweep.parallel": spec.parallel,
            "sweep.early_stopping": spec.early_stopping.name,
            **{f"sweep.parameters.{path}": p.model_dump_json() for path, p in spec.parameters.items()},
        }
        for name, value in params.items():
            client.log_param(run_id, name, str(value)[:6000])
        self.study.set_user_attr(PARENT_RUN, run_id)
        return run_id

    def _call(self, action: Callable[[], Any]) -> None:
        try:
            action()
        except Exception as error:  # noqa: BLE001 (as in start)
            self.notice(
                f"tracking: MLflow did not take the sweep's update ({' '.join(str(error).split())[:200]})"
            )
