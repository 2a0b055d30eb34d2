"""Cluster faults (issue #12): every one ends in one `error:` line, leaves nothing half-done, leaks nothing.

The API server is the kmock emulator over real HTTP, driven by the unmodified official client; the test
plays the operator and injects the faults a real cluster produces (a hung or slow answer, a broken log
stream, an HTML login page, malformed objects). Commands that must be interrupted or can hang run as real
processes (`python -m orchestrator`), so signals and timeouts are the real ones.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

from tests.cluster.test_follow import Follower
from tests.fakes.cli import write_kubeconfig
from tests.fakes.emulator import CONFIGMAPS, JOBS, PODMONITORS, PODS

NS = "team-a"
JOBS_PATH = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
CONFIGMAPS_PATH = f"/api/v1/namespaces/{NS}/configmaps"
PODMONITORS_PATH = f"/apis/monitoring.coreos.com/v1/namespaces/{NS}/podmonitors"


def orch_process(env, *args, extra_env=None):
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        env={**os.environ, **env.vars, **(extra_env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_orch(env, *args, extra_env=None, timeout=120):
    """A real `orch` process; `timeout` is far above what the fixed code needs (no timing assertions)."""
    process = orch_process(env, *args, extra_env=extra_env)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"orch {' '.join(args)} still running after {timeout}s: {err}")
    return process.returncode, out, err


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def wait_until(predicate, timeout=60, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


# --- interruption ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_submit_rolls_back(env, job_file, sig, code):
    """Ctrl-C (or a SIGTERM from CI) after the job was created: the job is deleted again, as on an API error."""
    kube = env.kube
    kube.hang("post", CONFIGMAPS_PATH)  # the ConfigMap create never answers: the user gives up
    process = orch_process(env, "submit", str(job_file))
    wait_until(lambda: kube.requests("post", CONFIGMAPS_PATH), what="the ConfigMap create")
    assert kube.names(JOBS, NS) == ["demo"]
    process.send_signal(sig)
    out, err = process.communicate(timeout=120)
    assert process.returncode == code, err
    assert one_error_line(err) == (
        f"error: interrupted ({signal.Signals(sig).name}); rolled back: deleted pytorchjob.kubeflow.org/demo"
    )
    assert kube.names(JOBS) == [] and kube.names(CONFIGMAPS) == [] and kube.names(PODMONITORS) == []
    assert out.splitlines() == []  # nothing was reported as created


def test_interrupted_submit_also_removes_an_object_whose_create_was_in_flight(env, job_file):
    """The ConfigMap create reached the server, which stored it but had not answered when Ctrl-C came."""
    kube = env.kube
    kube.hang("post", CONFIGMAPS_PATH, after=True)  # stored, answer never sent
    process = orch_process(env, "submit", str(job_file))
    wait_until(lambda: kube.names(CONFIGMAPS, NS) == ["demo-config"], what="the ConfigMap to be stored")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert one_error_line(err) == (
        "error: interrupted (SIGINT); rolled back: deleted configmap/demo-config, pytorchjob.kubeflow.org/demo"
    )
    assert kube.names(JOBS) == [] and kube.names(CONFIGMAPS) == []


# --- a create that succeeded but timed out -----------------------------------------------------------------


def test_create_that_timed_out_but_succeeded_is_recognised(env, job_file):
    """The first ConfigMap create is stored but answered too late; the retry's 409 names our own object."""
    kube = env.kube
    slow = kube.hang("post", CONFIGMAPS_PATH, after=True)
    code, out, err = run_orch(env, "submit", str(job_file), extra_env={"ORCH_API_READ_TIMEOUT": "2"})
    assert code == 0, err
    assert out.splitlines() == [
        "pytorchjob.kubeflow.org/demo created",
        "configmap/demo-config created",
        "podmonitor.monitoring.coreos.com/demo created",
    ]
    assert slow.hits == 1 and len(kube.requests("post", CONFIGMAPS_PATH)) >= 2  # a retry met our object
    job, config = kube.get(JOBS, NS, "demo"), kube.get(CONFIGMAPS, NS, "demo-config")
    assert config["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    submission = job["metadata"]["annotations"]["orch.dev/submission"]
    assert config["metadata"]["annotations"]["orch.dev/submission"] == submission


def test_an_object_of_someone_else_with_the_same_name_is_not_taken_over(env, job_file):
    kube = env.kube
    kube.put(CONFIGMAPS, NS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "demo-config"}})
    result = env.orch("submit", str(job_file))
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == (
        'error: configmaps demo-config already exists in namespace "team-a" and was not created by this submit; '
        "remove it (kubectl -n team-a delete configmap/demo-config) or choose another job name "
        "(rolled back: deleted pytorchjob.kubeflow.org/demo)"
    )
    assert kube.names(JOBS) == [] and kube.names(CONFIGMAPS, NS) == ["demo-config"]  # theirs stays


