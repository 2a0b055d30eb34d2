"""The `tracking:` section: validation, and what both APIs' rendered objects carry (checked against the CRDs)."""

from __future__ import annotations

import json

import pytest
import yaml

from orchestrator import runtime_env, status
from orchestrator.commands import tables
from orchestrator.errors import SpecError
from orchestrator.job import loading
from orchestrator.naming import ANNOTATION_TRACKING
from orchestrator.rendering import render, tracking_record
from tests.spec.manifest_checks import objects_errors

BASE = """\
name: tracked
image: ghcr.io/acme/trainer:1.0
train:
  task: digits
  batch_size: 64
tracking:
  tensorboard: true
  mlflow:
    tracking_uri: http://mlflow.mlflow.svc:5000
    experiment: digits
    credentials:
      username: {secret: mlflow-auth, key: user}
      password: {secret: mlflow-auth, key: password}
"""


def load(tmp_path, text: str = BASE, *overrides: str, **kwargs):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return loading.load_job(path, overrides, **kwargs)


def container_env(job: dict) -> list[dict]:
    if job["kind"] == "PyTorchJob":
        return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
    return job["spec"]["trainer"]["env"]


@pytest.mark.parametrize(("api", "kind"), [("pytorchjob", "PyTorchJob"), ("trainjob", "TrainJob")])
def test_both_apis_carry_the_tracking_settings(tmp_path, api, kind):
    objects = render.render(load(tmp_path), api=api)
    assert objects_errors(objects) == []
    job = next(o for o in objects if o["kind"] == kind)
    env = container_env(job)
    orch_env = {e["name"]: e.get("value", e.get("valueFrom")) for e in env}
    tracked = ("ORCH_TENSORBOARD_DIR", "ORCH_IMAGE", "ORCH_API_KIND", "ORCH_NAMESPACE")
    assert {k: v for k, v in orch_env.items() if "MLFLOW" in k or k in tracked} == {
        "ORCH_TENSORBOARD_DIR": "tensorboard",  # under ORCH_OUTPUT_DIR
        "ORCH_MLFLOW": "1",
        "ORCH_MLFLOW_TRACKING_URI": "http://mlflow.mlflow.svc:5000",
        "ORCH_MLFLOW_EXPERIMENT": "digits",
        "ORCH_MLFLOW_RUN_NAME": "tracked",
        "ORCH_IMAGE": "ghcr.io/acme/trainer:1.0",
        "ORCH_API_KIND": kind,
        "ORCH_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        "MLFLOW_TRACKING_USERNAME": {"secretKeyRef": {"name": "mlflow-auth", "key": "user"}},
        "MLFLOW_TRACKING_PASSWORD": {"secretKeyRef": {"name": "mlflow-auth", "key": "password"}},
    }  # fmt: skip
    # What the trainer reads back from that environment.
    plain = {e["name"]: e["value"] for e in env if "value" in e}
    assert runtime_env.RuntimeEnv.from_environ(plain).tracking == runtime_env.TrackingSettings(
        tensorboard_dir="tensorboard",
        mlflow=True,
        mlflow_tracking_uri="http://mlflow.mlflow.svc:5000",
        mlflow_experiment="digits",
        mlflow_run_name="tracked",
        image="ghcr.io/acme/trainer:1.0",
        api_kind=kind,
    )
    assert json.loads(job["metadata"]["annotations"][ANNOTATION_TRACKING]) == {
        "mlflow": {
            "tracking_uri": "http://mlflow.mlflow.svc:5000",
            "experiment": "digits",
            "run_name": "tracked",
        },
        "tensorboard": "/orch/output/tensorboard",
    }


def test_a_job_without_tracking_renders_no_tracking_env(tmp_path):
    text = BASE.split("tracking:")[0]
    for obj in render.render(load(tmp_path, text)):
        dumped = yaml.safe_dump(obj)
        assert "MLFLOW" not in dumped and "TENSORBOARD" not in dumped and ANNOTATION_TRACKING not in dumped


def test_the_uri_may_come_from_a_secret(tmp_path):
    text = BASE.replace("    tracking_uri: http://mlflow.mlflow.svc:5000\n", "") + (
        "secret_env:\n  ORCH_MLFLOW_TRACKING_URI: {secret: mlflow-auth, key: uri}\n"
    )
    spec = load(tmp_path, text, require_image=True)
    env = container_env(render.render(spec)[1])
    assert {
        "name": "ORCH_MLFLOW_TRACKING_URI",
        "valueFrom": {"secretKeyRef": {"name": "mlflow-auth", "key": "uri"}},
    } in env
    assert [e["name"] for e in env].count("ORCH_MLFLOW_TRACKING_URI") == 1


