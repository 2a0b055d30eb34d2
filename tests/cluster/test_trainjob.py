"""A job's life as a Kubeflow Trainer v2 TrainJob, on an emulated cluster that serves only the Trainer v2 CRDs
(TrainJob, TrainingRuntime, ClusterTrainingRuntime, JobSet) and PodMonitor. The test plays the trainer, JobSet
and Job controllers and the kubelet (tests/fakes/trainer.py); orch is the real CLI over real HTTP."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from orchestrator import cluster
from orchestrator.job import loading
from orchestrator.rendering import render
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
    """The job rendered as a TrainJob: ConfigMap, a TrainingRuntime named like the job, the TrainJob, PodMonitor."""
    return render.render(loading.load_job(str(job_file)), api="trainjob")


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
    for resource, name in ((CONFIGMAPS, "demo-config"), (PODMONITORS, "demo")):
        assert kube.get(resource, NS, name)["metadata"]["ownerReferences"] == [owner], resource
    # Trainer < v2.3 keeps a finalizer on a runtime in use: blocking the TrainJob's foreground deletion on it
    # would deadlock, so the runtime's reference does not block.
    owner["blockOwnerDeletion"] = False
    assert kube.get(TRAININGRUNTIMES, NS, "demo")["metadata"]["ownerReferences"] == [owner]
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
    assert (state["kind"], state["phase"], state["reason"]) == ("TrainJob", "Running", "JobsReady")
    assert state["replicas"] == {"node": {"active": 1, "succeeded": 0, "failed": 0}}
    assert [(p["name"], p["role"], p["index"], p["phase"]) for p in state["pods"]] == [
        (node0, "node", 0, "Running"), (node1, "node", 1, "Running"), (node2, "node", 2, "Running"),
    ]  # fmt: skip
    assert [(e["object"], e["reason"]) for e in state["events"]] == [
        ("Job/demo-node-0", "FailedCreate"), ("JobSet/demo", "Restarting"),
    ]  # fmt: skip
    assert state["restarts"] == 0
    table = v2.orch("status", "demo").stdout
    assert "Kind:        TrainJob" in table and "Phase:       Running (JobsReady)" in table

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


def test_jobset_restart_is_followed_by_logs_and_counted_by_status(v2, tmp_path):
    """restart.policy job (the default of a multi-node job) on a TrainJob: JobSet's failure policy deletes every
    pod and creates them anew (played here, within the rendered maxRestarts)."""
    kube = v2.kube
    job_file = tmp_path / "restartable.yaml"
    job_file.write_text("name: demo\nimage: registry.example/trainer:1\nnodes: 3\n"
                        "train: {task: digits, batch_size: 96, max_steps: 10}\n")  # fmt: skip
    submit(v2, job_file)
    runtime = kube.get(TRAININGRUNTIMES, NS, "demo")
    assert runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 3
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


# --- `orch submit` end to end: API discovery picks the API, render renders it ------------------------------


@pytest.mark.smoke  # the fast tier's end-to-end submit of a TrainJob
def test_submit_digits_on_a_trainer_v2_only_cluster_and_follow_it_to_the_end(v2):
    """The example job, unchanged, on a cluster with only Trainer v2: auto picks TrainJob; the rest follows."""
    from tests.spec.manifest_checks import cluster_errors

    kube, example = v2.kube, REPO / "examples" / "digits.yaml"
    result = v2.orch("submit", str(example))
    assert result.exit_code == 0, result.stderr
    assert "api: trainjob (the cluster serves TrainJob only)" in result.stderr
    assert "warning:" not in result.stderr  # one node: nothing to schedule partially, nothing to restart
    assert result.stdout.splitlines() == [
        "trainingruntime.trainer.kubeflow.org/digits-ddp created",
        "trainjob.trainer.kubeflow.org/digits-ddp created",
        "configmap/digits-ddp-config created",
        "podmonitor.monitoring.coreos.com/digits-ddp created",
    ]
    # What reached the API server is the TrainJob rendering (namespace and ownerReferences added), and valid.
    # (plus the annotation with this submission's id, the same on every object: see test_faults)
    expected = {o["kind"]: o for o in render.render(loading.load_job(str(example)), api="trainjob")}
    ids = set()
    for request in kube.requests("post"):
        sent = copy.deepcopy(request.data)
        meta = {k: v for k, v in sent.pop("metadata").items() if k not in ("uid", "generation",
                "creationTimestamp", "resourceVersion", "ownerReferences", "namespace")}  # fmt: skip
        annotations = dict(meta.pop("annotations"))
        ids.add(annotations.pop("orch.dev/submission"))
        meta.update({"annotations": annotations} if annotations else {})
        want = copy.deepcopy(expected[sent["kind"]])
        assert (meta, sent) == (want.pop("metadata"), want)
        assert cluster_errors(request.data) == [], request.data["kind"]
    assert len(ids) == 1

    trainer = TrainerV2(kube, NS, "digits-ddp")
    (pod,) = trainer.start()
    stored = kube.get(PODS, NS, pod)
    env = {e["name"]: e.get("value") for e in stored["spec"]["containers"][0]["env"]}
    assert (env["PET_NNODES"], env["PET_NPROC_PER_NODE"], env["ORCH_JOB_NAME"]) == ("1", "2", "digits-ddp")
    # The PodMonitor selects the TrainJob's pods (what Prometheus scrapes and `orch top` reads).
    selector = kube.get(PODMONITORS, NS, "digits-ddp")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= stored["metadata"]["labels"].items()

    kube.write_log(NS, pod, "step 25 loss 1.02", "step 300 accuracy 0.97")
    state = json.loads(v2.orch("status", "digits-ddp", "-o", "json").stdout)
    assert (state["kind"], state["phase"], [p["name"] for p in state["pods"]]) == (
        "TrainJob",
        "Running",
        [pod],
    )
    assert json.loads(v2.orch("list", "-o", "json").stdout)[0]["kind"] == "TrainJob"
    assert v2.orch("logs", "digits-ddp").stdout.splitlines() == [
        "[node-0] step 25 loss 1.02", "[node-0] step 300 accuracy 0.97",
    ]  # fmt: skip
    trainer.finish()
    assert v2.orch("wait", "digits-ddp").exit_code == 0
    assert v2.orch("delete", "digits-ddp", "--wait").exit_code == 0
    for resource in (TRAINJOBS, TRAININGRUNTIMES, CONFIGMAPS, PODMONITORS, JOBSETS, PODS):
        assert kube.names(resource, NS) == [], resource


def test_auto_prefers_pytorchjob_where_both_are_served(tmp_path, job_file):
    with serve(operator=True, trainer=True) as kube:
        kubeconfig = write_kubeconfig(tmp_path / "kc", kube.url, contexts={"dev": NS}, current="dev")
        env = Env(kube, kubeconfig, tmp_path, {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), **FAST})
        result = env.orch("submit", str(job_file))
        assert result.exit_code == 0, result.stderr
        assert (
            "api: pytorchjob (the cluster serves PyTorchJob and TrainJob; auto picks PyTorchJob"
            in result.stderr
        )
        # render's warnings for the chosen API, once: 3 pods on the default scheduler, no queue
        assert result.stderr.count("warning: nothing prevents partial scheduling: 3 pods") == 1
        assert [r.data["kind"] for r in kube.requests("post")][0] == "PyTorchJob"
        chosen = env.orch("submit", str(job_file), "--api", "trainjob", "--set", "name=demo-v2")
        assert chosen.exit_code == 0, chosen.stderr
        assert "api:" not in chosen.stderr  # asked for, not chosen
        assert kube.names(TRAINJOBS, NS) == ["demo-v2"]
        listed = env.orch("list").stdout.splitlines()
        assert [line.split()[:2] for line in listed[1:]] == [["demo", "PyTorchJob"], ["demo-v2", "TrainJob"]]


def test_neither_api_served_names_both_ways_to_install(tmp_path, job_file):
    with serve(operator=False, trainer=False) as kube:
        kubeconfig = write_kubeconfig(tmp_path / "kc", kube.url, contexts={"dev": NS}, current="dev")
        env = Env(kube, kubeconfig, tmp_path, {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), **FAST})
        result = env.orch("submit", str(job_file))
        assert result.exit_code == 1
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(
            f"error: {kube.url} (context dev) serves neither PyTorchJob (kubeflow.org/v1) nor "
        )
        assert "helm install kubeflow-trainer" in line and "kubectl apply --server-side -k" in line
        assert kube.requests("post") == []


def test_asking_for_an_api_the_cluster_lacks(tmp_path, job_file):
    with serve(operator=True, trainer=False) as kube:
        kubeconfig = write_kubeconfig(tmp_path / "kc", kube.url, contexts={"dev": NS}, current="dev")
        env = Env(kube, kubeconfig, tmp_path, {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), **FAST})
        result = env.orch("submit", str(job_file), "--api", "trainjob")
        assert result.exit_code == 1
        assert result.stderr.startswith(
            "error: Kubeflow Trainer v2 (TrainJob CRD) is not installed in this cluster"
        )
        assert kube.requests("post") == []


def test_a_role_for_trainjobs_only_still_finds_and_lists_them(v2, job_file):
    """The API server answers 403 before 404: a user allowed only TrainJobs is refused pytorchjobs."""
    submit(v2, job_file)
    refusal = 'pytorchjobs.kubeflow.org is forbidden: User "tester" cannot get resource "pytorchjobs"'
    v2.kube.fail("get", f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs(/demo)?", 403, times=100,
                 message=refusal)  # fmt: skip
    state = v2.orch("status", "demo", "-o", "json")
    assert state.exit_code == 0, state.stderr
    assert json.loads(state.stdout)["kind"] == "TrainJob"
    listed = v2.orch("list", "-o", "json")
    assert listed.exit_code == 0, listed.stderr
    assert [(r["name"], r["kind"]) for r in json.loads(listed.stdout)] == [("demo", "TrainJob")]
    v2.kube.fail("get", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs/nope", 403, times=100)
    missing = v2.orch("status", "nope")  # refused everywhere: the refusal is the answer, not "not found"
    assert missing.exit_code == 1 and "forbidden: you may not get" in missing.stderr


def test_replace_a_trainjob(v2, job_file):
    """--replace: the old TrainJob goes (foreground), then its runtime, before the new runtime is created."""
    assert v2.orch("submit", str(job_file)).exit_code == 0
    old = v2.kube.get(TRAINJOBS, NS, "demo")["metadata"]["uid"]
    again = v2.orch("submit", str(job_file), "--replace")
    assert again.exit_code == 0, again.stderr
    new = v2.kube.get(TRAINJOBS, NS, "demo")["metadata"]["uid"]
    assert new != old
    assert v2.kube.get(TRAININGRUNTIMES, NS, "demo")["metadata"]["ownerReferences"][0]["uid"] == new
    calls = [(r.method.value, r.url.path.rsplit("/", 2)[-2:]) for r in v2.kube.requests()
             if r.method.value in ("POST", "DELETE")][4:6]  # fmt: skip
    assert calls == [("DELETE", ["trainjobs", "demo"]), ("POST", [NS, "trainingruntimes"])]


@pytest.mark.parametrize("version", ["v2.1", "v2.2", "v2.3"])
def test_extra_device_resources_reach_the_pods_on_every_trainer_release(v2, tmp_path, version):
    """EFA, RDMA, hugepages from pod_overrides: v2.1/v2.2 replace the runtime container's resources with
    trainer.resourcesPerNode (played by TrainerV2), so they must travel there; a PyTorchJob keeps them too."""
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        "name: demo\nimage: registry.example/trainer:1\nnodes: 2\ngpus_per_node: 8\n"
        "train:\n  task: digits\n  batch_size: 96\n  max_steps: 10\n"
        "pod_overrides:\n  containers:\n  - name: pytorch\n    resources:\n"
        "      limits: {vpc.amazonaws.com/efa: 4, rdma/ib: 1, hugepages-2Mi: 1Gi}\n"
        "      requests: {hugepages-2Mi: 1Gi}\n"
    )
    submit(v2, job_file)
    trainer = TrainerV2(v2.kube, NS, "demo", version=version)
    pods = trainer.start()
    pod = v2.kube.get(PODS, NS, pods[0])
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "node"]
    limits = container["resources"]["limits"]
    assert (
        limits["vpc.amazonaws.com/efa"] == 4 and limits["rdma/ib"] == 1 and limits["hugepages-2Mi"] == "1Gi"
    )
    assert str(limits["nvidia.com/gpu"]) == "8"
    assert container["resources"]["requests"]["hugepages-2Mi"] == "1Gi"
    pytorchjob = render.render(loading.load_job(str(job_file)), api="pytorchjob")[1]
    for replica in pytorchjob["spec"]["pytorchReplicaSpecs"].values():
        (main,) = [c for c in replica["template"]["spec"]["containers"] if c["name"] == "pytorch"]
        assert main["resources"]["limits"]["vpc.amazonaws.com/efa"] == 4
