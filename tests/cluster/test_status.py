"""orchestrator.status and the PyTorchJob API: the phase and summaries derived from what the operator and
kubelet report (pure)."""

from __future__ import annotations

import datetime

import click
import pytest

from orchestrator import status
from orchestrator.apis.pytorchjob import API
from orchestrator.commands.cluster_cmds import DURATION
from orchestrator.kube import read
from tests.fakes.kube import pod_object


def job(*conditions):
    return {
        "metadata": {"name": "j"},
        "status": {
            "conditions": [
                {"type": t, "status": s, "reason": f"PyTorchJob{t}", "message": f"{t} {s}"}
                for t, s in conditions
            ]
        },
    }


@pytest.mark.parametrize(
    ("conditions", "phase"),
    [
        ((), "Pending"),
        ((("Created", "True"),), "Created"),
        ((("Created", "True"), ("Running", "True")), "Running"),
        ((("Created", "True"), ("Running", "False"), ("Restarting", "True")), "Restarting"),
        # kubectl shows the last condition's type; here that is a False "Suspended" after a resume
        ((("Created", "True"), ("Running", "True"), ("Suspended", "False")), "Running"),
        ((("Created", "True"), ("Suspended", "True")), "Suspended"),
        ((("Created", "True"), ("Running", "False"), ("Succeeded", "True")), "Succeeded"),
        ((("Succeeded", "True"), ("Failed", "True")), "Failed"),
        ((("Created", "True"), ("Failed", "True"), ("Running", "True")), "Failed"),
        ((("Created", "Unknown"),), "Pending"),
    ],
)
def test_phase_precedence(conditions, phase):
    assert API.phase(job(*conditions)) == phase


def test_phase_condition_carries_reason_and_message():
    j = job(("Created", "True"), ("Running", "False"), ("Failed", "True"))
    assert API.phase_condition(j)["message"] == "Failed True"
    assert API.phase_condition(job()) == {}


def test_pod_summary_explains_the_pod():
    crashing = pod_object("j-worker-2", "j", "worker", 2, state="running", restarts=3, last="OOMKilled:137")
    crashing["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    assert status.pod_summary(API, crashing) == status.PodSummary(
        name="j-worker-2",
        role="worker",
        index=2,
        phase="CrashLoopBackOff",
        node="gpu-node-1",
        restarts=3,
        last_termination="OOMKilled (exit 137)",
    )
    # A pod that is not restarted (restartPolicy Never, or a failed Job pod): its container's own end says why.
    ended = pod_object("j-worker-1", "j", "worker", 1, state="running")
    ended["status"]["phase"] = "Failed"
    ended["status"]["containerStatuses"][0]["state"] = {
        "terminated": {"reason": "OOMKilled", "exitCode": 137}
    }
    assert (status.pod_summary(API, ended).phase, status.pod_summary(API, ended).last_termination) == (
        "Failed",
        "OOMKilled (exit 137)",
    )
    pending = pod_object("j-master-0", "j", "master", 0, state="waiting")
    assert (status.pod_summary(API, pending).phase, status.pod_summary(API, pending).label) == (
        "Pending",
        "master-0",
    )
    assert not read.container_started(pending, API.container)
    terminating = pod_object("j-master-0", "j", "master", 0, state="running")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert status.pod_summary(API, terminating).phase == "Terminating"


def listed(pods):
    return sorted((status.pod_summary(API, p) for p in pods), key=lambda pod: status.pod_order(API, pod))


def test_pods_listed_master_first_then_by_index_which_is_not_rank_order():
    pods = [
        pod_object(f"j-{r}-{i}", "j", r, i, state="running")
        for r, i in (("worker", 10), ("worker", 2), ("master", 0), ("worker", 0))
    ]
    assert [p.name for p in listed(pods)] == ["j-master-0", "j-worker-0", "j-worker-2", "j-worker-10"]
    # An elastic job (Workers only): c10d's rendezvous ranks worker-10 before worker-2 (node_rank, which
    # `orch logs --rank` follows); the listing keeps the index order.
    elastic = {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 11}}}}
    workers = listed(pod_object(f"j-worker-{i}", "j", "worker", i, state="running") for i in (10, 2, 0))
    assert [p.name for p in workers] == ["j-worker-0", "j-worker-2", "j-worker-10"]
    assert [API.node_rank(elastic, p.role, p.index) for p in workers] == [0, 3, 2]


def test_nodes_and_gpus_from_the_spec():
    def replica(n, gpus):
        return {
            "replicas": n,
            "template": {
                "spec": {
                    "containers": [
                        {"name": "sidecar"},
                        {"name": "pytorch", "resources": {"limits": {"nvidia.com/gpu": gpus}}},
                    ]
                }
            },
        }

    assert API.nodes_and_gpus(
        {"spec": {"pytorchReplicaSpecs": {"Master": replica(1, 8), "Worker": replica(3, "8")}}}
    ) == (4, 8)
    assert API.nodes_and_gpus({}) == (0, 0)


@pytest.mark.parametrize(
    ("seconds", "shown"), [(5, "5s"), (59, "59s"), (60, "1m"), (7200, "2h"), (3 * 86400, "3d")]
)
def test_age(seconds, shown):
    now = datetime.datetime(2026, 1, 10, tzinfo=datetime.timezone.utc)
    created = (now - datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert status.age(created, now) == shown
    assert status.age("", now) == ""


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("10m", 600), ("2h", 7200), ("1h30m", 5400), ("1d", 86400)]
)
def test_duration(text, seconds):
    assert DURATION.convert(text, None, None) == seconds


@pytest.mark.parametrize("text", ["", "2 hours", "1.5h", "-1m"])
def test_bad_duration(text):
    with pytest.raises(click.BadParameter):
        DURATION.convert(text, None, None)