@pytest.mark.parametrize(
    ("text", "overrides", "kwargs", "expected"),
    [
        (  # a cluster job must be told where the server is
            BASE.replace("    tracking_uri: http://mlflow.mlflow.svc:5000\n", ""),
            (),
            {"require_image": True},
            "job.yaml:8:3: tracking.mlflow.tracking_uri: no MLflow server: set tracking.mlflow.tracking_uri, or "
            "ORCH_MLFLOW_TRACKING_URI (e.g. from a Secret through secret_env)",
        ),
        (
            BASE.split("train:")[0] + "command: [python, train.py]\ntracking:\n  tensorboard: true\n",
            (),
            {},
            "job.yaml:4:1: tracking: applies to the built-in trainer (train:); a command job logs itself "
            "(set MLFLOW_TRACKING_URI in env for your script)",
        ),
        (
            BASE + "secret_env:\n  MLFLOW_TRACKING_PASSWORD: {secret: other, key: p}\n",
            (),
            {},
            "job.yaml:13:7: tracking.mlflow.credentials.password: MLFLOW_TRACKING_PASSWORD is also set in env "
            "or secret_env",
        ),
        (
            BASE,
            ("tracking.mlflow.log_model=maybe",),
            {},
            "--set tracking.mlflow.log_model=maybe: tracking.mlflow.log_model: Input should be a valid boolean, "
            "unable to interpret input (got 'maybe')",
        ),
    ],
    ids=["no-uri", "command-job", "credential-clash", "bad-bool"],
)
def test_bad_tracking_sections(tmp_path, text, overrides, kwargs, expected):
    with pytest.raises(SpecError) as error:
        load(tmp_path, text, *overrides, **kwargs)
    want = f"{tmp_path}/{expected}" if expected.startswith("job.yaml") else expected
    assert str(error.value) == want


def test_orch_run_refuses_tracking_without_the_packages(tmp_path, monkeypatch):
    """The one case this test fakes: the extra not installed (find_spec is what the check asks)."""
    real = runtime_env.importlib.util.find_spec
    monkeypatch.setattr(
        runtime_env.importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    with pytest.raises(SpecError) as error:
        load(tmp_path, BASE, local_run=True)
    assert str(error.value) == (
        f"{tmp_path / 'job.yaml'}:8:3: tracking.mlflow: needs mlflow, not installed here: "
        "pip install 'orch-trainer[tracking]'"
    )


def test_orch_run_takes_the_uri_from_the_shell(tmp_path, monkeypatch):
    text = BASE.replace("    tracking_uri: http://mlflow.mlflow.svc:5000\n", "")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("ORCH_MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(SpecError, match="no MLflow server"):
        load(tmp_path, text, local_run=True)
    monkeypatch.setenv("ORCH_MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert load(tmp_path, text, local_run=True).tracking.mlflow.tracking_uri is None


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_orch_status_shows_where_the_job_is_recorded(tmp_path, api):
    from orchestrator.apis import by_key

    job_api = by_key(api)
    job = next(o for o in render.render(load(tmp_path), api=api) if o["kind"] == job_api.resource.kind)
    lines = tables.format_status(status.job_status(job_api, job)).splitlines()
    assert [line for line in lines if line.startswith("Tracking:")] == [
        "Tracking:    mlflow http://mlflow.mlflow.svc:5000 experiment digits, run tracked",
        "Tracking:    tensorboard /orch/output/tensorboard (in the pod of rank 0)",
    ]
    untracked = next(
        o
        for o in render.render(load(tmp_path, BASE.split("tracking:")[0]), api=api)
        if o["kind"] == job_api.resource.kind
    )
    assert not any(
        line.startswith("Tracking:")
        for line in tables.format_status(status.job_status(job_api, untracked)).splitlines()
    )


# --- credentials and free text (issue #25, class 4) ------------------------------------------------------


def test_a_uri_with_a_password_is_refused_and_not_echoed(tmp_path):
    with pytest.raises(SpecError) as caught:
        load(tmp_path, BASE, "tracking.mlflow.tracking_uri=http://bob:hunter22@mlflow:5000")
    assert "tracking.mlflow.credentials" in str(caught.value)
    from orchestrator.cli import one_line

    assert "hunter22" not in one_line(str(caught.value))
    with pytest.raises(SpecError, match="credential"):
        load(tmp_path, BASE.replace("http://mlflow", "http://tok3n@mlflow"))


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_job_free_text_cannot_forge_status_lines(tmp_path, api):
    """An experiment name with a newline (tab and newline are allowed in free strings) stays on its line."""
    from orchestrator.apis import by_key

    job_api = by_key(api)
    text = BASE.replace("experiment: digits", 'experiment: "digits\\nPhase:       Succeeded"')
    job = next(o for o in render.render(load(tmp_path, text), api=api) if o["kind"] == job_api.resource.kind)
    lines = tables.format_status(status.job_status(job_api, job)).splitlines()
    assert len([line for line in lines if line.startswith("Phase:")]) == 1, lines
    assert any(line.startswith("Tracking:    mlflow") and "digits\\nPhase:" in line for line in lines)


def test_an_annotation_with_a_password_is_shown_redacted(tmp_path):
    """A job written by another tool (or an older orch) may hold one: `orch status` never shows it."""
    annotations = {
        ANNOTATION_TRACKING: json.dumps({"mlflow": {"tracking_uri": "http://u:pw@h:5000", "experiment": "e"}})
    }
    assert tracking_record.describe(annotations)["mlflow"].startswith("http://u:***@h:5000 experiment e")
