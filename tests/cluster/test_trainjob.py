"""A job's life as a Kubeflow Trainer v2 TrainJob, on an emulated cluster that serves only the Trainer v2 CRDs
(TrainJob, TrainingRuntime, ClusterTrainingRuntime, JobSet) and PodMonitor. The test plays the trainer, JobSet
and Job controllers and the kubelet (tests/fakes/trainer.py); orch is the real CLI over real HTTP."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from orchestrator import cluster, loading, render
from tests.cluster.test_follow import Follower
from tests.fakes.cli import FAST, Env, write_kubeconfig
from tests.fakes.emulator import (
    CONFIGMAPS,
    JOBSETS,
    PODMONITORS,
    PODS,
    TRAININGRUNTIMES,
    TRAINJOBS,
    serve,
)
from tests.fakes.trainer import TrainerV2

NS = "team-a"
REPO = Path(__file__).resolve().parents[2]


def trainjob_objects(job_file: Path) -> list[dict]:
    """The objects of the agreed TrainJob rendering (ConfigMap, a TrainingRuntime named like the job, the
    TrainJob, PodMonitor), built from today's rendering. Stand-in until `render(spec, api="trainjob")` lands."""
    objects = render.render(loading.load_job(str(job_file)))
    by_kind = {o["kind"]: o for o in objects}
    job = by_kind["PyTorchJob"]
    name = job["metadata"]["name"]
    replicas = job["spec"]["pytorchReplicaSpecs"]
    nodes = sum(r["replicas"] for r in replicas.values())
    template = copy.deepcopy(replicas["Master"]["template"])
    container = template["spec"]["containers"][0]
    container["name"] = "node"
    container["command"] = ["torchrun", "-m", "orchestrator.trainer", "--config", "/etc/orch/train.json"]
    container["ports"] = [p for p in container["ports"] if p["name"] == "metrics"]
    runtime = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {"name": name, "labels": job["metadata"]["labels"]},
        "spec": {
            "mlPolicy": {"numNodes": nodes, "torch": {"numProcPerNode": job["spec"]["nprocPerNode"]}},
            "template": {"spec": {"replicatedJobs": [{
                "name": "node",
                "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                    "spec": {"template": template},
                },
            }]}},
        },
    }  # fmt: skip
    trainjob = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": job["metadata"]["labels"]},
        "spec": {
            "runtimeRef": {"name": name, "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"},
            "trainer": {"numNodes": nodes},
        },
    }
    return [by_kind["ConfigMap"], runtime, trainjob, by_kind["PodMonitor"]]


@pytest.fixture
def v2(tmp_path):
    """A user of a cluster with only Kubeflow Trainer v2 (and the Prometheus operator) installed."""
    with serve(operator=False, trainer=True) as kube:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, contexts={"dev": NS}, current="dev")
        yield Env(kube, kubeconfig, tmp_path, {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), **FAST})


def submit(env: Env, job_file: Path) -> cluster.Submission:
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.vars.items():
            mp.setenv(key, value)
        target = cluster.connect(cluster.Target())
        return cluster.submit(target, trainjob_objects(job_file))


def test_submit_creates_runtime_first_and_everything_owned_by_the_trainjob(v2, job_file):
    result = submit(v2, job_file)
    kube = v2.kube
    # The trainer's webhook rejects a TrainJob whose TrainingRuntime does not exist yet: the runtime goes first.
    assert [r.data["kind"] for r in kube.requests("post")] == [
        "TrainingRuntime",
        "TrainJob",
        "ConfigMap",
        "PodMonitor",
    ]
    assert [o["kind"] for o in result.created] == ["TrainingRuntime", "TrainJob", "ConfigMap", "PodMonitor"]
    job = kube.get(TRAINJOBS, NS, "demo")
    owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "demo",
             "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    for resource, name in ((TRAININGRUNTIMES, "demo"), (CONFIGMAPS, "demo-config"), (PODMONITORS, "demo")):
        assert kube.get(resource, NS, name)["metadata"]["ownerReferences"] == [owner], resource
    # the runtime got its owner by a merge patch once the TrainJob's uid existed
    (patch,) = kube.requests("patch")
    assert patch.url.path == f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainingruntimes/demo"
    sent = {
        k: v for k, v in patch.data["metadata"].items() if k != "resourceVersion"
    }  # stamped by the emulator
    assert patch.data.keys() == {"metadata"} and sent == {"ownerReferences": [owner]}


