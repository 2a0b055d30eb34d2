"""Jobs of hundreds of pods: paged lists, watches instead of polls (resumed, re-listed on 410 Gone), and logs
that follow what a person can read with a bounded number of streams. Counts requests; times nothing."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.fakes.emulator import CONFIGMAPS, JOBS, PODS
from tests.fakes.kube import Kube

NS = "team-a"


def start_job(env, job_file, pods: int) -> list[str]:
    assert env.orch("submit", str(job_file)).exit_code == 0
    env.kube.set_conditions(NS, "demo", ("Created", "True"), ("Running", "True"))
    names = [env.kube.add_pod(NS, "demo", "master", 0)]
    names += [env.kube.add_pod(NS, "demo", "worker", i, node=f"node-{i}") for i in range(pods - 1)]
    return names


def _later(seconds, fn, *args, **kwargs):
    timer = threading.Timer(seconds, fn, args, kwargs)
    timer.start()
    return timer


# --- the emulator serves watches and pages as the API server does


def _core(kube: Kube):  # type: ignore[no-untyped-def]
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = kube.url
    return client.CoreV1Api(client.ApiClient(configuration))


def _get(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    """The raw answer (the fake pods lack fields the client's models require)."""
    return json.loads(fn(*args, _preload_content=False, **kwargs).data)


def _names(answer) -> list[str]:  # type: ignore[no-untyped-def]
    return [item["metadata"]["name"] for item in answer["items"]]


def test_emulator_pages_a_list_from_one_snapshot_and_expires_compacted_tokens(kube: Kube):
    from kubernetes.client import ApiException

    for i in range(5):
        kube.add_pod(NS, "demo", "worker", i)
    core = _core(kube)
    first = _get(core.list_namespaced_pod, NS, limit=2)
    assert _names(first) == ["demo-worker-0", "demo-worker-1"]
    assert first["metadata"]["remainingItemCount"] == 3
    kube.add_pod(NS, "demo", "worker", 9)  # after the first page: not in this list's snapshot
    rest = _get(core.list_namespaced_pod, NS, limit=10, _continue=first["metadata"]["continue"])
    assert _names(rest) == ["demo-worker-2", "demo-worker-3", "demo-worker-4"]
    assert "continue" not in rest["metadata"]
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]

    again = _get(core.list_namespaced_pod, NS, limit=2)
    kube.compact()
    with pytest.raises(ApiException) as gone:
        core.list_namespaced_pod(NS, limit=2, _continue=again["metadata"]["continue"])
    assert gone.value.status == 410


def test_emulator_watch_resumes_after_a_version_and_says_410_once_compacted(kube: Kube):
    kube.add_pod(NS, "demo", "master", 0)
    core = _core(kube)
    version = _get(core.list_namespaced_pod, NS)["metadata"]["resourceVersion"]
    kube.set_pod_state(NS, "demo-master-0", "failed")
    kube.delete(PODS, NS, "demo-master-0")

    def watch(since: str) -> list[dict]:
        response = core.list_namespaced_pod(
            NS, watch=True, resource_version=since, timeout_seconds=1, _preload_content=False
        )
        return [json.loads(line) for line in response.data.splitlines()]

    events = watch(version)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "demo-master-0"),
        ("DELETED", "demo-master-0"),
    ]
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) > int(version)
    assert watch(events[0]["object"]["metadata"]["resourceVersion"])[0]["type"] == "DELETED"

    kube.compact()
    (error,) = watch(version)
    assert error["type"] == "ERROR" and error["object"]["code"] == 410


# --- orch's side


