"""orchestrator.api given what a notebook or a pipeline gets wrong (#33): arguments of the wrong type, no
kubeconfig at all, the same job submitted from two threads at once. Against the API emulator (tests/fakes/),
talked to by the unmodified official client; the emulator has no controllers and none are needed here."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from orchestrator import api, cluster
from tests.fakes.cli import FAST, run_orch, write_kubeconfig
from tests.fakes.emulator import CONFIGMAPS, JOBS, PODMONITORS, TRAININGRUNTIMES, TRAINJOBS, serve

NS = "team-a"
JOB = {"name": "demo", "image": "registry.example/trainer:1", "train": {"task": "digits", "max_steps": 10}}


@pytest.fixture
def user_env(env, monkeypatch):  # type: ignore[no-untyped-def]
    for key, value in env.vars.items():
        monkeypatch.setenv(key, value)
    return env


def _wrong_types(job: Any) -> list[tuple[Any, str]]:
    """(a call with one argument of the wrong type, the start of the TypeError it must raise)."""
    client = api.Client()
    return [
        (lambda: api.load_job({"name": "demo"}, overrides="nodes=2"), "load_job(): overrides must be a list of str, not str"),
        (lambda: api.load_job(42), "load_job(): source must be a path or a mapping, not int"),
        (lambda: api.load_job("job.yaml", where="cloud"), "load_job(): where must be"),
        (lambda: api.render({"name": "demo"}), "render(): job must be a JobSpec"),
        (lambda: api.run_local(job, output_dir={"path": "x"}), "run_local(): output_dir must be a path or None, not dict"),
        (lambda: api.Client(kubeconfig={"path": "x"}), "Client(): kubeconfig must be a path or None, not dict"),
        (lambda: api.Client(namespace=7), "Client(): namespace must be a namespace (str) or None, not int"),
        (lambda: api.Client(request_timeout="60"), "Client(): request_timeout must be seconds or None, not str"),
        (lambda: api.Build(job_file={"x": 1}), "Build(): job_file must be a path, not dict"),
        (lambda: api.Build(build_args="A=1"), "Build(): build_args must be a list of str, not str"),
        (lambda: api.build_image(7), "build_image(): folder must be a path, not int"),
        (lambda: api.build_image(job={"name": "demo"}), "build_image(): job must be a JobSpec"),
        (lambda: api.build_image(build_args="A=1", dry_run=True), "build_image(): build_args must be a list of str"),
        (lambda: api.build_image(tool=["buildah"], dry_run=True), "build_image(): tool must be a str, not list"),
        (lambda: client.submit("job.yaml"), "Client.submit(): job must be a JobSpec"),
        (lambda: client.submit(job, replace="yes"), "Client.submit(): replace must be a bool, not str"),
        (lambda: client.submit(job, dry_run=True), "Client.submit(): dry_run must be None, 'client' or 'server'"),
        (lambda: client.status(7), "Client.status(): name must be a job name (str), not int"),
        (lambda: client.status(None), "Client.status(): name must be a job name (str), not NoneType"),
        (lambda: client.wait("demo", timeout="2h"), "Client.wait(): timeout must be seconds or None, not str"),
        (lambda: client.wait("demo", timeout=True), "Client.wait(): timeout must be seconds or None, not bool"),
        (lambda: client.delete(b"demo"), "Client.delete(): name must be a job name (str), not bytes"),
        (lambda: client.logs("demo", emit="print"), "Client.logs(): emit must be a function of (label, line), not str"),
        (lambda: client.logs("demo", emit=print, rank="0"), "Client.logs(): rank must be a node rank (int), not str"),
        (lambda: client.logs("demo", emit=print, ranks=[0, 1]), "Client.logs(): ranks must be a set of node ranks, not list"),
        (lambda: client.logs("demo", emit=print, lines=5), "Client.logs(): unexpected keyword 'lines'"),
        (lambda: client.list(all_namespaces="yes"), "Client.list(): all_namespaces must be a bool, not str"),
    ]  # fmt: skip


def test_a_wrong_type_is_a_type_error_naming_the_parameter_and_sends_nothing(user_env):  # type: ignore[no-untyped-def]
    job = api.load_job(JOB)
    for call, message in _wrong_types(job):
        with pytest.raises(TypeError) as raised:
            call()
        assert str(raised.value).startswith(message), (message, str(raised.value))
        # raised by orchestrator.api itself, at the call: not from deep inside the client or pydantic
        assert raised.traceback[-1].path.name == "api.py", (message, raised.traceback[-1].path)
    assert user_env.kube.requests() == []


def test_no_kubeconfig_is_the_same_one_line_error_as_the_cli(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    for key in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    cli = run_orch("status", "demo")
    assert cli.returncode == 2
    job = api.load_job(JOB)
    for call in (lambda: api.Client().status("demo"), lambda: api.Client().submit(job), api.Client().list):
        with pytest.raises(cluster.KubeconfigError) as raised:
            call()
        assert f"error: {raised.value}\n" == cli.stderr
        assert raised.value.exit_code == 2


@pytest.mark.parametrize("shared", [True, False], ids=["one-client", "a-client-each"])
@pytest.mark.parametrize("job_api", ["pytorchjob", "trainjob"])
def test_the_same_job_from_two_threads_is_created_once(tmp_path, monkeypatch, shared, job_api):  # type: ignore[no-untyped-def]
    """Both threads get past the "does it exist" check (its first two answers are 404 whatever the timing:
    the race's window held open); the API server creates the job (and, for a TrainJob, its TrainingRuntime,
    created first) for one of them: the other gets "already exists" and deletes nothing of the winner's."""
    with serve(trainer=job_api == "trainjob", operator=job_api == "pytorchjob") as kube:
        kubeconfig = write_kubeconfig(tmp_path / "kc", kube.url, contexts={"dev": NS}, current="dev")
        for key, value in {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), **FAST}.items():
            monkeypatch.setenv(key, value)
        job = api.load_job({**JOB, "api": job_api}, where="cluster")
        plural = "pytorchjobs" if job_api == "pytorchjob" else "trainjobs"
        kube.fail("get", rf"/apis/[^/]+/[^/]+/namespaces/{NS}/{plural}/demo", 404, times=2)
        one = api.Client()
        clients = [one, one] if shared else [api.Client(), api.Client()]
        start = threading.Barrier(2)
        outcomes: list[Any] = [None, None]

        def submit(index: int) -> None:
            start.wait()
            try:
                outcomes[index] = clients[index].submit(job)
            except Exception as e:  # what the loser gets is the point of the test
                outcomes[index] = e

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        won = [o for o in outcomes if isinstance(o, api.Submitted)]
        lost = [o for o in outcomes if not isinstance(o, api.Submitted)]
        assert len(won) == 1 and len(lost) == 1, outcomes
        assert isinstance(lost[0], cluster.AlreadyExists), repr(lost[0])
        assert str(lost[0]).startswith(f'job demo already exists in namespace "{NS}"'), str(lost[0])
        resource = JOBS if job_api == "pytorchjob" else TRAINJOBS
        assert kube.names(resource, NS) == ["demo"]
        stored = {"pytorchjob.kubeflow.org": JOBS, "trainjob.trainer.kubeflow.org": TRAINJOBS,
                  "trainingruntime.trainer.kubeflow.org": TRAININGRUNTIMES, "configmap": CONFIGMAPS,
                  "podmonitor.monitoring.coreos.com": PODMONITORS}  # fmt: skip
        for ref in won[0].created:  # the loser's rollback deleted nothing of the winner's
            kind, name = ref.split("/")
            assert kube.get(stored[kind], NS, name) is not None, ref
