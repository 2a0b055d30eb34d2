"""train.checkpoint.on_stop on the cluster (#24.2): the pods' terminationGracePeriodSeconds and torchrun's
shutdown timeout leave the trainer time to write its stop checkpoint after a SIGTERM (docs/trainer.md,
"Stopping: SIGTERM and Ctrl-C")."""

from __future__ import annotations

import pytest

from orchestrator.errors import SpecError
from orchestrator.rendering import render
from tests.spec.conftest import load
from tests.spec.manifest_checks import objects_errors

BASE = "name: demo\nimage: example.com/trainer:1\ntrain: {task: digits, batch_size: 64}\n"


def pods(objects):
    """Every pod spec the objects carry (PyTorchJob replicas; the TrainingRuntime's JobSet template)."""
    for obj in objects:
        if obj["kind"] == "PyTorchJob":
            yield from (r["template"]["spec"] for r in obj["spec"]["pytorchReplicaSpecs"].values())
        if obj["kind"] == "TrainingRuntime":
            for job in obj["spec"]["template"]["spec"]["replicatedJobs"]:
                yield job["template"]["spec"]["template"]["spec"]


def container_env(pod):
    (container,) = pod["containers"]
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def job_env(objects):
    """The trainer container's env: the PyTorchJob's container, or the TrainJob's spec.trainer.env."""
    for obj in objects:
        if obj["kind"] == "TrainJob":
            return {e["name"]: e.get("value") for e in obj["spec"]["trainer"]["env"]}
    return container_env(next(pods(objects)))


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize(
    ("setting", "grace", "timeout"),
    [
        ("", 150, "120"),
        ("train.checkpoint.on_stop=5m", 330, "300"),
        ("train.checkpoint.on_stop=false", None, None),
    ],
)
def test_on_stop_sets_the_grace_period_and_torchruns_shutdown_timeout(tmp_path, api, setting, grace, timeout):
    objects = render.render(load(BASE + "nodes: 2\n", tmp_path, *([setting] if setting else [])), api=api)
    found = list(pods(objects))
    assert found
    for pod in found:
        assert pod.get("terminationGracePeriodSeconds") == grace
    assert job_env(objects).get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") == timeout
    assert objects_errors(objects) == []


def test_a_command_job_keeps_kubernetes_default_grace(tmp_path):
    text = "name: demo\nimage: example.com/trainer:1\ncommand: [python, train.py]\n"
    objects = render.render(load(text, tmp_path))
    for pod in pods(objects):
        assert "terminationGracePeriodSeconds" not in pod
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in job_env(objects)


def test_a_platform_runtime_gets_the_timeout_but_no_grace_in_its_patch(tmp_path):
    """Trainer v2.2's runtimePatches have no terminationGracePeriodSeconds (v2.3 adds it): the named runtime's
    pod template decides the grace period; torchrun's timeout travels in trainer.env, which every version has."""
    text = BASE + "api: trainjob\nruntime: torch-distributed\nmetrics: {enabled: false}\n"
    (trainjob,) = [o for o in render.render(load(text, tmp_path)) if o["kind"] == "TrainJob"]
    (patch,) = trainjob["spec"]["runtimePatches"]
    assert "terminationGracePeriodSeconds" not in str(patch)
    env = {e["name"]: e.get("value") for e in trainjob["spec"]["trainer"]["env"]}
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "120"


@pytest.mark.parametrize("value", ["true", "0s", "soon"])
def test_on_stop_takes_a_duration_or_false(tmp_path, value):
    with pytest.raises(SpecError, match="train.checkpoint.on_stop"):
        load(BASE, tmp_path, f"train.checkpoint.on_stop={value}")
