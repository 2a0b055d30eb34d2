"""Which cluster and namespace orch talks to (kubectl's rules), and `orch render | kubectl apply` on the same API."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import require_tool
from tests.fakes.cli import write_kubeconfig
from tests.fakes.emulator import CONFIGMAPS, JOBS, PODMONITORS


@pytest.mark.parametrize(
    ("args", "namespace"),
    [
        ((), "team-a"),  # the current context's namespace
        (("--context", "prod"), "team-b"),
        (("--context", "bare"), "default"),  # a context without a namespace
        (("--set", "namespace=ml"), "ml"),  # the job's namespace beats the context's
        (("--set", "namespace=ml", "-n", "override"), "override"),  # -n beats everything
    ],
)
def test_namespace_resolution(env, job_file, args, namespace):
    result = env.orch("submit", str(job_file), *args)
    assert result.exit_code == 0, result.stderr
    assert env.kube.names(JOBS) == ["demo"]
    assert env.kube.get(JOBS, namespace, "demo") is not None
    assert env.kube.get(CONFIGMAPS, namespace, "demo-config") is not None
    # and the commands that take a name find it there with the same flags
    flags = [a for a in args if a != "--set" and not a.startswith("namespace=")]
    assert (
        env.orch("status", "demo", *flags, *(["-n", namespace] if namespace == "ml" else [])).exit_code == 0
    )


def test_kubeconfig_flag_beats_the_environment(env, job_file, tmp_path):
    other = write_kubeconfig(tmp_path / "other", env.kube.url, contexts={"x": "from-flag"}, current="x")
    result = env.orch("submit", str(job_file), "--kubeconfig", str(other))
    assert result.exit_code == 0, result.stderr
    assert env.kube.get(JOBS, "from-flag", "demo") is not None


def test_kubeconfig_list_in_env_and_home_default(env, job_file, tmp_path):
    (env.home / ".kube").mkdir()
    write_kubeconfig(env.home / ".kube" / "config", env.kube.url, contexts={"h": "from-home"}, current="h")
    result = env.orch("submit", str(job_file), env={"KUBECONFIG": ""})
    assert result.exit_code == 0, result.stderr
    assert env.kube.get(JOBS, "from-home", "demo") is not None
    # $KUBECONFIG may list several files; missing ones are skipped, like kubectl
    listed = f"{tmp_path / 'missing'}{os.pathsep}{env.kubeconfig}"
    result = env.orch("list", "-o", "json", env={"KUBECONFIG": listed})
    assert result.exit_code == 0, result.stderr


def test_unknown_context_and_no_kubeconfig_are_usage_errors(env, job_file):
    result = env.orch("status", "demo", "--context", "nope")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: context 'nope' is not in kubeconfig {env.kubeconfig} (contexts: bare, dev, prod); "
        "pick one with --context"
    )
    nothing = env.orch("status", "demo", env={"KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""})
    assert nothing.exit_code == 2
    assert "no kubeconfig found (looked at --kubeconfig, $KUBECONFIG, ~/.kube/config)" in nothing.stderr
    assert env.kube.requests() == []


def test_unreachable_api_server_is_one_clear_line(env, tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = write_kubeconfig(
        tmp_path / "dead", f"http://127.0.0.1:{port}", contexts={"d": None}, current="d"
    )
    result = env.orch("list", "--kubeconfig", str(kubeconfig))
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"error: cannot reach the Kubernetes API at http://127.0.0.1:{port} (context d) after 1 attempt"
    )
    assert len(result.stderr.strip().splitlines()) == 1


def test_render_piped_to_kubectl_apply_then_orch_reads_it(env, job_file):
    kubectl = require_tool("kubectl")
    environment = {**os.environ, **env.vars}
    render = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "orch"), "render", str(job_file)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=True,
    )
    # --validate=false: the emulator serves no OpenAPI schema (validation is tested against the CRDs in tests/spec)
    applied = subprocess.run(
        [kubectl, "apply", "--validate=false", "-f", "-"],
        input=render.stdout,
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.splitlines() == [
        "configmap/demo-config created",
        "pytorchjob.kubeflow.org/demo created",
        "podmonitor.monitoring.coreos.com/demo created",
    ]
    assert env.kube.get(PODMONITORS, "team-a", "demo") is not None
    got = subprocess.run(
        [kubectl, "get", "pytorchjobs", "-o", "name"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )
    assert got.stdout.split() == ["pytorchjob.kubeflow.org/demo"]
    # orch sees the kubectl-created job as one of its own (the labels come from the render)
    env.kube.set_conditions("team-a", "demo", ("Created", "True"))
    listed = env.orch("list", "-o", "json")
    assert '"name": "demo"' in listed.stdout and '"phase": "Created"' in listed.stdout


@pytest.mark.parametrize("command", ["status", "list", "logs", "wait", "delete"])
def test_namespace_help_of_commands_without_a_job_file(env, command):
    help_text = " ".join(env.orch(command, "--help").stdout.split())
    assert "-n, --namespace TEXT Namespace. Default: the context's namespace, else `default`." in help_text
    assert "job file" not in help_text