def test_list_reads_pages(env, job_file, monkeypatch):
    from orchestrator.cluster import client

    monkeypatch.setattr(client, "PAGE_SIZE", 3)
    for i in range(7):
        env.kube.put(JOBS, NS, {
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": f"job-{i}", "labels": {"app.kubernetes.io/managed-by": "orch"}},
            "spec": {"pytorchReplicaSpecs": {}},
        })  # fmt: skip
    result = env.orch("list", "-o", "json")
    assert result.exit_code == 0, result.stderr
    assert sorted(row["name"] for row in json.loads(result.stdout)) == [f"job-{i}" for i in range(7)]
    pages = env.kube.requests("get", f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs")
    assert [r.params.get("limit") for r in pages] == ["3", "3", "3"]
    assert [bool(r.params.get("continue")) for r in pages] == [False, True, True]


@pytest.mark.parametrize("pods", [8, 96])
def test_wait_watches_the_job_with_requests_independent_of_pods_and_changes(env, job_file, pods):
    start_job(env, job_file, pods)
    before = len(env.kube.requests())

    def churn():
        for i in range(20):  # the operator updates the job's status many times: each is one watch event
            env.kube.patch(JOBS, NS, "demo", {"status": {"replicaStatuses": {"Worker": {"active": i}}}})
        env.kube.set_conditions(NS, "demo", ("Running", "False"), ("Succeeded", "True"))

    timer = _later(0.5, churn)
    result = env.orch("wait", "demo", "--timeout", "60s")
    timer.join()
    assert result.exit_code == 0, result.stderr
    made = env.kube.requests()[before:]
    # locate (get), one list of the job by name, one watch: no pod requests, no polling
    assert [(r.method.value, r.params.get("watch")) for r in made] == [
        ("GET", None),
        ("GET", None),
        ("GET", "true"),
    ]
    assert made[1].params.get("fieldSelector") == "metadata.name=demo"
    assert made[2].params.get("resourceVersion")


def test_wait_resumes_its_watch_and_lists_again_after_410_gone(env, job_file, monkeypatch):
    from orchestrator.cluster import client

    monkeypatch.setattr(client, "WATCH_SECONDS", 1)  # each watch request ends after 1 s and is resumed
    start_job(env, job_file, 2)
    env.kube.emulator.bookmarks = False  # (allowed): so the client's last version falls behind

    def other_changes_then_compaction():
        env.kube.put(CONFIGMAPS, NS, {"metadata": {"name": "unrelated"}})
        env.kube.compact()  # the client's version is now too old: its next watch is told 410 Gone

    before = len(env.kube.requests())
    _later(1.5, other_changes_then_compaction)
    timer = _later(3.5, env.kube.set_conditions, NS, "demo", ("Running", "False"), ("Succeeded", "True"))
    result = env.orch("wait", "demo", "--timeout", "30s")
    timer.join()
    assert result.exit_code == 0, result.stderr
    made = env.kube.requests()[before:]
    lists = [r for r in made if r.params.get("watch") != "true" and r.params.get("fieldSelector")]
    watches = [r for r in made if r.params.get("watch") == "true"]
    assert len(lists) == 2, "listed once at the start and once after the 410"
    assert len(watches) >= 3
    assert all(w.params.get("resourceVersion") for w in watches)


def test_delete_wait_watches_until_the_job_is_gone(env, job_file):
    start_job(env, job_file, 2)
    result = env.orch("delete", "demo", "--wait")
    assert result.exit_code == 0, result.stderr
    assert env.kube.get(JOBS, NS, "demo") is None


# --- logs at 512 pods


@pytest.mark.slow  # 512 pods seeded one by one
def test_logs_of_512_pods_shows_rank_0_and_the_failed_pod_and_says_how_to_get_the_rest(env, job_file):
    names = start_job(env, job_file, 512)
    for name in names:
        env.kube.write_log(NS, name, f"{name} step 1")
    env.kube.write_log(NS, names[300], "RuntimeError: NCCL communicator was aborted")
    env.kube.set_pod_state(NS, names[300], "failed")
    result = env.orch("logs", "demo")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        "[master-0] demo-master-0 step 1",
        "[worker-299] demo-worker-299 step 1",
        "[worker-299] RuntimeError: NCCL communicator was aborted",
    ]
    assert (
        "showing 2 of 512 pods" in result.stderr
        and "--all" in result.stderr
        and "--ranks 0-63" in result.stderr
    )


@pytest.mark.slow  # 512 pods seeded one by one
def test_logs_all_of_512_pods_reads_every_line_with_bounded_streams(env, job_file):
    names = start_job(env, job_file, 512)
    for name in names:
        env.kube.write_log(NS, name, f"{name} line 1", f"{name} line 2")
    result = env.orch("logs", "demo", "--all", "--max-log-requests", "8")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1024 and len(set(lines)) == 1024
    assert lines[:2] == ["[master-0] demo-master-0 line 1", "[master-0] demo-master-0 line 2"]
    assert all(line.startswith("[") and "] demo-" in line for line in lines)  # whole lines, prefixed
    assert env.kube.emulator.log_streams_peak <= 8


@pytest.mark.launch
def test_logs_follow_512_pods_caps_streams_and_the_rest_can_be_fetched_after(env, job_file):
    from tests.cluster.test_follow import Follower

    names = start_job(env, job_file, 512)
    for name in names:
        env.kube.write_log(NS, name, f"{name} ready")
    follower = Follower(env, "logs", "demo", "--ranks", "0-39", "--max-log-requests", "16", "-f")
    follower.expect("[master-0] demo-master-0 ready", "[worker-14] demo-worker-14 ready")
    time.sleep(1)
    env.kube.write_log(NS, names[0], "step 10 loss 1.0")
    env.kube.set_pod_state(NS, names[200], "failed")  # not asked for (--ranks): not followed
    follower.expect("[master-0] step 10 loss 1.0")
    for name in names:
        env.kube.end_log(NS, name)
    env.kube.set_conditions(NS, "demo", ("Running", "False"), ("Succeeded", "True"))
    code, stderr = follower.finish(timeout=60)
    assert code == 0, stderr
    assert env.kube.emulator.log_streams_peak <= 16
    # the streams that ended (containers exited) made room for the rest of the 40 asked for
    followed = {line.split("]")[0] + "]" for line in follower.seen}
    hint = next((line for line in stderr.splitlines() if "were not followed" in line), "")
    if hint:  # what the cap left out is named, with the command that prints it
        command = hint.split("their logs: ")[1].split()
        fetched = env.orch(*command[1:]).stdout.splitlines()
        followed |= {line.split("]")[0] + "]" for line in fetched}
    assert len(followed) == 40
    assert not any("worker-199" in line for line in follower.seen)


def test_status_with_an_unreachable_prometheus_still_answers(env, job_file):
    from tests.metrics.conftest import free_port

    start_job(env, job_file, 2)
    result = env.orch("status", "demo", env={"ORCH_PROMETHEUS_URL": f"http://127.0.0.1:{free_port()}"})
    assert result.exit_code == 0, result.stderr
    assert "straggler" not in result.stdout
