"""`orch submit` / `status` / `list` / `delete` against the API emulator, the test playing the operator."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from orchestrator.job import loading
from orchestrator.rendering import render
from tests.fakes.cli import FAST, Env, write_kubeconfig
from tests.fakes.emulator import CONFIGMAPS, JOBS, PODMONITORS, PODS, serve

NS = "team-a"  # the namespace of the kubeconfig's current context


def rendered(job_file, namespace=NS):
    objects = render.render(loading.load_job(str(job_file)))
    for obj in objects:
        obj["metadata"]["namespace"] = namespace
    return objects


@pytest.mark.smoke  # the fast tier's end-to-end submit of a PyTorchJob
def test_submit_creates_owned_objects_status_list_delete(env, job_file):
    kube = env.kube
    result = env.orch("submit", str(job_file))
    assert result.exit_code == 0, result.output + result.stderr
    assert result.stdout.splitlines() == [
        "pytorchjob.kubeflow.org/demo created",
        "configmap/demo-config created",
        "podmonitor.monitoring.coreos.com/demo created",
    ]

    # What reached the server is exactly what `orch render` shows, plus the ownerReferences to the job.
    job = kube.get(JOBS, NS, "demo")
    expected = {o["kind"]: o for o in rendered(job_file)}
    sent = {r.data["kind"]: r.data for r in kube.requests("post")}
    # ... and one annotation: the id of this submission, the same on every object (it recognises them) and
    # on the pod templates (orchestrator.launch keeps an exit-code job's start count per submission)
    submission = sent["PyTorchJob"]["metadata"]["annotations"]["orch.dev/submission"]
    assert re.fullmatch(r"[0-9a-f]{32}", submission)
    for replica in expected["PyTorchJob"]["spec"]["pytorchReplicaSpecs"].values():
        replica["template"]["metadata"].setdefault("annotations", {})["orch.dev/submission"] = submission
    assert sent["PyTorchJob"] == expected["PyTorchJob"] | {"metadata": sent["PyTorchJob"]["metadata"]}
    for obj in expected.values():
        meta = obj["metadata"]
        meta["annotations"] = {**meta.get("annotations", {}), "orch.dev/submission": submission}
    assert {
        k: v
        for k, v in sent["PyTorchJob"]["metadata"].items()
        if k not in ("uid", "generation", "creationTimestamp", "resourceVersion")
    } == expected["PyTorchJob"]["metadata"]
    owner = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": "demo",
        "uid": job["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    for resource, name, kind in (
        (CONFIGMAPS, "demo-config", "ConfigMap"),
        (PODMONITORS, "demo", "PodMonitor"),
    ):
        stored = kube.get(resource, NS, name)
        assert stored["metadata"]["ownerReferences"] == [owner]
        assert stored["metadata"]["labels"] == expected[kind]["metadata"]["labels"]
        assert stored["metadata"]["annotations"] == expected[kind]["metadata"]["annotations"]
        assert {k: v for k, v in stored.items() if k != "metadata"} == {
            k: v for k, v in expected[kind].items() if k != "metadata"
        }
    # the job is created first: its uid is what the others point at
    assert [r.data["kind"] for r in kube.requests("post")] == ["PyTorchJob", "ConfigMap", "PodMonitor"]

    # The operator starts the job: pods and conditions.
    kube.add_pod(NS, "demo", "master", 0)
    kube.add_pod(NS, "demo", "worker", 0, node="gpu-node-2")
    kube.add_pod(NS, "demo", "worker", 1, state="waiting")
    kube.set_pod_state(NS, "demo-worker-0", "running", restarts=2, last="OOMKilled:137")
    kube.set_conditions(
        NS,
        "demo",
        ("Created", "True"),
        ("Running", "True"),
        replicaStatuses={"Master": {"active": 1}, "Worker": {"active": 1}},
        startTime="2026-01-01T00:00:00Z",
    )
    kube.put(
        "v1/events",
        NS,
        {
            "metadata": {"name": "e1"},
            "type": "Warning",
            "reason": "FailedScheduling",
            "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
            "involvedObject": {"kind": "Pod", "name": "demo-worker-1"},
            "lastTimestamp": "2026-01-01T00:01:00Z",
        },
    )
    kube.put(
        "v1/events",
        NS,
        {
            "metadata": {"name": "e2"},
            "type": "Warning",
            "reason": "BackOff",
            "message": "someone else's pod",
            "involvedObject": {"kind": "Pod", "name": "other-0"},
        },
    )

    status = env.orch("status", "demo", "-o", "json")
    assert status.exit_code == 0, status.stderr
    state = json.loads(status.stdout)
    assert state["phase"] == "Running" and state["reason"] == "PyTorchJobRunning"
    assert state["replicas"] == {
        "Master": {"active": 1, "succeeded": 0, "failed": 0},
        "Worker": {"active": 1, "succeeded": 0, "failed": 0},
    }
    assert state["pods"] == [
        {
            "name": "demo-master-0",
            "role": "master",
            "index": 0,
            "phase": "Running",
            "node": "gpu-node-1",
            "restarts": 0,
            "last_termination": "",
        },
        {
            "name": "demo-worker-0",
            "role": "worker",
            "index": 0,
            "phase": "Running",
            "node": "gpu-node-2",
            "restarts": 2,
            "last_termination": "OOMKilled (exit 137)",
        },
        {
            "name": "demo-worker-1",
            "role": "worker",
            "index": 1,
            "phase": "Pending",
            "node": "",
            "restarts": 0,
            "last_termination": "",
        },
    ]
    assert [(e["object"], e["reason"]) for e in state["events"]] == [
        ("Pod/demo-worker-1", "FailedScheduling")
    ]
    table = env.orch("status", "demo").stdout
    assert "Phase:       Running (PyTorchJobRunning)" in table
    assert "demo-worker-0   worker-0   Running   gpu-node-2   2          OOMKilled (exit 137)" in table
    assert "4 Insufficient nvidia.com/gpu" in table

    # list shows orch's jobs only (by label)
    kube.put(
        JOBS, NS, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "not-orch"}}
    )
    listed = json.loads(env.orch("list", "-o", "json").stdout)
    assert [(r["name"], r["phase"], r["nodes"], r["gpus_per_node"]) for r in listed] == [
        ("demo", "Running", 3, 0)
    ]
    header, row = env.orch("list").stdout.splitlines()
    assert header.split() == ["NAME", "KIND", "PHASE", "AGE", "NODES", "x", "GPUS"]
    assert row.split()[:3] == ["demo", "PyTorchJob", "Running"] and re.fullmatch(r"\d+s", row.split()[3])
    assert row.split()[4:] == ["3", "x", "0"]

    deleted = env.orch("delete", "demo", "--wait")
    assert deleted.exit_code == 0, deleted.stderr
    assert deleted.stdout.strip() == "pytorchjob.kubeflow.org/demo deleted"
    delete_request = kube.requests("delete")[0]
    assert delete_request.params["propagationPolicy"] == "Foreground"  # --wait: the job goes after its pods
    # The garbage collector (emulated) removed what the job owned, because the ownerReferences were right.
    assert kube.names(JOBS, NS) == ["not-orch"]
    assert kube.names(CONFIGMAPS, NS) == [] and kube.names(PODMONITORS, NS) == []
    assert "not found" in env.orch("status", "demo").stderr


def test_operator_missing_is_reported_and_nothing_is_created(tmp_path, job_file):
    with serve(operator=False) as kube:
        kubeconfig = write_kubeconfig(tmp_path / "kc", kube.url, contexts={"dev": NS}, current="dev")
        env = Env(kube, kubeconfig, tmp_path, {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), **FAST})
        result = env.orch("submit", str(job_file), "--api", "pytorchjob")
        assert result.exit_code == 1
        assert result.stderr.startswith(
            "error: Kubeflow training operator (PyTorchJob CRD) is not installed in this cluster"
        )
        assert "kubectl apply --server-side -k" in result.stderr and "kubeflow.org/docs" in result.stderr
        assert kube.requests("post") == []


def test_podmonitor_crd_missing_is_a_warning(tmp_path, job_file):
    with serve(prometheus_operator=False) as kube:
        kubeconfig = write_kubeconfig(tmp_path / "kc", kube.url, contexts={"dev": NS}, current="dev")
        result = _orch(kube, kubeconfig, tmp_path, "submit", str(job_file))
        assert result.exit_code == 0, result.stderr
        assert (
            "warning: the PodMonitor CRD (monitoring.coreos.com/v1 podmonitors) is not installed"
            in result.stderr
        )
        assert [r.data["kind"] for r in kube.requests("post")] == ["PyTorchJob", "ConfigMap"]


def _orch(kube, kubeconfig, home, *args):
    return Env(kube, kubeconfig, home, {"KUBECONFIG": str(kubeconfig), "HOME": str(home), **FAST}).orch(*args)


def test_existing_name_fails_and_replace_deletes_then_recreates(env, job_file):
    kube = env.kube
    assert env.orch("submit", str(job_file)).exit_code == 0
    old_uid = kube.get(JOBS, NS, "demo")["metadata"]["uid"]

    again = env.orch("submit", str(job_file))
    assert again.exit_code == 1
    assert again.stderr.strip().splitlines()[-1] == (
        'error: job demo already exists in namespace "team-a"; use --replace to delete it and submit again, '
        "or `orch delete demo` first"
    )
    assert len(kube.requests("post")) == 3  # nothing more was sent

    replaced = env.orch("submit", str(job_file), "--replace", "--set", "nodes=2")
    assert replaced.exit_code == 0, replaced.stderr
    new = kube.get(JOBS, NS, "demo")
    assert new["metadata"]["uid"] != old_uid
    assert new["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    assert (
        kube.get(CONFIGMAPS, NS, "demo-config")["metadata"]["ownerReferences"][0]["uid"]
        == new["metadata"]["uid"]
    )
    # the old job was deleted in the foreground and was gone before the new one was created
    methods = [
        (r.method.value, r.url.path.rsplit("/", 1)[-1])
        for r in kube.requests()
        if r.method.value in ("POST", "DELETE")
    ]
    assert methods[3:5] == [("DELETE", "demo"), ("POST", "pytorchjobs")]


def test_forbidden_names_verb_resource_and_rbac(env, job_file):
    env.kube.fail(
        "post",
        "/apis/kubeflow.org/v1/namespaces/team-a/pytorchjobs",
        403,
        message=(
            'pytorchjobs.kubeflow.org is forbidden: User "tester" cannot create resource "pytorchjobs" '
            'in API group "kubeflow.org" in the namespace "team-a"'
        ),
    )
    result = env.orch("submit", str(job_file))
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1] == (
        'error: forbidden: you may not create pytorchjobs.kubeflow.org demo in namespace "team-a" '
        '(pytorchjobs.kubeflow.org is forbidden: User "tester" cannot create resource "pytorchjobs" in API group '
        '"kubeflow.org" in the namespace "team-a"). manifests/rbac.yaml has a Role with what orch needs; '
        "ask a cluster admin to bind it to you"
    )
    assert env.kube.names(JOBS) == [] and env.kube.names(CONFIGMAPS) == []


def test_server_errors_are_retried_then_succeed(env, job_file):
    fault = env.kube.fail("post", "/apis/kubeflow.org/v1/namespaces/team-a/pytorchjobs", 500, times=1)
    throttle = env.kube.fail(
        "post", "/api/v1/namespaces/team-a/configmaps", 429, times=2, headers={"Retry-After": "0"}
    )
    result = env.orch("submit", str(job_file))
    assert result.exit_code == 0, result.stderr
    assert (fault.hits, throttle.hits) == (1, 2)
    assert env.kube.names(JOBS) == ["demo"] and env.kube.names(CONFIGMAPS) == ["demo-config"]


def test_retries_are_bounded(env):
    fault = env.kube.fail("get", "/apis/kubeflow.org/v1/namespaces/team-a/pytorchjobs/demo", 503, times=100)
    result = env.orch("status", "demo")
    assert result.exit_code == 1
    assert fault.hits == 4  # 1 + ORCH_API_RETRIES=3
    assert result.stderr.startswith(
        'error: get pytorchjobs.kubeflow.org demo in namespace "team-a" failed: HTTP 503'
    )


def test_failure_midway_leaves_nothing_behind(env, job_file):
    env.kube.fail(
        "post",
        "/apis/monitoring.coreos.com/v1/namespaces/team-a/podmonitors",
        403,
        message="podmonitors.monitoring.coreos.com is forbidden",
    )
    result = env.orch("submit", str(job_file))
    assert result.exit_code == 1
    assert "forbidden: you may not create podmonitors.monitoring.coreos.com demo" in result.stderr
    assert "(rolled back: deleted configmap/demo-config, pytorchjob.kubeflow.org/demo)" in result.stderr
    assert (
        env.kube.names(JOBS) == [] and env.kube.names(CONFIGMAPS) == [] and env.kube.names(PODMONITORS) == []
    )


def test_invalid_job_sends_nothing(env, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: demo\ntrain: {task: digits}\n")  # no image: render/submit need one
    result = env.orch("submit", str(bad))
    assert result.exit_code == 2
    assert "image" in result.stderr
    assert env.kube.requests() == []


def test_dry_run_client_prints_the_rendered_objects_and_sends_nothing(env, job_file):
    result = env.orch("submit", str(job_file), "--dry-run=client")
    assert result.exit_code == 0, result.stderr
    assert list(yaml.safe_load_all(result.stdout)) == rendered(job_file)
    assert env.kube.requests() == []
    as_json = env.orch("submit", str(job_file), "--dry-run=client", "-n", "other", "-o", "json")
    assert json.loads(as_json.stdout)["items"] == rendered(job_file, namespace="other")


def test_dry_run_server_validates_but_stores_nothing(env, job_file):
    result = env.orch("submit", str(job_file), "--dry-run=server")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0] == "pytorchjob.kubeflow.org/demo created (server dry run)"
    posts = env.kube.requests("post")
    assert len(posts) == 3 and all(r.params.get("dryRun") == "All" for r in posts)
    assert env.kube.names(JOBS) == [] and env.kube.names(CONFIGMAPS) == []


def test_pods_of_status_are_selected_by_the_operator_label(env, job_file):
    env.orch("submit", str(job_file))
    env.kube.add_pod(NS, "demo", "master", 0)
    env.kube.add_pod(NS, "demo-two", "master", 0)  # another job whose name starts the same
    state = json.loads(env.orch("status", "demo", "-o", "json").stdout)
    assert [p["name"] for p in state["pods"]] == ["demo-master-0"]
    assert env.kube.get(PODS, NS, "demo-two-master-0") is not None


def test_unauthorized_says_credentials(env):
    env.kube.fail("get", "/apis/kubeflow.org/v1/namespaces/team-a/pytorchjobs", 401, message="Unauthorized")
    result = env.orch("list")
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: unauthorized: the API server at {env.kube.url} (context dev) rejected orch's credentials "
        "(list pytorchjobs.kubeflow.org): Unauthorized. Check the kubeconfig user/token (is it expired?)"
    )


def test_list_selects_by_label_within_orchs_jobs(env, job_file):
    """`orch list -l` (a cluster sweep's trials: orch.dev/sweep=NAME) narrows orch's own selection; the
    emulator applies the label selector as the API server does."""
    for name, team in (("alpha", "a"), ("beta", "b")):
        result = env.orch("submit", str(job_file), "--set", f"name={name}", "--set", f"labels.team={team}")
        assert result.exit_code == 0, result.output + result.stderr
    listed = env.orch("list", "-l", "team=b", "-o", "json")
    assert listed.exit_code == 0, listed.output + listed.stderr
    assert [row["name"] for row in json.loads(listed.stdout)] == ["beta"]
    selectors = {r.url.query.get("labelSelector") for r in env.kube.requests("get", path=r".*/pytorchjobs")}
    assert selectors == {"app.kubernetes.io/managed-by=orch,team=b"}