# --- logs -f keeps the last lines --------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["logs", "submit"])
def test_follow_keeps_the_last_lines_when_the_stream_breaks_as_the_container_exits(env, job_file, command):
    kube = env.kube
    if command == "logs":
        assert env.orch("submit", str(job_file)).exit_code == 0
        follower = Follower(env, "logs", "demo", "-f")
    else:
        follower = Follower(env, "submit", str(job_file), "--follow")
        follower.expect("pytorchjob.kubeflow.org/demo created")
    kube.set_conditions(NS, "demo", ("Created", "True"), ("Running", "True"))
    master = kube.add_pod(NS, "demo", "master", 0)
    kube.write_log(NS, master, "step 1", "step 2")
    follower.expect("[master-0] step 1", "[master-0] step 2")

    kube.set_pod_state(NS, master, "succeeded")  # the container exits ...
    kube.write_log(NS, master, "step 3", "final loss 0.01", broken=True)  # ... and its stream breaks
    kube.end_log(NS, master)
    kube.set_conditions(NS, "demo", ("Running", "False"), ("Succeeded", "True"))

    code, err = follower.finish(timeout=60)
    assert code == 0, err
    assert "Traceback" not in err
    assert [line for line in follower.seen if line.startswith("[master-0]")] == [
        "[master-0] step 1",
        "[master-0] step 2",
        "[master-0] step 3",
        "[master-0] final loss 0.01",
    ]


# --- an unresponsive API server ----------------------------------------------------------------------------


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections (the kernel's backlog) and never answers a byte."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize(
    ("args", "extra_env"),
    [
        (("list", "--request-timeout", "3s"), {}),
        (("status", "demo"), {"ORCH_REQUEST_TIMEOUT": "3"}),
        (("submit", "JOB"), {"ORCH_REQUEST_TIMEOUT": "3"}),
    ],
)
def test_unresponsive_api_server_gives_up_at_one_deadline(
    env, job_file, tmp_path, silent_server, args, extra_env
):
    """Before: 6 attempts x 60 s read timeout + backoff, over six minutes. Now the command's deadline."""
    kubeconfig = write_kubeconfig(tmp_path / "silent", silent_server, contexts={"s": NS}, current="s")
    args = tuple(str(job_file) if a == "JOB" else a for a in args)
    code, out, err = run_orch(
        env, *args, "--kubeconfig", str(kubeconfig), extra_env={"ORCH_API_READ_TIMEOUT": "60", **extra_env}
    )
    assert code == 1
    assert one_error_line(err).startswith(
        f"error: the Kubernetes API at {silent_server} (context s) did not answer within 3s "
        "(--request-timeout, or $ORCH_REQUEST_TIMEOUT, sets how long orch waits)"
    )


# --- credentials -------------------------------------------------------------------------------------------


