"""Suspected nodes on an emulated cluster: what a pod's launcher records in its termination message reaches
`orch status` (table and -o json) and the Python API, and `orch submit --replace` keeps the new job off those
nodes, on both APIs.

The records are made by the launcher's own code (launch.classify over the trainer's pre-flight verdict, or over
a rank's CUDA error; hardware.encode), and the test plays the kubelet, which copies the container's
termination-message file into `state.terminated.message` when the container exits (kubernetes
pkg/kubelet/kuberuntime/kuberuntime_container.go getTerminationMessage: the file's last 4096 bytes), and the
operators, which create the pods (tests/fakes/kube.py for the v1 operator, tests/fakes/trainer.py for Trainer
v2). orch is the real CLI over real HTTP to the emulator."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from orchestrator import api, hardware, launch
from orchestrator.trainer import preflight
from tests.fakes.cli import FAST, Env, write_kubeconfig
from tests.fakes.emulator import JOBS, PODS, TRAININGRUNTIMES, serve
from tests.fakes.trainer import NODE, TrainerV2

NS = "team-a"
GPU = "GPU-5e1a0c1e-0000-4000-8000-000000000009"
NOT_IN = {"key": "kubernetes.io/hostname", "operator": "NotIn"}


@pytest.fixture
def v2(tmp_path):
    """A user of a cluster with only Kubeflow Trainer v2 installed (as tests/cluster/test_trainjob.py's)."""
    with serve(operator=False, trainer=True) as kube:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, contexts={"dev": NS}, current="dev")
        yield Env(kube, kubeconfig, tmp_path, {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), **FAST})


def terminated(kube, pod: str, container: str, exit_code: int, message: str) -> None:
    """The kubelet: the container exited; its termination message is the file's content."""
    kube.patch(PODS, NS, pod, {"status": {"phase": "Failed", "containerStatuses": [{
        "name": container, "restartCount": 0, "lastState": {},
        "state": {"terminated": {"exitCode": exit_code, "reason": "Error", "message": message}},
    }]}})  # fmt: skip


