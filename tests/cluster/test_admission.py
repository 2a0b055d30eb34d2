"""What a real API server and the controllers' webhooks say to a submit, told apart and answered right:
an admission webhook's denial is not an RBAC refusal (and the one that only means "my cache has not seen your
runtime yet" is retried); a field the cluster's CRD lacks is an error, not silently dropped; a refused
connection on the first request is one line at once. The webhooks and the strict decoding are played by the
emulator (tests/fakes/emulator.py `runtime_webhook`, `unknown_fields`)."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

from orchestrator import cluster
from orchestrator.kube.kinds import POD
from tests.cluster.test_trainjob import NS, submit
from tests.fakes.cli import FAST, Env, write_kubeconfig
from tests.fakes.emulator import TRAININGRUNTIMES, TRAINJOBS, runtime_webhook, serve
from tests.fakes.trainer import trainjob_crd


@pytest.fixture
def v2(tmp_path):
    with serve(operator=False, trainer=True) as kube:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, contexts={"dev": NS}, current="dev")
        yield Env(kube, kubeconfig, tmp_path, {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), **FAST})


@pytest.mark.parametrize("kueue", [False, True], ids=["trainer-webhook", "kueue-webhook"])
def test_a_webhook_whose_cache_lags_the_runtime_is_asked_again(v2, job_file, kueue):
    # The webhook learns of the runtime 0.6 s after its create; orch creates the TrainJob right after it.
    v2.kube.add_webhook(runtime_webhook(lag=0.6, kueue=kueue))
    v2.vars["ORCH_API_BACKOFF_SECONDS"] = "0.1"
    result = submit(v2, job_file)
    assert [o["kind"] for o in result.created] == ["TrainingRuntime", "TrainJob", "ConfigMap", "PodMonitor"]
    assert v2.kube.get(TRAINJOBS, NS, "demo") is not None
    denied = v2.kube.requests("post", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs")
    assert len(denied) > 1  # refused first, then admitted


def test_a_denial_that_lasts_says_the_webhooks_words_not_rbac(v2, job_file):
    v2.kube.add_webhook(runtime_webhook(lag=3600))
    result = v2.orch("submit", str(job_file), "--api", "trainjob", env={"ORCH_REQUEST_TIMEOUT": "2"})
    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        "error: the cluster's admission webhook validator.trainjob.trainer.kubeflow.org refused create "
        'trainjobs.trainer.kubeflow.org demo in namespace "team-a": spec.runtimeRef: Invalid value:'
    )
    assert "specified trainingRuntime must be created before the TrainJob is created" in line
    assert "rbac" not in line.lower() and "cluster admin" not in line
    assert "rolled back: deleted trainingruntime.trainer.kubeflow.org/demo" in line
    assert v2.kube.names(TRAINJOBS) == [] and v2.kube.names(TRAININGRUNTIMES) == []


def test_other_denials_are_not_retried_and_rbac_refusals_still_say_rbac(v2, job_file):
    v2.kube.fail(
        "post",
        f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs",
        403,
        message='admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: '
        "spec.trainer.env: Invalid value: PET_NNODES: must not have reserved envs",
    )
    result = v2.orch("submit", str(job_file), "--api", "trainjob")
    assert result.exit_code == 1
    assert "must not have reserved envs" in result.stderr and "rbac" not in result.stderr.lower()
    assert (
        len(v2.kube.requests("post", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs")) == 1
    )
    v2.kube.fail(
        "post",
        f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainingruntimes",
        403,
        message='trainingruntimes.trainer.kubeflow.org is forbidden: User "tester" cannot create resource '
        '"trainingruntimes" in API group "trainer.kubeflow.org" in the namespace "team-a"',
    )
    result = v2.orch("submit", str(job_file), "--api", "trainjob")
    assert result.exit_code == 1
    assert "manifests/rbac.yaml" in result.stderr


@pytest.mark.parametrize(
    ("served", "settings", "field", "since"),
    [
        ("v2.1", ["deadline=1h"], "spec.activeDeadlineSeconds", "v2.2"),
        ("v2.1", ["runtime=torch-distributed"], "spec.runtimePatches", "v2.2"),
        (
            "v2.2",
            ["runtime=torch-distributed", "pod_overrides.terminationGracePeriodSeconds=120"],
            "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template"
            ".spec.terminationGracePeriodSeconds",
            "v2.3",
        ),
    ],
)
def test_a_field_the_clusters_trainer_lacks_is_one_line_not_dropped(
    v2, tmp_path, served, settings, field, since
):
    v2.kube.serve_crd(TRAINJOBS, trainjob_crd(served))
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        "name: demo\nimage: registry.example/trainer:1\nnodes: 2\nmetrics: {enabled: false}\n"
        "train:\n  task: digits\n  batch_size: 96\n  max_steps: 10\n"
    )
    args = [a for setting in settings for a in ("--set", setting)]
    result = v2.orch("submit", str(job_file), "--api", "trainjob", *args)
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        f"error: this cluster's Trainer has no TrainJob field {field}: it came with Trainer {since}"
    )
    assert f"upgrade Trainer to {since} or later" in line
    assert v2.kube.names(TRAINJOBS) == []  # nothing half-done either
    assert v2.kube.names(TRAININGRUNTIMES) == []
    # Without fieldValidation=Strict the same API server would have stored the job without the field:
    sent = v2.kube.requests("post", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs")
    assert all(r.params.get("fieldValidation") == "Strict" for r in sent)


def test_every_create_is_strict_and_a_current_trainer_takes_the_job(v2, job_file):
    v2.kube.serve_crd(TRAINJOBS, trainjob_crd("v2.3"))
    result = v2.orch("submit", str(job_file), "--api", "trainjob", "--set", "deadline=1h")
    assert result.exit_code == 0, result.output
    assert v2.kube.get(TRAINJOBS, NS, "demo")["spec"]["activeDeadlineSeconds"] == 3600
    assert {r.params.get("fieldValidation") for r in v2.kube.requests("post")} == {"Strict"}


def test_the_emulator_drops_unknown_fields_without_strict(v2):
    """The failure the strict create prevents: the default (Warn) stores the job without the field."""
    v2.kube.serve_crd(TRAINJOBS, trainjob_crd("v2.1"))
    body = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "x"},
            "spec": {"runtimeRef": {"name": "r"}, "activeDeadlineSeconds": 60}}  # fmt: skip
    request = urllib.request.Request(
        f"{v2.kube.url}/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request) as answer:
        assert 'unknown field \\"spec.activeDeadlineSeconds\\"' in answer.headers["Warning"]
    assert "activeDeadlineSeconds" not in v2.kube.get(TRAINJOBS, NS, "x")["spec"]


def test_connection_refused_on_the_first_request_fails_at_once(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = write_kubeconfig(
        tmp_path / "dead", f"http://127.0.0.1:{port}", contexts={"d": None}, current="d"
    )
    env = Env(None, kubeconfig, tmp_path, {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)})  # type: ignore[arg-type]
    started = time.monotonic()
    result = env.orch("list")  # default retries and backoff: 5 retries, 0.5 s doubling (~17 s before)
    took = time.monotonic() - started
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: cannot reach the Kubernetes API at http://127.0.0.1:{port} (context d) after 1 attempt: "
        f"HTTPConnection(host='127.0.0.1', port={port}): Failed to establish a new connection: "
        "[Errno 111] Connection refused"
    )
    assert took < 5, took


def test_a_refusal_after_the_server_answered_is_retried(tmp_path):
    """An API server that answered and then refuses (it is restarting) is given the retries."""
    with pytest.MonkeyPatch.context() as mp:
        with serve() as kube:
            kubeconfig = write_kubeconfig(tmp_path / "k", kube.url, contexts={"dev": NS}, current="dev")
            for key, value in {"KUBECONFIG": str(kubeconfig), **FAST}.items():
                mp.setenv(key, value)
            target = cluster.connect(cluster.Target())
            target.list(POD)  # the server has answered once
        # stopped: its port now refuses connections
        with pytest.raises(cluster.ClusterUnreachable, match="after 4 attempts: .*Connection refused"):
            target.list(POD)