def exec_kubeconfig(path, url, script):
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": url}}],
        "users": [
            {
                "name": "sso",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": sys.executable,
                        "args": ["-c", script],
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [{"name": "sso", "context": {"cluster": "c", "user": "sso", "namespace": NS}}],
        "current-context": "sso",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.launch  # the kubernetes client runs the exec credential plugin (tests/tiers.py cannot see it)
def test_failing_credential_plugin_stops_before_any_request(env, tmp_path):
    script = "import sys; sys.stderr.write('SSO session expired: run `corp-login`'); sys.exit(3)"
    kubeconfig = exec_kubeconfig(tmp_path / "kc", env.kube.url, script)
    result = env.orch("list", "--kubeconfig", str(kubeconfig))
    assert result.exit_code == 2
    assert one_error_line(result.stderr) == (
        f"error: the credential plugin of kubeconfig user sso ({sys.executable}) failed: "
        "exec: process returned 3. SSO session expired: run `corp-login`"
    )
    assert env.kube.requests() == []  # nothing went out without credentials


@pytest.mark.launch  # the kubernetes client runs the exec credential plugin (tests/tiers.py cannot see it)
def test_working_credential_plugin_token_is_sent(env, tmp_path):
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "status": {"token": "from-the-plugin"},
    }
    script = f"import json; print(json.dumps({credential!r}))"
    kubeconfig = exec_kubeconfig(tmp_path / "kc", env.kube.url, script)
    result = env.orch("list", "--kubeconfig", str(kubeconfig))
    assert result.exit_code == 0, result.stderr
    assert env.kube.requests()[0].headers["Authorization"] == "Bearer from-the-plugin"


@pytest.mark.launch  # the kubernetes client runs the exec credential plugin (tests/tiers.py cannot see it)
def test_secrets_never_appear_in_messages(env, tmp_path):
    """A password in the server URL and the token stay out of every message, even one the server echoes."""
    url = env.kube.url.replace("http://", "http://admin:hunter2@")
    config = yaml.safe_load(env.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = url
    config["users"][0]["user"]["token"] = "tok-s3cr3t"
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(yaml.safe_dump(config))
    env.kube.fail("get", JOBS_PATH, 401, message="invalid bearer token tok-s3cr3t", times=10)
    env.kube.fail(
        "get", f"{JOBS_PATH}/demo", 500, message="upstream said Authorization: Bearer tok-s3cr3t", times=10
    )
    outputs = [
        env.orch("list", "--kubeconfig", str(kubeconfig)),
        env.orch("status", "demo", "--kubeconfig", str(kubeconfig)),
    ]
    dead = url.rsplit(":", 1)[0] + ":1"  # nothing listens on port 1: the "cannot reach" message
    config["clusters"][0]["cluster"]["server"] = dead
    kubeconfig.write_text(yaml.safe_dump(config))
    outputs.append(env.orch("list", "--kubeconfig", str(kubeconfig)))
    outputs.append(env.orch("doctor", "--cluster", "--kubeconfig", str(kubeconfig)))
    for result in outputs:
        text = result.output + result.stderr
        assert "hunter2" not in text and "tok-s3cr3t" not in text, text
        assert "Traceback" not in text
    assert "http://admin:***@127.0.0.1" in outputs[0].stderr  # still says which server, without the secret


# --- a rollback that fails ---------------------------------------------------------------------------------


def test_failed_rollback_says_exactly_what_was_left_and_how_to_remove_it(env, job_file):
    kube = env.kube
    kube.fail("post", PODMONITORS_PATH, 422, message="spec.podMetricsEndpoints: Invalid value", times=10)
    kube.fail("delete", f"{JOBS_PATH}/demo", 403, message="cannot delete", times=100)
    kube.fail("delete", f"{CONFIGMAPS_PATH}/demo-config", 503, times=100)
    result = env.orch("submit", str(job_file))
    assert result.exit_code == 1
    line = one_error_line(result.stderr)
    assert "nothing was created" not in line
    assert line.endswith(
        "(rollback FAILED: left configmap/demo-config, pytorchjob.kubeflow.org/demo in namespace team-a; "
        "remove them with: kubectl -n team-a delete configmap/demo-config pytorchjob.kubeflow.org/demo)"
    )
    assert kube.names(JOBS, NS) == ["demo"] and kube.names(CONFIGMAPS, NS) == ["demo-config"]


def test_partly_failed_rollback(env, job_file):
    kube = env.kube
    kube.fail("post", PODMONITORS_PATH, 422, message="bad", times=10)
    kube.fail("delete", f"{JOBS_PATH}/demo", 403, message="cannot delete", times=100)
    result = env.orch("submit", str(job_file))
    assert one_error_line(result.stderr).endswith(
        "(rolled back: deleted configmap/demo-config; rollback FAILED: left pytorchjob.kubeflow.org/demo in "
        "namespace team-a; remove it with: kubectl -n team-a delete pytorchjob.kubeflow.org/demo)"
    )


# --- answers that are not what the API promises ------------------------------------------------------------

HTML = "<!DOCTYPE html><html><body>Sign in to Corp SSO</body></html>"


@pytest.mark.parametrize(
    "args",
    [
        ("list",),
        ("status", "demo"),
        ("wait", "demo"),
        ("logs", "demo"),
        ("delete", "demo"),
        ("submit", "JOB"),
    ],
)
def test_an_html_page_instead_of_json(env, job_file, args):
    """A proxy or a login page answering 200 text/html in place of the API server."""
    assert env.orch("submit", str(job_file)).exit_code == 0
    env.kube.fail("get", ".*", 200, body=HTML, content_type="text/html", times=1000)
    env.kube.fail("delete", ".*", 200, body=HTML, content_type="text/html", times=1000)
    args = tuple(str(job_file) if a == "JOB" else a for a in args)
    result = env.orch(*args, "--replace") if args[0] == "submit" else env.orch(*args)
    assert result.exit_code == 1
    line = one_error_line(result.stderr)
    assert "is not a Kubernetes API answer (text/html: <!DOCTYPE html><html><body>Sign in to Corp SSO" in line
    assert "is the server URL in the kubeconfig right?" in line


@pytest.mark.parametrize("body", ["[1, 2]", '"text"', '{"items": 5}', '{"items": [1, "x", null]}', "{"])
def test_json_of_the_wrong_shape(env, body):
    env.kube.fail("get", JOBS_PATH, 200, body=body, content_type="application/json", times=10)
    result = env.orch("list")
    assert result.exit_code == 1
    assert "is not a Kubernetes API answer" in one_error_line(result.stderr)


MALFORMED_JOBS = [
    {"status": {"conditions": "Running"}},
    {"status": {"conditions": [None, 5, {"type": ["Running"], "status": "True"}]}},
    {"status": {"replicaStatuses": {"Worker": {"active": "many"}}, "startTime": 5}},
    {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": "3"}, "Master": []}}, "status": []},
    {"metadata": {"creationTimestamp": "yesterday", "labels": {"app.kubernetes.io/managed-by": "orch"}}},
]
MALFORMED_PODS = [
    {"status": {"containerStatuses": {"name": "pytorch"}}},
    {"status": {"containerStatuses": [{"name": "pytorch", "restartCount": "x", "state": "running"}]}},
    {"metadata": {"labels": {"training.kubeflow.org/replica-index": "first"}}, "spec": []},
    {"status": None},
]


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch: mappings merge, anything else replaces (kmock's patch cannot retype)."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        merged[key] = merge_patch(merged.get(key), value)
    return merged


def overwrite(kube, resource, name, patch):
    kube.put(resource, NS, merge_patch(kube.get(resource, NS, name), patch))


@pytest.mark.parametrize("job_patch", MALFORMED_JOBS)
def test_malformed_status_and_pod_fields(env, job_file, job_patch):
    """Whatever the operator and the kubelet wrote, status/list/logs/wait print what they can."""
    kube = env.kube
    assert env.orch("submit", str(job_file)).exit_code == 0
    kube.set_conditions(NS, "demo", ("Running", "True"))
    for index, pod_patch in enumerate(MALFORMED_PODS):
        pod = kube.add_pod(NS, "demo", "worker", index)
        kube.write_log(NS, pod, f"worker {index} step 1")
        kube.end_log(NS, pod)
        overwrite(kube, PODS, pod, pod_patch)
    overwrite(kube, JOBS, "demo", job_patch)
    for args in (
        ("status", "demo"),
        ("status", "demo", "-o", "yaml"),
        ("list", "-o", "wide"),
        ("logs", "demo"),
    ):
        result = env.orch(*args)
        assert result.exit_code == 0, (args, result.stderr)
        assert "Traceback" not in result.stderr
    waited = env.orch("wait", "demo", "--timeout", "1s")  # Running, or Unknown: not finished
    assert waited.exit_code == 124 and "Traceback" not in waited.stderr, waited.stderr
    overwrite(
        kube, JOBS, "demo", {"status": {"conditions": [{"type": "Failed", "status": "True", "message": 5}]}}
    )
    waited = env.orch("wait", "demo", "--timeout", "30s")
    assert waited.exit_code == 1 and waited.stderr.splitlines()[-1] == "job demo failed", waited.stderr


def test_malformed_list_items(env, job_file):
    """Items without a name or namespace are listed as unknown instead of breaking the sort."""
    env.kube.put(JOBS, NS, {"metadata": {"name": "a", "labels": {"app.kubernetes.io/managed-by": "orch"}}})
    env.kube.fail(
        "get",
        JOBS_PATH,
        200,
        body='{"kind": "PyTorchJobList", "items": [{"metadata": {"name": 5}}, {"metadata": null}, {}]}',
        content_type="application/json",
    )
    result = env.orch("list", "-o", "json")
    assert result.exit_code == 0, result.stderr


# --- kubeconfigs that are not kubeconfigs ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("clusters: [\n  token: tok-s3cr3t\n", ":3:1: not valid YAML"),
        ("- a\n- b\n", ": not a kubeconfig (a YAML list, not a mapping)"),
        ("just text tok-s3cr3t\n", ": not a kubeconfig (a YAML string, not a mapping)"),
        ("contexts: 5\ncurrent-context: x\n", ": contexts: not a list"),
        ("contexts: [5]\ncurrent-context: x\n", ": contexts[0]: not a mapping"),
        ("contexts: [{context: {}}]\ncurrent-context: x\n", ": contexts[0]: has no name"),
        (
            "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: [x]\n",
            ": current-context: not a string",
        ),
        (
            "contexts: [{name: x, context: {namespace: [a]}}]\ncurrent-context: x\n",
            ": contexts[0].context.namespace: not a string",
        ),
        ("contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n", "context x"),
        (
            "clusters: [{name: c, cluster: {}}]\nusers: [{name: u, user: {token: tok-s3cr3t}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
            "context x",
        ),
        ("\0\1\2", "not valid YAML"),
    ],
)
def test_a_broken_kubeconfig_is_one_line_exit_2(env, tmp_path, text, expected):
    kubeconfig = tmp_path / "broken"
    kubeconfig.write_text(text)
    for args in (("list",), ("status", "demo")):
        result = env.orch(*args, "--kubeconfig", str(kubeconfig))
        assert result.exit_code == 2, result.stderr
        line = one_error_line(result.stderr)
        assert line.startswith(f"error: kubeconfig {kubeconfig}"), line
        assert expected in line and "tok-s3cr3t" not in line, line
    assert env.kube.requests() == []


# --- --replace with a server dry run -----------------------------------------------------------------------


def test_replace_with_server_dry_run_says_what_it_would_delete_and_changes_nothing(env, job_file):
    kube = env.kube
    assert env.orch("submit", str(job_file)).exit_code == 0
    uid = kube.get(JOBS, NS, "demo")["metadata"]["uid"]
    result = env.orch("submit", str(job_file), "--replace", "--dry-run=server")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        "pytorchjob.kubeflow.org/demo deleted (server dry run)",
        "pytorchjob.kubeflow.org/demo created (server dry run)",
        "configmap/demo-config created (server dry run)",
        "podmonitor.monitoring.coreos.com/demo created (server dry run)",
    ]
    deletes = kube.requests("delete")
    assert len(deletes) == 1 and deletes[0].params.get("dryRun") == "All"
    assert kube.get(JOBS, NS, "demo")["metadata"]["uid"] == uid
    assert kube.names(CONFIGMAPS, NS) == ["demo-config"]


# --- any answer ----------------------------------------------------------------------------------------------

ODD_BODIES = [
    "null",
    "[]",
    "{}",
    '"a string"',
    '{"items": null}',
    '{"items": [{}]}',
    '{"items": [{"metadata": 5, "status": [], "spec": "x"}]}',
    '{"metadata": null, "status": 5, "spec": []}',
    '{"metadata": {"name": ["demo"], "uid": 7}, "status": {"conditions": [{"type": 1, "status": true}]}}',
    '{"resources": "pytorchjobs", "groups": {"name": 1}}',
    '{"kind": "Status", "status": "Failure", "code": 500, "message": 42}',
]


@pytest.mark.parametrize("body", ODD_BODIES)
def test_any_json_answer_to_every_request(env, job_file, body):
    """Every GET, POST and DELETE answered 200 with the same odd JSON: each command ends in a result or one
    error line."""
    for method in ("get", "post", "delete"):
        env.kube.fail(method, ".*", 200, body=body, times=10_000)
    commands = [
        ("status", "demo"),
        ("status", "demo", "-o", "json"),
        ("list", "-A", "-o", "wide"),
        ("logs", "demo"),
        ("wait", "demo", "--timeout", "1s"),
        ("delete", "demo"),
        ("submit", str(job_file)),
        ("submit", str(job_file), "--replace", "--dry-run=server"),
    ]
    for args in commands:
        result = env.orch(*args)
        assert result.exit_code in (0, 1, 124), (args, result.stderr, result.exception)
        assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
        assert "Traceback" not in result.stderr, (args, result.stderr)


@pytest.mark.parametrize(
    ("status", "body"),
    [(404, "[]"), (409, "<html>conflict</html>"), (403, '{"message": 5}'), (500, "null"), (401, "")],
)
def test_any_error_answer_to_every_request(env, job_file, status, body):
    for method in ("get", "post", "delete"):
        env.kube.fail(method, ".*", status, body=body, content_type="text/html", times=10_000)
    for args in (
        ("status", "demo"),
        ("list",),
        ("logs", "demo"),
        ("delete", "demo"),
        ("submit", str(job_file)),
    ):
        result = env.orch(*args)
        assert result.exit_code in (0, 1) and "Traceback" not in result.stderr, (args, result.exception)
        if result.exit_code:  # (a 404 on list means: that API is not installed, so no jobs)
            one_error_line(result.stderr)
