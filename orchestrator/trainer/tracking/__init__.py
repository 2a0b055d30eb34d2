"""Experiment tracking: where rank 0 records a run besides stdout and Prometheus (MLflow, TensorBoard).

Sinks in the torchtitan style: a `NullTracker` that does nothing (every rank but 0, or tracking off), one class
per backend, and `Trackers` that fans out to several. The loop calls the same four methods whatever is on:

    tracker.start(saved=..., step=...)       after the resume: continue the checkpoint's MLflow run, if any
    tracker.log_metrics(step, {"train/loss": ...})   at log steps and evaluations
    tracker.log_artifacts([summary.json, model.pt])  at the end
    tracker.close(failed=...)                in the entrypoint's `finally`

Tracking never takes training down, and never blocks a collective path. MLflow calls run on a background
thread: a server that does not answer costs the loop nothing, is one warning, and what it missed is kept and
sent again later (every `retry_seconds`, and once more at the end); what still could not be sent is said when
the run closes, which waits at most `close_seconds` ($ORCH_TRACKING_CLOSE_SECONDS). A checkpoint never waits
for the server (rank 0 would hold the other ranks in the checkpoint's collectives): it records the run's key, a
random id drawn when the training run starts and tagged on the MLflow run when it is created, and the run's id
once known; a resume from a checkpoint taken before the run existed finds it by that tag. An error that
trying again cannot fix (a refused request, a store MLflow will not open) is said once, in full, and MLflow
is switched off for the run. A TensorBoard writer that fails (a full
disk) is one warning and is switched off.

mlflow and tensorboard are optional (`pip install 'orch-trainer[tracking]'`) and imported only when used.

- sinks.py: `NullTracker` (the contract), `Trackers` (the fan-out), `TensorBoardTracker`;
- mlflow_tracker.py: `MlflowTracker` (its thread, retries, the run continued on resume) and its tags;
- loop.py: what the loop calls: `build` (the trackers a job asked for), the params and metrics it hands them,
  `finish` (the run closed, its links in tracking.json).

Callers use the names below.
"""

from orchestrator.trainer.tracking.loop import (
    build,
    finish,
    flatten,
    hook_scalars,
    job_params,
    numeric,
    prefixed,
    step_metrics,
)
from orchestrator.trainer.tracking.mlflow_tracker import (
    MLFLOW_HTTP_DEFAULTS,
    TAG_RUN_KEY,
    MlflowTracker,
    transient,
)
from orchestrator.trainer.tracking.sinks import NullTracker, TensorBoardTracker, Trackers

__all__ = [
    "MLFLOW_HTTP_DEFAULTS",
    "TAG_RUN_KEY",
    "MlflowTracker",
    "NullTracker",
    "TensorBoardTracker",
    "Trackers",
    "build",
    "finish",
    "flatten",
    "hook_scalars",
    "job_params",
    "numeric",
    "prefixed",
    "step_metrics",
    "transient",
]