def preflight_record(tmp_path: Path) -> str:
    """What every pod's launcher writes when the pre-flight check found rank 9 (node rank 1, the pod
    demo-worker-0) far slower: the trainer's verdict in OUT/preflight.json, classified by the launcher."""
    out = tmp_path / "out"
    slow = preflight.Identity(9, 1, 1, "demo-worker-0", "cuda:1", GPU)
    reports = [preflight.Report(preflight.Identity(r, r // 8, r % 8, f"h{r}", f"cuda:{r % 8}"), {"matmul": 0.004})
               for r in range(24) if r != 9] + [preflight.Report(slow, {"matmul": 0.02})]  # fmt: skip
    preflight.write(preflight.judge(reports, [], max_slowdown=1.5, timeout=120), out)
    failed = {0: types.SimpleNamespace(exitcode=hardware.EXIT_CODE, local_rank=0, message="")}
    return hardware.encode(launch.classify(failed, hardware.EXIT_CODE, out))


def affinity_terms(pod_template: dict) -> list[dict]:
    affinity = pod_template["spec"]["affinity"]["nodeAffinity"]
    return affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


def test_a_failed_preflight_names_the_node_in_status_and_replace_keeps_the_new_job_off_it(
    env, job_file, tmp_path, monkeypatch
):
    kube = env.kube
    assert env.orch("submit", str(job_file)).exit_code == 0
    # the v1 operator's pods of a 3-node job, each on its own node
    for role, index, node in (
        ("master", 0, "gpu-node-1"),
        ("worker", 0, "gpu-node-2"),
        ("worker", 1, "gpu-node-3"),
    ):
        kube.add_pod(NS, "demo", role, index, node=node)
    record = preflight_record(tmp_path)
    for pod in ("demo-master-0", "demo-worker-0"):  # worker-1's container is still running
        terminated(kube, pod, "pytorch", hardware.EXIT_CODE, record)

    shown = env.orch("status", "demo", "-o", "json")
    assert shown.exit_code == 0, shown.stderr
    (suspect,) = json.loads(shown.stdout)["suspected_nodes"]  # named by two pods, listed once
    assert suspect == {
        "node": "gpu-node-2", "pod": "demo-worker-0", "rank": 9, "node_rank": 1, "gpu": f"cuda:1 {GPU}",
        "reason": "far slower: matmul 0.02 s, 5.0x the other ranks' median 0.004 s "
                  "(train.preflight.max_slowdown 1.5)",
        "reported_by": suspect["reported_by"],
    }  # fmt: skip
    assert suspect["reported_by"] in ("demo-master-0", "demo-worker-0")
    table = env.orch("status", "demo").stdout
    assert "Suspected nodes (hardware; `orch submit --replace` keeps the next job off them):" in table
    assert "gpu-node-2   demo-worker-0   9      cuda:1 GPU-" in table
    for key, value in env.vars.items():
        monkeypatch.setenv(key, value)
    assert api.Client().suspected_nodes("demo") == ["gpu-node-2"]

    replaced = env.orch("submit", str(job_file), "--replace")
    assert replaced.exit_code == 0, replaced.stderr
    assert (
        "scheduling.exclude_nodes: + gpu-node-2 (suspected by the replaced job: orch status demo)\n"
        in replaced.stderr
    )
    replicas = kube.get(JOBS, NS, "demo")["spec"]["pytorchReplicaSpecs"]
    for replica in ("Master", "Worker"):
        assert affinity_terms(replicas[replica]["template"]) == [
            {"matchExpressions": [{**NOT_IN, "values": ["gpu-node-2"]}]}
        ]


def test_replace_of_a_job_without_suspects_says_nothing_of_nodes(env, job_file):
    assert env.orch("submit", str(job_file)).exit_code == 0
    env.kube.add_pod(NS, "demo", "master", 0)
    terminated(env.kube, "demo-master-0", "pytorch", 1, hardware.encode(hardware.Record(1, "permanent")))
    assert json.loads(env.orch("status", "demo", "-o", "json").stdout)["suspected_nodes"] == []
    replaced = env.orch("submit", str(job_file), "--replace")
    assert replaced.exit_code == 0 and "exclude_nodes" not in replaced.stderr
    assert (
        "affinity"
        not in env.kube.get(JOBS, NS, "demo")["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    )


def test_a_cuda_ecc_error_on_a_trainjob_pod_names_its_node_and_replace_adds_it_to_the_runtime(
    v2, job_file, tmp_path
):
    """A TrainJob's pods have JobSet's host names (spec.hostname <job>-node-0-<index>), not their pod names."""
    job_file.write_text(job_file.read_text() + "scheduling: {exclude_nodes: [gpu-node-9]}\n")
    assert v2.orch("submit", str(job_file)).exit_code == 0
    trainer = TrainerV2(v2.kube, NS, "demo")
    pods = trainer.start()  # on gpu-node-1, -2, -3
    error = "torch.AcceleratorError: CUDA error: uncorrectable ECC error encountered\nSearch for `cudaErrorECCUncorrectable'"
    failed = {5: types.SimpleNamespace(exitcode=1, local_rank=1, message=error)}
    record = launch.classify(failed, 1, tmp_path, host="demo-node-0-1")  # the pod's launcher, on node rank 1
    assert record.exit_code == hardware.EXIT_CODE  # retryable: the next pod may land elsewhere
    terminated(v2.kube, pods[1], NODE, record.exit_code, hardware.encode(record))

    (suspect,) = json.loads(v2.orch("status", "demo", "-o", "json").stdout)["suspected_nodes"]
    assert (suspect["node"], suspect["pod"], suspect["rank"], suspect["gpu"]) == (
        "gpu-node-2",
        pods[1],
        5,
        "cuda:1",
    )
    assert suspect["reason"] == (
        "uncorrectable ECC error: torch.AcceleratorError: CUDA error: uncorrectable ECC error encountered"
    )

    replaced = v2.orch("submit", str(job_file), "--replace")
    assert replaced.exit_code == 0, replaced.stderr
    assert "scheduling.exclude_nodes: + gpu-node-2 (suspected by" in replaced.stderr
    (rjob,) = v2.kube.get(TRAININGRUNTIMES, NS, "demo")["spec"]["template"]["spec"]["replicatedJobs"]
    assert affinity_terms(rjob["template"]["spec"]["template"]) == [
        {"matchExpressions": [{**NOT_IN, "values": ["gpu-node-9", "gpu-node-2"]}]}  # the job's own first
    ]


@pytest.mark.parametrize(
    "message",
    ["", "OOMKilled", '{"orch": 1, "suspects": "x"}', '{"orch": 2, "suspects": []}', "{" * 5000, None, 7],
)
def test_a_termination_message_that_is_not_orchs_record_names_no_node(message):
    assert hardware.read_record(message) in (None, hardware.Record(-1, "", ()))
