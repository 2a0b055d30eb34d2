"""manifests/rbac.yaml grants every API call orch makes, and nothing orch does not use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import require_tool
from tests.fakes.cli import FAST, Env, write_kubeconfig
from tests.fakes.emulator import (
    CONFIGMAPS,
    JOBS,
    PODMONITORS,
    TRAININGRUNTIMES,
    TRAINJOBS,
    rbac_attributes,
    serve,
)
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


@pytest.fixture
def both(tmp_path):
    """A cluster that serves both job APIs, to a user bound to manifests/rbac.yaml's Role (and nothing else:
    the emulator refuses every other call with the authorizer's 403)."""
    with serve(operator=True, trainer=True, kueue="v1beta2", volcano=True) as kube:
        kube.enforce_role(rbac_rules())
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, contexts={"dev": NS}, current="dev")
        yield Env(kube, kubeconfig, tmp_path, {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), **FAST})


def ok(user: Env, *args: str, code: int = 0, env: dict[str, str] | None = None) -> None:
    result = user.orch(*args, env=env)
    assert result.exit_code == code, (args, result.output)
    assert "forbidden" not in result.output, (args, result.output)


def pytorchjob_life(env: Env, job_file: Path) -> None:
    kube = env.kube
    job = ("--api", "pytorchjob")
    ok(env, "submit", str(job_file), *job, "--dry-run", "server")
    ok(env, "submit", str(job_file), *job)
    kube.set_conditions(NS, "demo", ("Created", "True"), ("Running", "True"))
    master = kube.add_pod(NS, "demo", "master", 0)
    kube.write_log(NS, master, "hello")
    for args in (("status", "demo"), ("list",), ("logs", "demo"), ("logs", "demo", "--rank", "0")):
        ok(env, *args)
    ok(env, "stacks", "demo", code=1)  # no output.url: each pod's kubectl exec, no exec made by orch
    kube.end_log(NS, master)
    kube.set_conditions(NS, "demo", ("Succeeded", "True"))
    ok(env, "logs", "demo", "-f")
    ok(env, "wait", "demo")
    ok(env, "submit", str(job_file), *job, "--replace", "--dry-run", "server")
    ok(env, "submit", str(job_file), *job, "--replace")
    ok(env, "delete", "demo", "--wait")
    ok(env, "submit", str(job_file), *job)
    ok(env, "delete", "demo")
    kube.fail(
        "post", f"/apis/monitoring.coreos.com/v1/namespaces/{NS}/podmonitors", 500, times=4
    )  # 1 + 3 retries
    ok(env, "submit", str(job_file), *job, code=1)
    assert kube.names(JOBS) == [] and kube.names(CONFIGMAPS) == []
    # creates whose answers never come: the ConfigMap's retry meets it (get), the PodMonitor is rolled back
    kube.clear_faults()
    kube.hang("post", f"/api/v1/namespaces/{NS}/configmaps", after=True)
    kube.hang("post", f"/apis/monitoring.coreos.com/v1/namespaces/{NS}/podmonitors", after=True)
    kube.hang("post", f"/apis/monitoring.coreos.com/v1/namespaces/{NS}/podmonitors", times=100)  # its retries
    slow = {"ORCH_API_READ_TIMEOUT": "2"}  # the PodMonitor: 1 + ORCH_API_RETRIES attempts, then rolled back
    ok(env, "submit", str(job_file), *job, env=slow, code=1)
    assert kube.names(JOBS) == [] and kube.names(CONFIGMAPS) == [] and kube.names(PODMONITORS) == []
    kube.clear_faults()


