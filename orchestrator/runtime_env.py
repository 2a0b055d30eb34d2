"""What a launcher passes to the trainer besides train.json: the runtime facts, as `ORCH_*` environment variables.

Two channels reach `python -m orchestrator.trainer`: the job's `train` section as a file (`train_json`,
`--config`), and the facts of where and how it runs (job name, output directory, exporter settings, where
progress goes) in the environment. `render` (the pods) and `orch run` (this machine) write the environment
with `RuntimeEnv.to_env()`; the trainer reads it once with `RuntimeEnv.from_environ()`. Every name and
default lives here. Imports the trainer's config (pydantic, no torch) and nothing else of the trainer.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator import outputs
from orchestrator.trainer.config import (
    DEFAULT_GPU_SAMPLE_SECONDS,
    DEFAULT_METRICS_PORT,
    ENV_MLFLOW_TRACKING_URI,
    TrainSpec,
)

if TYPE_CHECKING:
    from orchestrator.job.spec import JobSpec

__all__ = [
    "DEFAULT_GPU_SAMPLE_SECONDS",
    "DEFAULT_METRICS_PORT",
    "ENV_MLFLOW_TRACKING_URI",
]  # the trainer config's, here too
DEFAULT_METRICS_ADDR = "0.0.0.0"  # Prometheus scrapes the pod's IP

JOB_NAME = "ORCH_JOB_NAME"
# ORCH_OUTPUT_DIR is outputs.ENV: the output directory's module names it (a pod's launch.py reads it too)
OUTPUT_URL = "ORCH_OUTPUT_URL"  # an object store (output.url, `orch run --out s3://...`): what the run keeps
METRICS_PORT = "ORCH_METRICS_PORT"  # unset or 0: no exporter
METRICS_ADDR = "ORCH_METRICS_ADDR"
# `orch run`: local rank 0 serves the job's port, or a free one when it is taken, and writes where in this file
METRICS_ENDPOINT_FILE = "ORCH_METRICS_ENDPOINT_FILE"
GPU_SAMPLE_SECONDS = "ORCH_GPU_SAMPLE_SECONDS"
PEAK_TFLOPS = "ORCH_PEAK_TFLOPS"
PROGRESS_FILE = "ORCH_PROGRESS_FILE"  # `orch run`: rank 0's JSON events, drawn as a progress bar
LOG_LINES = "ORCH_LOG_LINES"  # "0": no plain log lines (the progress bar draws instead)
FINAL_SAVE = "ORCH_FINAL_SAVE"  # "0": no final checkpoint and no model.pt (benchmark runs)
# `orch sweep` (orchestrator/sweep/): the metric a trial is judged on, which rank 0 writes to OUT/objective.json
# at each evaluation (train/*: each log step) and at the end; and the file whose appearance asks the trial to
# stop as pruned (a checkpoint, summary.json, exit 0: docs/sweeps.md): a path, or for a cluster trial an
# object in its store (OUTPUT_URL/prune.request)
OBJECTIVE = "ORCH_OBJECTIVE"
PRUNE_FILE = "ORCH_PRUNE_FILE"
HEARTBEAT = "ORCH_HEARTBEAT"  # "0": no heartbeat thread and no goodput journal (benchmark 12 measures them)
JOB_STARTED = "ORCH_JOB_STARTED"  # `orch run`: when the job started (Unix time), the goodput journal's start

# --- tracking: job.yaml's `tracking:` section, for orchestrator.trainer.tracking -------------------------
ENV_TENSORBOARD_DIR = "ORCH_TENSORBOARD_DIR"
ENV_MLFLOW = "ORCH_MLFLOW"  # "1": the job asked for MLflow
ENV_MLFLOW_EXPERIMENT = "ORCH_MLFLOW_EXPERIMENT"
ENV_MLFLOW_RUN_NAME = "ORCH_MLFLOW_RUN_NAME"
ENV_MLFLOW_LOG_MODEL = "ORCH_MLFLOW_LOG_MODEL"  # "0": no model.pt artifact
ENV_MLFLOW_PARENT_RUN = (
    "ORCH_MLFLOW_PARENT_RUN_ID"  # `orch sweep`: the sweep's run, whose child each trial's is
)
ENV_IMAGE = "ORCH_IMAGE"
ENV_NAMESPACE = "ORCH_NAMESPACE"  # in pods: the downward API's metadata.namespace
ENV_API_KIND = "ORCH_API_KIND"
ENV_GIT_COMMIT = "ORCH_GIT_COMMIT"
PIP_LINE = "pip install 'orch-trainer[tracking]'"
# What each sink imports, and the distribution that provides it (mlflow-skinny is enough for the client).
REQUIREMENTS = {"mlflow": "mlflow", "tensorboard": "tensorboard"}
# What the shell of `orch run` may override (e.g. the URI of this environment's server).
TRACKING_OVERRIDES = (
    ENV_MLFLOW_TRACKING_URI,
    ENV_MLFLOW_EXPERIMENT,
    ENV_MLFLOW_RUN_NAME,
    ENV_TENSORBOARD_DIR,
)


@dataclass(frozen=True)
class TrackingSettings:
    """What the trainer is told about tracking: job.yaml's `tracking:` section, through the ORCH_* environment."""

    tensorboard_dir: str | None = None
    """Event files go here (relative: under the output dir); None: no TensorBoard."""
    mlflow: bool = False
    mlflow_tracking_uri: str | None = None
    """None: MLflow's own MLFLOW_TRACKING_URI."""
    mlflow_experiment: str | None = None
    """None: the job name."""
    mlflow_run_name: str | None = None
    """None: the job name."""
    mlflow_log_model: bool = True
    mlflow_parent_run_id: str | None = None
    """`orch sweep`: the sweep's MLflow run; the trial's run is its child (MLflow's mlflow.parentRunId tag)."""
    image: str | None = None
    namespace: str | None = None
    api_kind: str | None = None
    """PyTorchJob, TrainJob, or local (`orch run`)."""
    git_commit: str | None = None
    """Of the user's code, when known (`orch run`: the working directory's checkout; images: VCS_REF)."""

    @property
    def enabled(self) -> bool:
        return self.mlflow or self.tensorboard_dir is not None

    @classmethod
    def for_job(
        cls, spec: JobSpec, *, name: str, api_kind: str, git_commit: str | None = None
    ) -> TrackingSettings:
        tracking = spec.tracking
        mlflow = tracking.mlflow
        return cls(
            tensorboard_dir=outputs.TENSORBOARD if tracking.tensorboard else None,  # under the output dir
            mlflow=mlflow is not None,
            mlflow_tracking_uri=mlflow.tracking_uri if mlflow else None,
            mlflow_experiment=(mlflow.experiment or name) if mlflow else None,
            mlflow_run_name=(mlflow.run_name or name) if mlflow else None,
            mlflow_log_model=mlflow.log_model if mlflow else True,
            image=spec.image if api_kind != "local" else None,  # `orch run` runs no image
            namespace=spec.namespace,
            api_kind=api_kind,
            git_commit=git_commit,
        )

    def to_env(self) -> dict[str, str]:
        """The variables to set; nothing at all when tracking is off (the pods of such a job do not change)."""
        if not self.enabled:
            return {}
        values = {
            ENV_TENSORBOARD_DIR: self.tensorboard_dir,
            ENV_MLFLOW: "1" if self.mlflow else None,
            ENV_MLFLOW_TRACKING_URI: self.mlflow_tracking_uri,
            ENV_MLFLOW_EXPERIMENT: self.mlflow_experiment,
            ENV_MLFLOW_RUN_NAME: self.mlflow_run_name,
            ENV_MLFLOW_LOG_MODEL: None if self.mlflow_log_model else "0",
            ENV_MLFLOW_PARENT_RUN: self.mlflow_parent_run_id,
            ENV_IMAGE: self.image,
            ENV_NAMESPACE: self.namespace,
            ENV_API_KIND: self.api_kind,
            ENV_GIT_COMMIT: self.git_commit,
        }
        return {k: v for k, v in values.items() if v}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> TrackingSettings:
        env = os.environ if environ is None else environ
        return cls(
            tensorboard_dir=env.get(ENV_TENSORBOARD_DIR) or None,
            mlflow=env.get(ENV_MLFLOW, "0") not in ("", "0"),
            mlflow_tracking_uri=env.get(ENV_MLFLOW_TRACKING_URI) or None,
            mlflow_experiment=env.get(ENV_MLFLOW_EXPERIMENT) or None,
            mlflow_run_name=env.get(ENV_MLFLOW_RUN_NAME) or None,
            mlflow_log_model=env.get(ENV_MLFLOW_LOG_MODEL, "1") != "0",
            mlflow_parent_run_id=env.get(ENV_MLFLOW_PARENT_RUN) or None,
            image=env.get(ENV_IMAGE) or None,
            namespace=env.get(ENV_NAMESPACE) or None,
            api_kind=env.get(ENV_API_KIND) or None,
            git_commit=None if env.get(ENV_GIT_COMMIT, "unknown") in ("", "unknown") else env[ENV_GIT_COMMIT],
        )


