"""The job's tracking record: where its run is recorded, as an annotation on the job object.

`render` writes it (the pods cannot write to their job); `orch status` reads it back with `describe`. Both
sides live here so the format has one owner; the trainer, which does the tracking, is not imported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestrator import naming
from orchestrator.redaction import redact, redact_url

if TYPE_CHECKING:
    from orchestrator.job.spec import JobSpec


def annotation(spec: JobSpec, name: str, kind: str) -> dict[str, str]:
    """{ANNOTATION_TRACKING: JSON {"mlflow": {tracking_uri, experiment, run_name}, "tensorboard": dir}}; {}
    when the job tracks nothing (`kind`: the job object's kind, as the trainer is told)."""
    from orchestrator import (
        runtime_env,
    )  # here: it imports the spec (pydantic), which `orch status` never needs

    settings = runtime_env.TrackingSettings.for_job(spec, name=name, api_kind=kind)
    if not settings.enabled:
        return {}
    record: dict[str, Any] = {}
    if settings.mlflow:
        record["mlflow"] = {
            # validation refuses a URI with a credential; redacted again so none can reach the annotation
            "tracking_uri": redact_url(settings.mlflow_tracking_uri)
            if settings.mlflow_tracking_uri
            else None,
            "experiment": settings.mlflow_experiment,
            "run_name": settings.mlflow_run_name,
        }
    if settings.tensorboard_dir:
        record["tensorboard"] = f"{naming.OUTPUT_DIR}/{settings.tensorboard_dir}"
    return {naming.ANNOTATION_TRACKING: json.dumps(record, separators=(",", ":"))}


def describe(annotations: Any) -> dict[str, str]:
    """`orch status`'s view of a job's tracking, from its annotations: {"mlflow": "URI experiment E, run R",
    "tensorboard": "DIR (in the pods)"}; {} without one (or for anything unreadable: the object comes from
    a server)."""
    text = annotations.get(naming.ANNOTATION_TRACKING) if isinstance(annotations, Mapping) else None
    try:
        record = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    if not isinstance(record, dict):
        return {}
    shown: dict[str, str] = {}
    if isinstance(mlflow := record.get("mlflow"), dict):
        uri = mlflow.get("tracking_uri") or _from_the_pods()
        shown["mlflow"] = redact(f"{uri} experiment {mlflow.get('experiment')}, run {mlflow.get('run_name')}")
    if isinstance(record.get("tensorboard"), str):
        shown["tensorboard"] = f"{record['tensorboard']} (in the pod of rank 0)"
    return shown


def _from_the_pods() -> str:
    from orchestrator.runtime_env import ENV_MLFLOW_TRACKING_URI  # only here: runtime_env imports pydantic

    return f"(the pods' {ENV_MLFLOW_TRACKING_URI})"