def test_status_list_logs_wait_delete_follow_a_trainjob_to_the_end(v2, job_file):
    kube = v2.kube
    submit(v2, job_file)
    assert json.loads(v2.orch("status", "demo", "-o", "json").stdout)["phase"] == "Pending"

    trainer = TrainerV2(kube, NS, "demo")
    node0, node1, node2 = trainer.start()
    pod = kube.get(PODS, NS, node1)
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["PET_NNODES"]["value"] == "3" and env["PET_MASTER_ADDR"]["value"] == "demo-node-0-0.demo"
    assert (
        pod["metadata"]["labels"]["orch.dev/job"] == "demo"
    )  # orch's own label, from the runtime's template

    kube.put("v1/events", NS, {
        "metadata": {"name": "e1"}, "type": "Warning", "reason": "FailedCreate",
        "message": 'pods "demo-node-0-3" is forbidden: exceeded quota', "lastTimestamp": "2026-01-01T00:01:00Z",
        "involvedObject": {"kind": "Job", "name": "demo-node-0"},
    })  # fmt: skip
    kube.put("v1/events", NS, {
        "metadata": {"name": "e2"}, "type": "Warning", "reason": "Restarting", "lastTimestamp": "2026-01-01T00:02:00Z",
        "message": "jobset restarting", "involvedObject": {"kind": "JobSet", "name": "demo"},
    })  # fmt: skip
    state = json.loads(v2.orch("status", "demo", "-o", "json").stdout)
    assert (state["kind"], state["phase"], state["reason"]) == (
        "TrainJob",
        "Running",
        "JobsCreationSucceeded",
    )
    assert state["replicas"] == {"node": {"active": 1, "succeeded": 0, "failed": 0}}
    assert [(p["name"], p["role"], p["index"], p["phase"]) for p in state["pods"]] == [
        (node0, "node", 0, "Running"), (node1, "node", 1, "Running"), (node2, "node", 2, "Running"),
    ]  # fmt: skip
    assert [(e["object"], e["reason"]) for e in state["events"]] == [
        ("Job/demo-node-0", "FailedCreate"), ("JobSet/demo", "Restarting"),
    ]  # fmt: skip
    assert state["restarts"] == 0
    table = v2.orch("status", "demo").stdout
    assert "Kind:        TrainJob" in table and "Phase:       Running (JobsCreationSucceeded)" in table

    header, row = v2.orch("list").stdout.splitlines()
    assert header.split() == ["NAME", "KIND", "PHASE", "AGE", "NODES", "x", "GPUS"]
    assert row.split()[:3] == ["demo", "TrainJob", "Running"] and row.split()[4:] == ["3", "x", "0"]

    kube.write_log(NS, node0, "step 1 loss 2.30")
    kube.write_log(NS, node1, "rank 2 ready")
    kube.write_log(NS, node2, "rank 4 ready")
    assert v2.orch("logs", "demo").stdout.splitlines() == [
        "[node-0] step 1 loss 2.30", "[node-1] rank 2 ready", "[node-2] rank 4 ready",
    ]  # fmt: skip
    assert v2.orch("logs", "demo", "--rank", "2").stdout.splitlines() == ["[node-2] rank 4 ready"]

    kube.write_log(NS, node0, "training done")
    trainer.finish()
    waited = v2.orch("wait", "demo", "--timeout", "30s")
    assert waited.exit_code == 0, waited.stderr
    assert waited.stderr.splitlines() == ["demo: Succeeded", "job demo succeeded"]
    assert json.loads(v2.orch("list", "-o", "json").stdout)[0]["phase"] == "Succeeded"

    deleted = v2.orch("delete", "demo", "--wait")
    assert deleted.exit_code == 0, deleted.stderr
    assert deleted.stdout.strip() == "trainjob.trainer.kubeflow.org/demo deleted"
    # The (emulated) garbage collector removed everything that came with the job, by its ownerReferences.
    for resource in (TRAINJOBS, TRAININGRUNTIMES, CONFIGMAPS, PODMONITORS, JOBSETS, PODS):
        assert kube.names(resource, NS) == [], resource
    missing = v2.orch("status", "demo")
    assert missing.exit_code == 1
    assert missing.stderr.strip() == (
        'error: job demo not found in namespace "team-a" (no pytorchjobs.kubeflow.org or '
        "trainjobs.trainer.kubeflow.org of that name)"
    )


def test_wait_failed_and_timeout(v2, job_file):
    submit(v2, job_file)
    trainer = TrainerV2(v2.kube, NS, "demo")
    trainer.start()
    timed_out = v2.orch("wait", "demo", "--timeout", "1s")
    assert timed_out.exit_code == 124
    trainer.finish(succeeded=False)
    failed = v2.orch("wait", "demo")
    assert failed.exit_code == 1
    assert failed.stderr.splitlines()[-1] == (
        "job demo failed: FailedJobs: jobset failed due to one or more job failures"
    )


def test_jobset_restart_is_followed_by_logs_and_counted_by_status(v2, job_file):
    """restart.policy job on a TrainJob: JobSet deletes every pod and creates them anew (played here)."""
    kube = v2.kube
    submit(v2, job_file)
    trainer = TrainerV2(kube, NS, "demo")
    first = trainer.start()
    kube.write_log(NS, first[0], "attempt 1 step 5")
    follower = Follower(v2, "logs", "demo", "-f")
    follower.expect("[node-0] attempt 1 step 5")

    kube.write_log(NS, first[1], "NCCL error: remote process exited")
    second = trainer.restart()
    assert set(second).isdisjoint(first)
    state = json.loads(v2.orch("status", "demo", "-o", "json").stdout)
    assert state["restarts"] == 1 and [p["name"] for p in state["pods"]] == second
    assert "Restarts:    1" in v2.orch("status", "demo").stdout
    kube.write_log(NS, second[0], "attempt 2 resumed from checkpoint step 5")
    kube.write_log(NS, second[2], "attempt 2 rank 4 ready")
    follower.expect(
        "[node-1] NCCL error: remote process exited",
        "[node-0] attempt 2 resumed from checkpoint step 5",
        "[node-2] attempt 2 rank 4 ready",
    )
    trainer.finish()
    code, stderr = follower.finish()
    assert code == 0, stderr
    assert "job demo restarted: every pod was recreated (restart 1)" in stderr
    assert follower.seen.count("[node-0] attempt 1 step 5") == 1  # nothing shown twice
