"""`orch doctor --cluster` against the Kubernetes API emulator (tests/fakes/), over real HTTP
with the official client. The emulator has no authorizer, so the test answers the
SelfSubjectAccessReview as the API server would; discovery, nodes and 403s are the emulator's own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("kmock")

from orchestrator import doctor  # noqa: E402
from orchestrator.doctor import FAIL, OK, WARN  # noqa: E402
from tests.fakes.cli import write_kubeconfig  # noqa: E402
from tests.fakes.emulator import CLUSTERTRAININGRUNTIMES, TRAINJOBS, kmock, serve  # noqa: E402
from tests.fakes.kube import Kube  # noqa: E402
from tests.fakes.trainer import trainjob_crd  # noqa: E402

ORCH = str(Path(sys.executable).with_name("orch"))
NODES = "v1/nodes"
SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def gpu_node(name: str, gpus: int, product: str | None) -> dict:
    labels = {"nvidia.com/gpu.product": product} if product else {}
    allocatable = {"cpu": "64", "memory": "512Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": allocatable}}  # fmt: skip


def prepare(kube: Kube, *, nodes: list[dict], allowed: bool | None) -> None:
    def setup() -> None:
        k = kube.emulator
        k.resources[NODES] = kmock.ResourceInfo(kind="Node", namespaced=False, verbs={"list", "get"})
        k.resources["monitoring.coreos.com/v1/prometheusrules"] = kmock.ResourceInfo(
            kind="PrometheusRule", namespaced=True, verbs={"create"}
        )
        for node in nodes:
            k.objects[NODES, None, node["metadata"]["name"]] = node
        if allowed is not None:
            review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                      "status": {"allowed": allowed, **({} if allowed else {"reason": "no RBAC rule"})}}  # fmt: skip
            k[f"post {SSAR_PATH}"] << review

    kube._on_loop(setup)


def run(kube: Kube, tmp_path: Path) -> dict[str, doctor.Check]:
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", kube.url, contexts={"dev": "team-a"}, current="dev"
    )
    return {c.name: c for c in doctor.cluster_checks(kubeconfig=str(kubeconfig))}


def test_healthy_cluster(tmp_path: Path) -> None:
    with serve() as kube:
        prepare(kube, nodes=[gpu_node("gpu-1", 8, "NVIDIA-H200"), gpu_node("gpu-2", 8, "NVIDIA-H200"),
                             gpu_node("cpu-1", 0, None)], allowed=True)  # fmt: skip
        checks = run(kube, tmp_path)
        review = kube.requests("post", SSAR_PATH)[0].data
    assert {name: c.status for name, c in checks.items()} == {
        "cluster": OK, "PyTorchJob CRD": OK, "TrainJob CRD": OK, "Kueue": OK, "Prometheus Operator CRDs": OK,
        "GPU nodes": OK, "permissions (PyTorchJob)": OK,
    }  # fmt: skip
    assert checks["PyTorchJob CRD"].detail == "kubeflow.org v1 (Kubeflow training operator)"
    assert checks["TrainJob CRD"].detail == (
        "trainjobs.trainer.kubeflow.org is not installed; `api: auto` submits to pytorchjob"
    )
    assert checks["Kueue"].detail == "not installed (only `scheduling.queue` needs it)"
    assert checks["Prometheus Operator CRDs"].detail == "podmonitors, prometheusrules"
    assert checks["GPU nodes"].detail == "2 node(s): 16 x NVIDIA-H200"
    assert checks["permissions (PyTorchJob)"].detail == "may create pytorchjobs in namespace team-a"
    assert review["spec"]["resourceAttributes"] == {
        "group": "kubeflow.org", "resource": "pytorchjobs", "verb": "create", "namespace": "team-a",
    }  # fmt: skip


def test_missing_job_apis_and_gpus(tmp_path: Path) -> None:
    with serve(operator=False, prometheus_operator=False) as kube:
        prepare(kube, nodes=[gpu_node("cpu-1", 0, None)], allowed=False)
        checks = run(kube, tmp_path)
    crd = checks["PyTorchJob CRD"]
    assert (crd.status, crd.detail) == (FAIL, "pytorchjobs.kubeflow.org is not installed")
    assert "training-operator" in crd.fix
    v2 = checks["TrainJob CRD"]
    assert (v2.status, v2.detail) == (FAIL, "trainjobs.trainer.kubeflow.org is not installed")
    assert "helm install kubeflow-trainer" in v2.fix
    assert checks["Prometheus Operator CRDs"].status == WARN
    assert checks["GPU nodes"].status == FAIL
    assert checks["GPU nodes"].detail == "none of 1 node(s) has nvidia.com/gpu allocatable"
    assert not any(name.startswith("permissions") for name in checks)  # no job API to be allowed to use


def test_missing_rights(tmp_path: Path) -> None:
    with serve() as kube:
        prepare(kube, nodes=[gpu_node("gpu-1", 8, None)], allowed=False)
        checks = run(kube, tmp_path)
    access = checks["permissions (PyTorchJob)"]
    assert access.status == FAIL
    assert access.detail == "you may not create pytorchjobs in namespace team-a (no RBAC rule)"


def test_trainer_v2_cluster(tmp_path: Path) -> None:
    """Only Kubeflow Trainer v2 (with JobSet and its default runtimes) and Kueue are installed."""
    with serve(operator=False, trainer=True) as kube:
        prepare(kube, nodes=[gpu_node("gpu-1", 8, "NVIDIA-H100-80GB-HBM3")], allowed=True)

        def install() -> None:
            kube.emulator.resources["kueue.x-k8s.io/v1beta1/localqueues"] = kmock.ResourceInfo(
                kind="LocalQueue", namespaced=True, verbs={"get", "list"}
            )
            for name in ("torch-distributed", "deepspeed-distributed"):
                kube.emulator.objects[CLUSTERTRAININGRUNTIMES, None, name] = {
                    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
                    "metadata": {"name": name},
                }  # fmt: skip

        kube._on_loop(install)
        checks = run(kube, tmp_path)
        review = kube.requests("post", SSAR_PATH)[0].data
    assert {name: c.status for name, c in checks.items()} == {
        "cluster": OK, "PyTorchJob CRD": OK, "TrainJob CRD": OK, "JobSet": OK, "training runtimes": OK,
        "Trainer features": OK, "Kueue": OK, "Prometheus Operator CRDs": OK, "GPU nodes": OK, "permissions (TrainJob)": OK,
    }  # fmt: skip
    assert checks["TrainJob CRD"].detail == "trainer.kubeflow.org v1alpha1 (Kubeflow Trainer v2)"
    assert checks["PyTorchJob CRD"].detail == (
        "pytorchjobs.kubeflow.org is not installed; `api: auto` submits to trainjob"
    )
    assert checks["JobSet"].detail == "jobset.x-k8s.io v1alpha2"
    assert checks["training runtimes"].detail == (
        "ClusterTrainingRuntimes: deepspeed-distributed, torch-distributed"
    )
    assert checks["Kueue"].detail == "kueue.x-k8s.io v1beta1"
    assert checks["permissions (TrainJob)"].detail == "may create trainjobs in namespace team-a"
    assert review["spec"]["resourceAttributes"]["resource"] == "trainjobs"
    assert checks["Trainer features"].detail.startswith("unknown: cannot read the TrainJob CRD")


@pytest.mark.parametrize(
    ("version", "status", "detail"),
    [
        ("v2.1", WARN, "TrainJob fields of Trainer v2.1: no deadline, no runtime: NAME"),
        ("v2.2", WARN, "TrainJob fields of Trainer v2.2: no terminationGracePeriodSeconds"),
        ("v2.3", OK, "TrainJob fields of Trainer v2.3: everything orch renders"),
    ],
)
def test_trainer_feature_level_from_the_crd_schema(
    tmp_path: Path, version: str, status: str, detail: str
) -> None:
    """Where the user may read the TrainJob CRD, its schema says which Trainer release is installed."""
    with serve(operator=False, trainer=True) as kube:
        prepare(kube, nodes=[gpu_node("gpu-1", 8, "NVIDIA-H100-80GB-HBM3")], allowed=True)
        kube.serve_crd(TRAINJOBS, trainjob_crd(version))
        checks = run(kube, tmp_path)
    assert checks["Trainer features"].status == status
    assert checks["Trainer features"].detail.startswith(detail)


def test_forbidden_node_list_is_a_warning(tmp_path: Path) -> None:
    with serve() as kube:
        prepare(kube, nodes=[], allowed=True)
        kube.fail("get", "/api/v1/nodes", 403, times=10, message='nodes is forbidden: User "x" cannot list')
        checks = run(kube, tmp_path)
    assert checks["GPU nodes"].status == WARN
    assert checks["GPU nodes"].detail == (
        'cannot tell: the cluster answered, but listing nodes was refused (RBAC): nodes is forbidden: User "x" '
        "cannot list"
    )
    assert "ClusterRole with `list` on nodes" in checks["GPU nodes"].fix


NODES_REFUSED = (
    'nodes is forbidden: User "tester" cannot list resource "nodes" in API group "" at the cluster scope'
)


def test_a_user_bound_to_the_role_only_gets_every_check(tmp_path: Path) -> None:
    """A user with manifests/rbac.yaml's Role and nothing else (the emulator's authorizer refuses the rest, with
    the API server's words): nodes are refused, the cluster was reached, and every other check is made."""
    from tests.cluster.test_rbac import rbac_rules

    with serve() as kube:
        prepare(kube, nodes=[gpu_node("gpu-1", 8, None)], allowed=True)
        kube.enforce_role(rbac_rules())
        checks = run(kube, tmp_path)
    assert {name: c.status for name, c in checks.items()} == {
        "cluster": OK, "PyTorchJob CRD": OK, "TrainJob CRD": OK, "Kueue": OK, "Prometheus Operator CRDs": OK,
        "GPU nodes": WARN, "permissions (PyTorchJob)": OK,
    }  # fmt: skip
    assert checks["GPU nodes"].detail == (
        f"cannot tell: the cluster answered, but listing nodes was refused (RBAC): {NODES_REFUSED}"
    )


