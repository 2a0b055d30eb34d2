"""manifests/rbac.yaml grants every API call orch makes, and nothing orch does not use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from orchestrator import cluster
from tests.cluster.test_trainjob import submit as submit_trainjob
from tests.fakes.cli import FAST, Env, write_kubeconfig
from tests.fakes.emulator import CONFIGMAPS, JOBS, PODMONITORS, TRAININGRUNTIMES, TRAINJOBS, serve
from tests.fakes.trainer import TrainerV2

ROOT = Path(__file__).resolve().parents[2]
NS = "team-a"


def rbac_rules() -> set[tuple[str, str, str]]:
    role = next(
        d for d in yaml.safe_load_all((ROOT / "manifests" / "rbac.yaml").read_text()) if d["kind"] == "Role"
    )
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def rbac_attributes(request) -> tuple[str, str, str] | None:
    """The (apiGroup, resource, verb) the API server's authorizer checks for a request; None for discovery."""
    path = request.url.path.rstrip("/")
    match = re.fullmatch(r"/api/v1/namespaces/[^/]+/([^/]+)(?:/([^/]+))?(?:/([^/]+))?", path) or re.fullmatch(
        r"/apis/([^/]+)/[^/]+/namespaces/[^/]+/([^/]+)(?:/([^/]+))?(?:/([^/]+))?", path
    )
    if match is None:
        assert re.fullmatch(r"/api(/v1)?|/apis(/[^/]+){0,2}|/version", path), f"unexpected call {path}"
        return None
    if path.startswith("/api/"):
        group, (resource, name, sub) = "", match.groups()
    else:
        group, resource, name, sub = match.groups()
    verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}.get(request.method.value)
    if verb is None:
        verb = "get" if name else ("watch" if request.params.get("watch") == "true" else "list")
    return group, f"{resource}/{sub}" if sub else resource, verb


@pytest.fixture
def both(tmp_path):
    """A cluster that serves both job APIs."""
    with serve(operator=True, trainer=True) as kube:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, contexts={"dev": NS}, current="dev")
        yield Env(kube, kubeconfig, tmp_path, {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), **FAST})


def test_the_role_covers_every_call_and_only_those(both, job_file):
    env = both
    kube = env.kube
    # A whole life of each API: submit, status, list, logs, wait, replace, delete, a submit that rolls back.
    assert env.orch("submit", str(job_file)).exit_code == 0
    kube.set_conditions(NS, "demo", ("Created", "True"), ("Running", "True"))
    master = kube.add_pod(NS, "demo", "master", 0)
    kube.write_log(NS, master, "hello")
    assert env.orch("status", "demo").exit_code == 0
    assert env.orch("list").exit_code == 0
    assert env.orch("logs", "demo").exit_code == 0
    kube.end_log(NS, master)
    kube.set_conditions(NS, "demo", ("Succeeded", "True"))
    assert env.orch("logs", "demo", "-f").exit_code == 0
    assert env.orch("wait", "demo").exit_code == 0
    assert env.orch("submit", str(job_file), "--replace").exit_code == 0
    assert env.orch("delete", "demo", "--wait").exit_code == 0
    kube.fail(
        "post", "/apis/monitoring.coreos.com/v1/namespaces/team-a/podmonitors", 500, times=4
    )  # 1 + 3 retries
    assert env.orch("submit", str(job_file)).exit_code == 1
    assert kube.names(JOBS) == [] and kube.names(CONFIGMAPS) == []
    # creates whose answers never come: the ConfigMap's retry meets it (get), the PodMonitor is rolled back
    kube.clear_faults()
    kube.hang("post", "/api/v1/namespaces/team-a/configmaps", after=True)
    kube.hang("post", "/apis/monitoring.coreos.com/v1/namespaces/team-a/podmonitors", after=True)
    kube.hang(
        "post", "/apis/monitoring.coreos.com/v1/namespaces/team-a/podmonitors", times=100
    )  # its retries
    slow = {"ORCH_API_READ_TIMEOUT": "2"}  # the PodMonitor: 1 + ORCH_API_RETRIES attempts, then rolled back
    assert env.orch("submit", str(job_file), env=slow).exit_code == 1
    assert kube.names(JOBS) == [] and kube.names(CONFIGMAPS) == [] and kube.names(PODMONITORS) == []
    kube.clear_faults()

    submit_trainjob(env, job_file)
    trainer = TrainerV2(kube, NS, "demo")
    (node,) = trainer.start()[:1]
    kube.write_log(NS, node, "hello")
    for args in (("status", "demo"), ("list",), ("logs", "demo")):
        assert env.orch(*args).exit_code == 0, args
    trainer.finish()
    assert env.orch("logs", "demo", "-f").exit_code == 0
    assert env.orch("wait", "demo").exit_code == 0
    assert env.orch("delete", "demo", "--wait").exit_code == 0
    kube.fail("post", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs", 500, times=10)
    with pytest.raises(
        cluster.ClusterError, match="rolled back: deleted trainingruntime.trainer.kubeflow.org/demo"
    ):
        submit_trainjob(env, job_file)
    assert kube.names(TRAINJOBS) == [] and kube.names(TRAININGRUNTIMES) == []

    used = {a for a in map(rbac_attributes, kube.requests()) if a is not None}
    granted = rbac_rules()
    assert used - granted == set(), "orch makes calls manifests/rbac.yaml does not allow"
    # everything granted is used, except what only admission plugins check (blockOwnerDeletion)
    assert granted - used == {
        ("kubeflow.org", "pytorchjobs/finalizers", "update"),
        ("trainer.kubeflow.org", "trainjobs/finalizers", "update"),
    }


def test_rolebinding_points_at_the_role():
    docs = list(yaml.safe_load_all((ROOT / "manifests" / "rbac.yaml").read_text()))
    role, binding = (next(d for d in docs if d["kind"] == k) for k in ("Role", "RoleBinding"))
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert "namespace" not in role["metadata"]  # applied with -n into the user's namespace
