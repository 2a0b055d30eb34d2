"""`orchestrator.status` (and orchestrator/kube/read.py under it) reads whatever a server sends: every function is total over JSON values.

A realistic PyTorchJob, pod and event are mutated at random places (any node replaced by any JSON value,
NaN, huge integers and timestamps without a zone included); reading them must never raise, and what comes
out has the declared types, so `orch status/list/wait/logs` print a value ("Unknown", 0, "") instead of a
traceback.
"""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import status
from orchestrator.apis import all_apis
from orchestrator.commands import tables
from orchestrator.kube import read

JOB: dict[str, Any] = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "demo", "namespace": "team-a", "creationTimestamp": "2026-01-01T00:00:00Z"},
    "spec": {
        "pytorchReplicaSpecs": {
            "Master": {
                "replicas": 1,
                "template": {
                    "spec": {
                        "containers": [{"name": "pytorch", "resources": {"limits": {"nvidia.com/gpu": 8}}}]
                    }
                },
            },
            "Worker": {"replicas": 3, "template": {"spec": {"containers": [{"name": "pytorch"}]}}},
        }
    },
    "status": {
        "conditions": [
            {"type": "Created", "status": "True", "reason": "PyTorchJobCreated", "message": "created"},
            {"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "running"},
        ],
        "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 2, "failed": 1}},
        "startTime": "2026-01-01T00:00:05Z",
    },
}
POD: dict[str, Any] = {
    "metadata": {
        "name": "demo-worker-1",
        "labels": {
            "training.kubeflow.org/replica-type": "worker",
            "training.kubeflow.org/replica-index": "1",
        },
        "uid": "u1",
    },
    "spec": {"nodeName": "gpu-node-1"},
    "status": {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "pytorch",
                "restartCount": 2,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
            }
        ],
    },
}
EVENT: dict[str, Any] = {
    "type": "Warning",
    "reason": "FailedScheduling",
    "message": "0/4 nodes are available",
    "involvedObject": {"kind": "Pod", "name": "demo-worker-1"},
    "lastTimestamp": "2026-01-01T00:01:00Z",
}

junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(["", "True", "2026-01-01T00:00:00", "not a time", "1e400", "-1", "Failed", "pytorch"])
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def mutated(draw: st.DrawFn, value: Any) -> Any:
    """`value` with some of its nodes (at any depth) replaced by junk."""
    if draw(st.integers(0, 9)) == 0:
        return draw(junk)
    if isinstance(value, dict):
        return {k: draw(mutated(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [draw(mutated(v)) for v in value]
    return value


NOW = datetime.datetime(2026, 1, 1, 1, tzinfo=datetime.UTC)
PHASES = {
    "Created",
    "Running",
    "Restarting",
    "Suspended",
    "Succeeded",
    "Failed",
    status.PENDING,
    status.UNKNOWN,
}


APIS = pytest.mark.parametrize("api", all_apis(), ids=lambda api: api.key)


@APIS
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=mutated(JOB), pods=st.lists(mutated(POD), max_size=3), events=st.lists(mutated(EVENT), max_size=3))
def test_reading_any_job_pod_and_event_never_raises(api, job, pods, events):
    state = status.job_status(api, job, pods, events)
    assert state.phase in PHASES and isinstance(state.reason, str) and isinstance(state.message, str)
    assert all(isinstance(getattr(state, f), str) for f in ("name", "namespace", "created", "start_time"))
    for counts in state.replicas.values():
        assert all(isinstance(n, int) for n in (counts.active, counts.succeeded, counts.failed))
    for pod in state.pods:
        assert isinstance(pod.name, str) and isinstance(pod.phase, str) and isinstance(pod.restarts, int)
    assert isinstance(tables.format_status(state), str)
    json.dumps(state.to_dict())  # `-o json`
    yaml.safe_dump(state.to_dict())  # `-o yaml`

    row = status.list_row(api, job, NOW)
    assert row["phase"] in PHASES and isinstance(row["nodes"], int) and isinstance(row["gpus_per_node"], int)
    assert isinstance(tables.format_list([row], wide=True, all_namespaces=True), str)
    json.dumps(row)

    for pod in pods:  # what `orch logs` reads of each pod
        summary = status.pod_summary(api, pod)
        assert isinstance(summary.label, str) and isinstance(summary.index, int)
        assert isinstance(read.container_started(pod, api.container), bool)
        assert isinstance(read.container_running(pod, api.container), bool)
        assert isinstance(api.node_rank(job, summary.role, summary.index), int)
    assert all(isinstance(n, str) for n in api.related_names("demo", pods))


@APIS
@given(value=junk)
def test_any_json_value_as_a_whole_object(api, value):
    """The functions take anything a server can send, even where an object belongs."""
    assert api.phase(value) in PHASES
    tables.format_status(status.job_status(api, value, [value], [value]))
    status.list_row(api, value, NOW)
    status.pod_summary(api, value)


def test_malformed_conditions_read_as_unknown_not_pending():
    """A job whose status cannot be read is Unknown: saying Pending would be a guess."""
    precedence = ("Failed", "Succeeded", "Running")
    for bad in ({"conditions": "Running"}, {"conditions": 5}, {"conditions": {"type": "Running"}}, "Running"):
        assert status.phase_by_precedence({"status": bad}, precedence) == status.UNKNOWN, bad
    assert status.phase_by_precedence({"status": {}}, precedence) == status.PENDING  # none written yet
    # malformed conditions among readable ones are skipped; the readable ones still decide
    conditions = ["junk", [], {"type": ["x"], "status": "True"}, {"type": "Running", "status": "True"}]
    assert status.phase_by_precedence({"status": {"conditions": conditions}}, precedence) == "Running"


@APIS
def test_numbers_and_times_out_of_range(api):
    job = {
        "metadata": {"name": "demo", "creationTimestamp": "2026-01-01T00:00:00"},  # no zone
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1e400}, "Master": {"replicas": "x"}}},
        "status": {"replicaStatuses": {"Worker": {"active": math.nan, "failed": "2", "succeeded": 10**100}}},
    }
    assert status.age("2026-01-01T00:00:00", NOW) == "1h"
    assert [read.to_int(v) for v in (1e400, "x", math.nan, "2", 10**100, True, -1, 3.0)] == [
        0,
        0,
        0,
        2,
        0,
        0,
        0,
        3,
    ]
    row = status.list_row(api, job, NOW)
    assert row["age"] == "1h"
    if api.key == "pytorchjob":
        assert row["nodes"] == 0
        state = status.job_status(api, job)
        assert state.replicas["Worker"] == status.ReplicaStatus(active=0, succeeded=0, failed=2)