@pytest.mark.parametrize(
    ("path", "status", "check", "detail"),
    [
        ("/api/v1/nodes", 404, "GPU nodes", "cannot tell: the cluster answered, but listing nodes is not served: "),
        ("/version/?", 403, "cluster", "(Kubernetes unknown: /version was refused (RBAC): "),
        ("/apis/?", 403, "job APIs", "cannot tell which the cluster serves: the cluster answered, but API "
                                     "discovery (/apis) was refused (RBAC): "),
    ],
)  # fmt: skip
def test_a_cluster_that_answers_with_a_refusal_was_reached(
    tmp_path: Path, path: str, status: int, check: str, detail: str
) -> None:
    """Before: any refusal but a 403 on nodes ended the checks with `cluster: not reachable`."""
    with serve() as kube:
        prepare(kube, nodes=[gpu_node("gpu-1", 8, None)], allowed=True)
        kube.fail("get", path, status, times=10, message="refused here")
        checks = run(kube, tmp_path)
    assert checks["cluster"].status == OK, checks["cluster"].detail
    said = checks[check].detail
    assert detail in said and said.rstrip(")").endswith("refused here"), said
    assert checks[check].status in (OK, WARN)
    assert "GPU nodes" in checks  # the other checks were made
    if check == "job APIs":
        assert checks["GPU nodes"].status == OK and not any(name.endswith("CRD") for name in checks)
    else:
        assert checks["PyTorchJob CRD"].status == OK


