"""What the training loop calls: `build` (the trackers a job asked for, on the rank that logs), the params
and metrics it hands them, as the trackers show them, and `finish` (close the run, keep its links)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator import outputs
from orchestrator.redaction import redact
from orchestrator.runtime_env import PIP_LINE, TrackingSettings, missing_requirements
from orchestrator.trainer.tracking.mlflow_tracker import (
    TAG_API_KIND,
    TAG_GIT_COMMIT,
    TAG_JOB,
    TAG_NAMESPACE,
    TAG_PARENT_RUN,
    MlflowTracker,
)
from orchestrator.trainer.tracking.sinks import (
    CLOSE_SECONDS_ENV,
    DEFAULT_CLOSE_SECONDS,
    NullTracker,
    TensorBoardTracker,
    Trackers,
    warn,
)


def build(
    settings: TrackingSettings, *, enabled: bool, job_name: str, output_dir: Path, **mlflow_options: Any
) -> NullTracker:
    """The trackers a job asked for, on the rank that logs (`enabled`); a NullTracker anywhere else."""
    if not enabled or not settings.enabled:
        return NullTracker()
    if missing := missing_requirements(settings):
        raise RuntimeError(f"tracking needs {' and '.join(missing)}, not installed here: {PIP_LINE}")
    trackers: list[NullTracker] = []
    if settings.mlflow:
        tags = {
            TAG_JOB: job_name,
            TAG_NAMESPACE: settings.namespace,
            TAG_API_KIND: settings.api_kind,
            TAG_GIT_COMMIT: settings.git_commit,
            TAG_PARENT_RUN: settings.mlflow_parent_run_id,
        }
        trackers.append(
            MlflowTracker(
                tracking_uri=settings.mlflow_tracking_uri,
                experiment=settings.mlflow_experiment or job_name,
                run_name=settings.mlflow_run_name or job_name,
                tags={k: v for k, v in tags.items() if v},
                **{
                    "close_seconds": float(os.environ.get(CLOSE_SECONDS_ENV, DEFAULT_CLOSE_SECONDS)),
                    **mlflow_options,
                },
            )
        )
    if settings.tensorboard_dir:
        close_seconds = float(os.environ.get(CLOSE_SECONDS_ENV, DEFAULT_CLOSE_SECONDS))
        trackers.append(
            TensorBoardTracker(output_dir / settings.tensorboard_dir, close_seconds=close_seconds)
        )
    return trackers[0] if len(trackers) == 1 else Trackers(trackers)


def job_params(train: Mapping[str, Any], world: Any, settings: TrackingSettings) -> dict[str, Any]:
    """The run's params: the train section as the trainer got it, flattened, plus where it ran."""
    gpus = world.local_world_size if world.device.type == "cuda" else 0
    where = {
        "nodes": world.world_size // world.local_world_size,
        "gpus_per_node": gpus,
        "procs_per_node": world.local_world_size,
        "world_size": world.world_size,
        "image": settings.image or "(none: orch run)",
    }
    return {**flatten(train), **where}


def step_metrics(stats: Any) -> dict[str, float]:
    """orch's numbers of a log step (a report.StepStats after Progress.log), as the reporter shows them."""
    return {
        "loss": stats.loss,
        "lr": stats.lr,
        "grad_norm": stats.grad_norm,
        "samples_per_second": stats.samples_per_second or 0.0,
    }


def hook_scalars(values: Any, hook: str) -> dict[str, Any]:
    """What a task's on_log / on_eval returned, checked where it enters: None (nothing), or a dict of
    non-empty string names to numbers or strings (strings show on the log line and in the events; everything
    downstream may rely on that). Anything else is a TypeError naming the hook and the entry."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise TypeError(
            f"Task.{hook} must return a dict of name -> number or string (or None), not {_cut(values)}"
        )
    for name, value in values.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"Task.{hook} returned the name {_cut(name)}: names are non-empty strings")
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise TypeError(f"Task.{hook} returned {name!r}: {_cut(value)}, not a number or a string")
    return dict(values)


def _cut(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:75]}...{text[-2:]}"


def numeric(values: Mapping[str, Any]) -> dict[str, float]:
    """The entries that are numbers (bools excluded): what MLflow, TensorBoard and Prometheus can take."""
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def prefixed(prefix: str, values: Mapping[str, Any]) -> dict[str, float]:
    """Metric names as the trackers show them: train/loss, eval/accuracy."""
    return {f"{prefix}/{k}": v for k, v in numeric(values).items()}


def finish(tracker: NullTracker, output_dir: Path, *, failed: bool) -> None:
    """Close the run; say what could not be recorded; leave the links in tracking.json for `orch run`."""
    for line in tracker.close(failed=failed):
        print(f"tracking: {redact(line)}", file=sys.stderr, flush=True)
    if links := tracker.links():
        try:
            outputs.write_json(output_dir / outputs.LINKS, dict(links))
        except OSError as error:
            warn(f"cannot write {output_dir / outputs.LINKS}: {error}")


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys: {"optimizer": {"lr": 0.1}} -> {"optimizer.lr": 0.1}.
    Lists stay one value (JSON); an empty mapping is kept as "{}" so every setting shows."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, (Mapping, list, tuple)):
            flat[name] = json.dumps(value)
        else:
            flat[name] = value
    return flat