def missing_requirements(settings: TrackingSettings) -> list[str]:
    """The optional packages this job's tracking needs and this Python lacks (checked without importing)."""
    wanted = (["mlflow"] if settings.mlflow else []) + (["tensorboard"] if settings.tensorboard_dir else [])
    return [REQUIREMENTS[name] for name in wanted if importlib.util.find_spec(name) is None]


# Settings a user may override from the shell of `orch run` (e.g. ORCH_METRICS_PORT=0 turns the exporter off).
USER_OVERRIDES = (METRICS_PORT, GPU_SAMPLE_SECONDS, PEAK_TFLOPS, METRICS_ADDR, *TRACKING_OVERRIDES)


@dataclass(frozen=True)
class RuntimeEnv:
    job_name: str = "local"
    output_dir: str = "."
    """Where summary.json, model.pt and (by default) checkpoints go; with `output_url`, only the local
    side: logs, progress, TensorBoard's event files as they are written, summary.json for `orch run`."""
    output_url: str | None = None
    """An object-store URL (s3://bucket/prefix): checkpoints, model.pt, summary.json and the TensorBoard
    event files go there (orchestrator/storage.py)."""
    metrics_port: int = 0
    """The exporter's port on local rank 0; 0: metrics off."""
    metrics_addr: str = DEFAULT_METRICS_ADDR
    metrics_endpoint_file: str | None = None
    """`orch run`: a taken port moves to a free one, and the address served is written here once bound (the
    console and `orch top --local` read it). Pods keep their port: the PodMonitor scrapes that one."""
    gpu_sample_seconds: float = DEFAULT_GPU_SAMPLE_SECONDS
    peak_tflops: float | None = None
    """Peak dense TFLOP/s of one device for MFU; None: the built-in GPU table decides."""
    progress_file: str | None = None
    log_lines: bool = True
    final_save: bool = True
    """False: the run ends without its final checkpoint and model.pt (benchmarks time the training only)."""
    tracking: TrackingSettings = field(default_factory=lambda: TrackingSettings())
    """MLflow and TensorBoard (job.yaml's `tracking:`); nothing in the environment when off."""
    objective: str | None = None
    """`orch sweep`: the metric (eval/loss, train/loss) written to OUT/objective.json; None: no file."""
    prune_file: str | None = None
    """`orch sweep`: the file (a path, or an object-store URL for a cluster trial) whose appearance stops the run
    as pruned; None: never pruned."""
    heartbeat: bool = True
    """False: no heartbeat thread (no hang verdicts) and no goodput journal; the loop's marks stay."""
    job_started: float | None = None
    """When the job started (`orch run`'s launch), for the goodput journal's first attempt; None: the first
    attempt's own start (a pod: `orch status` adds the time before the pods from the cluster's objects)."""

    @classmethod
    def for_job(
        cls,
        spec: JobSpec,
        *,
        name: str,
        output_dir: str,
        output_url: str | None = None,
        api_kind: str = "local",
        git_commit: str | None = None,
    ) -> RuntimeEnv:
        """What a job's processes get, in a pod (render: `api_kind` PyTorchJob / TrainJob) or here (`orch run`)."""
        return cls(
            job_name=name,
            output_dir=output_dir,
            output_url=output_url,
            metrics_port=spec.metrics.port if spec.metrics.enabled else 0,
            gpu_sample_seconds=spec.metrics.gpu_sample_seconds,
            peak_tflops=spec.metrics.peak_tflops,
            tracking=TrackingSettings.for_job(spec, name=name, api_kind=api_kind, git_commit=git_commit),
        )

    def to_env(self) -> dict[str, str]:
        """The variables to set; ones left at their default are left out (except port and sample period,
        which pods always show, so `kubectl describe` says whether metrics are on)."""
        env = {
            JOB_NAME: self.job_name,
            outputs.ENV: self.output_dir,
            METRICS_PORT: str(self.metrics_port),
            GPU_SAMPLE_SECONDS: str(self.gpu_sample_seconds),
        }
        if self.output_url is not None:
            env[OUTPUT_URL] = self.output_url
        if self.peak_tflops is not None:
            env[PEAK_TFLOPS] = str(self.peak_tflops)
        if self.metrics_addr != DEFAULT_METRICS_ADDR:
            env[METRICS_ADDR] = self.metrics_addr
        if self.metrics_endpoint_file is not None:
            env[METRICS_ENDPOINT_FILE] = self.metrics_endpoint_file
        if self.progress_file is not None:
            env[PROGRESS_FILE] = self.progress_file
        if not self.log_lines:
            env[LOG_LINES] = "0"
        if not self.final_save:
            env[FINAL_SAVE] = "0"
        if self.objective is not None:
            env[OBJECTIVE] = self.objective
        if self.prune_file is not None:
            env[PRUNE_FILE] = self.prune_file
        if not self.heartbeat:
            env[HEARTBEAT] = "0"
        if self.job_started is not None:
            env[JOB_STARTED] = repr(self.job_started)
        env.update(self.tracking.to_env())
        return env

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> RuntimeEnv:
        """Read once by the trainer. A malformed number is a warning and its default, never a crash."""
        env = os.environ if environ is None else environ
        return cls(
            job_name=env.get(JOB_NAME) or "local",
            output_dir=env.get(outputs.ENV) or ".",
            output_url=env.get(OUTPUT_URL) or None,
            metrics_port=int(_number(env, METRICS_PORT, minimum=0) or 0),
            metrics_addr=env.get(METRICS_ADDR) or DEFAULT_METRICS_ADDR,
            metrics_endpoint_file=env.get(METRICS_ENDPOINT_FILE) or None,
            gpu_sample_seconds=_number(env, GPU_SAMPLE_SECONDS, minimum=1e-3) or DEFAULT_GPU_SAMPLE_SECONDS,
            peak_tflops=_number(env, PEAK_TFLOPS, minimum=1e-9),
            progress_file=env.get(PROGRESS_FILE) or None,
            log_lines=env.get(LOG_LINES, "1") != "0",
            final_save=env.get(FINAL_SAVE, "1") != "0",
            tracking=TrackingSettings.from_environ(env),
            objective=env.get(OBJECTIVE) or None,
            prune_file=env.get(PRUNE_FILE) or None,
            heartbeat=env.get(HEARTBEAT, "1") != "0",
            job_started=_number(env, JOB_STARTED, minimum=0),
        )


def _number(env: Mapping[str, str], name: str, *, minimum: float) -> float | None:
    """The number `name` holds; None when unset or malformed (a warning: its default applies)."""
    text = (env.get(name) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= minimum) or (name == METRICS_PORT and value != int(value)):
        import logging  # here: only the trainer warns, and `orch render` imports this module

        logging.getLogger(__name__).warning(
            "ignoring %s=%r: not a valid value (using the default)", name, text
        )
        return None
    return value


def train_json(train: TrainSpec) -> str:
    """train.json, the trainer's `--config`: the job's `train` section, in the pods' ConfigMap and `orch run`'s
    output directory alike."""
    return json.dumps(train.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"


def load_train_json(text: str) -> TrainSpec:
    """The trainer's side of train_json: validated again, so a hand-edited file fails with pydantic's message."""
    return TrainSpec.model_validate(json.loads(text))