def test_rejected_credentials_are_not_unreachable(tmp_path: Path) -> None:
    with serve() as kube:
        kube.fail("get", "/version/?", 401, times=10, message="Unauthorized")
        checks = run(kube, tmp_path)
    assert [(c.name, c.status) for c in checks.values()] == [("cluster", FAIL)]
    assert checks["cluster"].detail.startswith("answered, but rejected the credentials: unauthorized")


def test_unreachable_cluster_is_one_fail_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_API_RETRIES", "0")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9", contexts={"dev": None},
                                  current="dev")  # fmt: skip
    checks = doctor.cluster_checks(kubeconfig=str(kubeconfig))
    assert [(c.name, c.status) for c in checks] == [("cluster", FAIL)]
    assert "cannot reach the Kubernetes API" in checks[0].detail


def test_doctor_cluster_command(tmp_path: Path) -> None:
    """The console script, so main() turns the FAIL into exit code 1 as for a user."""
    with serve(operator=False) as kube:
        prepare(kube, nodes=[gpu_node("gpu-1", 4, "NVIDIA-A100-SXM4-80GB")], allowed=True)
        kubeconfig = write_kubeconfig(tmp_path / "kc", kube.url, contexts={"dev": "ml"}, current="dev")
        result = subprocess.run([ORCH, "doctor", "--cluster", "--kubeconfig", str(kubeconfig)],
                                capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 1, result.stderr  # neither job API is installed
    assert "FAIL  PyTorchJob CRD" in result.stdout
    assert "fix: install the Kubeflow training operator: kubectl apply" in result.stdout
    assert (
        "FAIL  TrainJob CRD" in result.stdout
        and "fix: install the Kubeflow Trainer v2: helm install" in result.stdout
    )
    assert "OK    GPU nodes" in result.stdout and "4 x NVIDIA-A100-SXM4-80GB" in result.stdout
