"""`orch status` of a job that waits says why: Kueue's Workload, Volcano's PodGroup (issue #19 point 11).

The emulator serves Kueue's Workload and LocalQueue and Volcano's PodGroup; tests/fakes/queues.py writes them
as Kueue and Volcano do (its docstring cites their source). orch is the real CLI over real HTTP.
"""

from __future__ import annotations

import json

import pytest

from tests.cluster.test_rbac import rbac_rules
from tests.fakes.cli import FAST, Env, write_kubeconfig
from tests.fakes.emulator import JOBS, PODS, serve
from tests.fakes.queues import Kueue, volcano_podgroup, workload_name
from tests.fakes.trainer import TrainerV2

NS = "team-a"
NO_QUOTA = (
    "couldn't assign flavors to pod set master: insufficient unused quota for nvidia.com/gpu in flavor a100, "
    "8 more needed"
)


@pytest.fixture(params=["v1beta2", "v1beta1"])
def queued(request, tmp_path):
    """A cluster with the training operator and Kueue (v1beta2: Kueue v0.16+; v1beta1: v0.14-v0.15)."""
    with serve(operator=True, trainer=True, kueue=request.param, volcano=True) as kube:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, contexts={"dev": NS}, current="dev")
        env = Env(kube, kubeconfig, tmp_path, {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), **FAST})
        env.kueue_version = request.param  # type: ignore[attr-defined]
        yield env


def job_file(tmp_path, scheduling: str):
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: demo\nimage: registry.example/trainer:1\nnodes: 2\ngpus_per_node: 8\n"
        f"scheduling: {scheduling}\ntrain: {{task: digits, batch_size: 96, max_steps: 10}}\n"
    )
    return path


def test_a_queued_pytorchjob_shows_what_kueue_says(queued, tmp_path):
    kube = queued.kube
    submitted = queued.orch("submit", str(job_file(tmp_path, "{queue: team-q}")), "--api", "pytorchjob")
    assert submitted.exit_code == 0, submitted.output
    job = kube.get(JOBS, NS, "demo")
    kueue = Kueue(kube, NS, queued.kueue_version)
    kueue.local_queue("team-q", pending=3)
    workload = kueue.queue(job, pod_sets={"master": 1, "worker": 1}, message=NO_QUOTA)
    assert workload == workload_name("PyTorchJob", "demo", job["metadata"]["uid"])

    waiting = json.loads(queued.orch("status", "demo", "-o", "json").stdout)["waiting"]
    assert waiting == {
        "scheduler": "Kueue", "queue": "team-q", "workload": workload, "admitted": False, "cluster_queue": "",
        "pending_in_queue": 3, "conditions": [{"type": "QuotaReserved", "status": "False",
        "reason": "Pending" if queued.kueue_version == "v1beta1" else "WaitingForQuota", "message": NO_QUOTA}],
    }  # fmt: skip
    table = queued.orch("status", "demo").stdout
    assert (
        f"Queue:       Kueue LocalQueue team-q, Workload {workload}: not admitted; "
        "3 workload(s) pending in the queue"
    ) in table
    assert f"  QuotaReserved=False {waiting['conditions'][0]['reason']}: {NO_QUOTA}" in table

    kueue.admit(workload)
    waiting = json.loads(queued.orch("status", "demo", "-o", "json").stdout)["waiting"]
    assert waiting["admitted"] is True and waiting["cluster_queue"] == "cluster-queue"


def test_a_queued_job_before_kueue_made_its_workload(queued, tmp_path):
    queued.orch("submit", str(job_file(tmp_path, "{queue: team-q}")), "--api", "trainjob")
    table = queued.orch("status", "demo").stdout
    assert "Queue:       Kueue LocalQueue team-q: no Workload yet" in table


def test_a_volcano_gang_that_does_not_fit_shows_its_podgroup(queued, tmp_path):
    kube = queued.kube
    queued.orch(
        "submit", str(job_file(tmp_path, "{scheduler: volcano, queue: research}")), "--api", "trainjob"
    )
    (pod, _) = TrainerV2(kube, NS, "demo").start(running=False)  # Volcano holds the pods: Pending
    assert kube.get(PODS, NS, pod)["spec"]["schedulerName"] == "volcano"
    volcano_podgroup(kube, NS, "demo", members=2, pending=2)
    waiting = json.loads(queued.orch("status", "demo", "-o", "json").stdout)["waiting"]
    message = "2/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, 2 minAvailable"
    assert waiting == {
        "scheduler": "Volcano", "podgroup": "demo", "queue": "research", "phase": "Inqueue",
        "conditions": [{"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources",
                        "message": message}],
    }  # fmt: skip
    assert f"  Unschedulable=True NotEnoughResources: {message}" in queued.orch("status", "demo").stdout


def test_a_user_who_may_not_read_workloads_still_gets_the_status(tmp_path):
    """Without Kueue's kinds in the Role, the status shows everything else (the read is refused: 403)."""
    with serve(operator=True, kueue="v1beta2") as kube:
        kube.enforce_role({rule for rule in rbac_rules() if rule[0] != "kueue.x-k8s.io"})
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, contexts={"dev": NS}, current="dev")
        env = Env(kube, kubeconfig, tmp_path, {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), **FAST})
        assert env.orch("submit", str(job_file(tmp_path, "{queue: team-q}"))).exit_code == 0
        shown = env.orch("status", "demo", "-o", "json")
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.stdout)["waiting"]["workload"] == ""