def trainjob_life(env: Env, job_file: Path) -> None:
    kube = env.kube
    job = ("--api", "trainjob")
    ok(env, "submit", str(job_file), *job, "--dry-run", "server")
    ok(env, "submit", str(job_file), *job)
    trainer = TrainerV2(kube, NS, "demo")
    (node,) = trainer.start()[:1]
    kube.write_log(NS, node, "hello")
    for args in (("status", "demo"), ("list",), ("logs", "demo"), ("logs", "demo", "--rank", "0")):
        ok(env, *args)
    ok(env, "stacks", "demo", code=1)
    trainer.finish()
    ok(env, "logs", "demo", "-f")
    ok(env, "wait", "demo")
    ok(env, "submit", str(job_file), *job, "--replace", "--dry-run", "server")
    # deletes the old TrainJob, waits for it and for its TrainingRuntime (get), creates the new ones
    ok(env, "submit", str(job_file), *job, "--replace")
    ok(env, "delete", "demo", "--wait")
    assert kube.names(TRAINJOBS) == [] and kube.names(TRAININGRUNTIMES) == []
    kube.fail("post", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs", 500, times=10)
    ok(env, "submit", str(job_file), *job, code=1)
    assert kube.names(TRAINJOBS) == [] and kube.names(TRAININGRUNTIMES) == []
    kube.clear_faults()
    # the runtime's create is stored but its answer lost: the retry meets it (get) and the submit goes on
    kube.hang("post", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainingruntimes", after=True)
    ok(env, "submit", str(job_file), *job, env={"ORCH_API_READ_TIMEOUT": "2"})
    ok(env, "delete", "demo", "--wait")
    kube.clear_faults()


def waiting_life(env: Env, job_file: Path) -> None:
    """`orch status` of jobs that wait: a Kueue-queued one (Workload, LocalQueue), a Volcano gang (PodGroup)."""
    for api, scheduling in (
        ("pytorchjob", "scheduling.queue=q"),
        ("trainjob", "scheduling.scheduler=volcano"),
    ):
        ok(env, "submit", str(job_file), "--api", api, "--set", scheduling)
        if api == "trainjob":
            TrainerV2(env.kube, NS, "demo").start(running=False)
        ok(env, "status", "demo")
        ok(env, "delete", "demo", "--wait")


def test_every_command_of_both_apis_runs_under_the_role_and_the_role_grants_nothing_more(both, job_file):
    pytorchjob_life(both, job_file)
    trainjob_life(both, job_file)
    waiting_life(both, job_file)
    used = {a for a in map(rbac_attributes, both.kube.requests()) if a is not None}
    granted = rbac_rules()
    assert used - granted == set()  # (the emulator refused those: a command above would have failed)
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


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_delete_after_render_and_kubectl_apply_removes_what_was_applied_and_nothing_else(both, job_file, api):
    """`orch render | kubectl apply` creates the objects without ownerReferences: no garbage collector takes
    them with the job, so `orch delete` finds them by the job's label (under the Role, list)."""
    kubectl = require_tool("kubectl")
    environment = {**os.environ, **both.vars}
    orch = os.path.join(os.path.dirname(sys.executable), "orch")

    def apply(name: str) -> None:
        rendered = subprocess.run(
            [orch, "render", str(job_file), "--api", api, "--set", f"name={name}"],
            capture_output=True, text=True, env=environment, timeout=60, check=True,
        )  # fmt: skip
        applied = subprocess.run(
            [kubectl, "apply", "--validate=false", "-f", "-"],
            input=rendered.stdout, capture_output=True, text=True, env=environment, timeout=60,
        )  # fmt: skip
        assert applied.returncode == 0, applied.stderr

    apply("demo")
    apply("other")  # another job: its objects must stay
    runtimes = ["demo", "other"] if api == "trainjob" else []
    assert both.kube.names(TRAININGRUNTIMES) == runtimes
    assert both.kube.names(CONFIGMAPS) == ["demo-config", "other-config"]
    # a ConfigMap of the user's that carries the job's label but is not orch's rendering of it
    both.kube.put(CONFIGMAPS, NS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "mine", "labels": {"orch.dev/job": "demo", "app.kubernetes.io/managed-by": "orch"},
        "annotations": {"orch.dev/submission": "someone-else"}}})  # fmt: skip
    deleted = both.orch("delete", "demo", "--wait")
    assert deleted.exit_code == 0, deleted.output
    assert both.kube.names(CONFIGMAPS) == ["mine", "other-config"]
    assert both.kube.names(PODMONITORS) == ["other"]
    assert both.kube.names(TRAININGRUNTIMES) == runtimes[1:]
    assert both.kube.names(TRAINJOBS) + both.kube.names(JOBS) == ["other"]
    kind = {"pytorchjob": "pytorchjob.kubeflow.org", "trainjob": "trainjob.trainer.kubeflow.org"}[api]
    lines = deleted.stdout.splitlines()
    assert lines[0] == f"{kind}/demo deleted"
    assert sorted(lines[1:]) == sorted(
        ["configmap/demo-config deleted", "podmonitor.monitoring.coreos.com/demo deleted"]
        + (["trainingruntime.trainer.kubeflow.org/demo deleted"] if api == "trainjob" else [])
    )
