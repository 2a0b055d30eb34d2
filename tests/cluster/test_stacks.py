"""`orch stacks NAME` of a cluster job, where it cannot ask the ranks: a job that is not running, a job without
output.url (the `kubectl exec` command of each pod instead), a bad --timeout. The emulator holds the job; the
test plays the training operator: `Created`, then `Running` while the Master is active (kubeflow/training-
operator pkg/apis/kubeflow.org/v1/common_types.go, pytorchjob_controller.go; shared notes, pytorchjob.md §4).
Asking a running job's ranks through its store: tests/cluster/test_stacks_through_the_store.py."""

from __future__ import annotations

import pytest

from orchestrator import api
from orchestrator.errors import UsageError

NS = "team-a"  # the env fixture's current namespace


def test_a_job_that_is_not_running_is_one_line(env, job_file):
    assert env.orch("submit", str(job_file)).exit_code == 0
    env.kube.set_conditions(NS, "demo", ("Created", "True"))
    result = env.orch("stacks", "demo")
    assert result.exit_code == 1
    assert result.stderr == (
        "error: job demo is Created, not Running: orch stacks asks the ranks of a running job\n"
    )
    assert result.stdout == ""


def test_a_job_without_output_url_names_the_kubectl_exec_of_each_running_pod(env, job_file):
    assert env.orch("submit", str(job_file)).exit_code == 0  # no output: the outputs stay in the pods
    env.kube.set_conditions(NS, "demo", ("Created", "True"), ("Running", "True"))
    env.kube.add_pod(NS, "demo", "master", 0)
    env.kube.add_pod(NS, "demo", "worker", 0)
    env.kube.add_pod(NS, "demo", "worker", 1, state="waiting")  # not running: nothing to exec into
    result = env.orch("stacks", "demo")
    assert result.exit_code == 1
    assert result.stderr == (
        "error: job demo has no output.url, the object store through which orch stacks asks its ranks: ask "
        "each running pod with kubectl exec instead (needs pods/exec, which orch's Role leaves out)\n"
    )
    assert result.stdout.splitlines() == [  # to copy
        "kubectl exec -n team-a demo-master-0 -c pytorch -- python -m orchestrator.stacks",
        "kubectl exec -n team-a demo-worker-0 -c pytorch -- python -m orchestrator.stacks",
    ]
    assert not env.kube.requests("post", r"/api/v1/namespaces/team-a/pods/.*/exec")  # nothing was exec'd


def test_a_missing_job_and_a_bad_timeout(env):
    missing = env.orch("stacks", "nope")
    assert missing.exit_code == 1 and missing.stderr.startswith("error: job nope not found"), missing.stderr
    zero = env.orch("stacks", "demo", "--timeout", "0")
    assert zero.exit_code == 2
    assert zero.stderr == (
        "error: Invalid value for '--timeout': must be longer than 0 seconds (see orch stacks --help)\n"
    )
    assert not env.kube.requests("get", r"/apis/kubeflow\.org/v1/namespaces/team-a/pytorchjobs/demo")


def test_the_python_api_checks_its_timeout_before_asking(env):
    client = api.Client(kubeconfig=str(env.kubeconfig))
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(UsageError, match="^timeout: .* is not a number of seconds above 0$"):
            client.stacks("demo", timeout=bad)
    with pytest.raises(TypeError, match=r"^Client.stacks\(\): timeout must be seconds, not str$"):
        client.stacks("demo", timeout="30s")  # type: ignore[arg-type]
    assert env.kube.requests() == []
