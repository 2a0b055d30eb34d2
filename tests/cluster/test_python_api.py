"""orchestrator.api, driven from Python the way docs/python-api.md shows it, against the API emulator.

The emulator has no controllers: where the training operator would mark the job Succeeded, the test does
(`kube.set_conditions`, as the operator writes them)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.errors import SpecError
from tests.fakes.emulator import JOBS

NS = "team-a"
DOC = Path(__file__).resolve().parents[2] / "docs" / "python-api.md"
JOB = "name: demo\nimage: registry.example/trainer:1\ntrain:\n  task: digits\n  batch_size: 64\n  max_steps: 10\n"


def documented_example() -> str:
    text = DOC.read_text(encoding="utf-8")
    found = re.search(r"## Submit a job and wait for it\n.*?```python\n(.*?)```", text, re.DOTALL)
    assert found, "docs/python-api.md lost its example"
    return found.group(1)


def operator_finishes(kube, name: str, *conditions: tuple[str, ...]) -> threading.Thread:  # type: ignore[no-untyped-def]
    """Once the job exists, mark it as the operator would: Running, then the given conditions."""

    def play() -> None:
        deadline = time.monotonic() + 30
        while kube.get(JOBS, NS, name) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        kube.set_conditions(NS, name, ("Created", "True"), ("Running", "True"))
        time.sleep(0.2)
        kube.set_conditions(NS, name, ("Running", "False"), *conditions)

    thread = threading.Thread(target=play, daemon=True)
    thread.start()
    return thread


def test_the_documented_example_submits_and_waits(env, tmp_path, monkeypatch, capsys):  # type: ignore[no-untyped-def]
    (tmp_path / "job.yaml").write_text(JOB)
    monkeypatch.chdir(tmp_path)
    for key, value in env.vars.items():
        monkeypatch.setenv(key, value)
    operator = operator_finishes(env.kube, "demo", ("Succeeded", "True"))
    exec(compile(documented_example(), str(DOC), "exec"), {})
    operator.join(30)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"submitted demo as a pytorchjob in {NS}"
    assert printed[-1] == "demo Succeeded"
    job = env.kube.get(JOBS, NS, "demo")
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2  # the override nodes=2 reached it


def test_a_dict_is_checked_like_a_file_and_a_bad_job_sends_nothing(env, monkeypatch):  # type: ignore[no-untyped-def]
    for key, value in env.vars.items():
        monkeypatch.setenv(key, value)
    job = api.load_job({"name": "demo", "image": "registry.example/trainer:1", "command": ["python", "x.py"]})
    assert api.render(job)[0]["kind"] == "PyTorchJob"
    with pytest.raises(SpecError, match=r"^--set nodes=0: nodes: Input should be greater than 0$"):
        api.load_job({"name": "demo", "command": ["x"]}, overrides=["nodes=0"])
    with pytest.raises(SpecError, match=r"^<job>: nodes: Input should be greater than 0$"):
        api.load_job({"name": "demo", "command": ["x"], "nodes": 0})
    with pytest.raises(SpecError, match="TrainJob"):
        api.Client().submit(job.model_copy(update={"ttl_after_finished": 60}), api="trainjob")
    assert env.kube.requests() == []  # refused before the cluster was asked anything


def test_wait_times_out_with_an_orch_error(env, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    for key, value in env.vars.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "job.yaml").write_text(JOB)
    client = api.Client()
    submitted = client.submit(api.load_job(tmp_path / "job.yaml"))
    assert submitted.created[0] == "pytorchjob.kubeflow.org/demo"
    with pytest.raises(api.WaitTimeout, match="^timed out after 0.3s waiting for job demo$") as timed_out:
        client.wait("demo", timeout=0.3)
    assert timed_out.value.exit_code == 124
    assert client.status("demo").phase in ("Pending", "Created")
    assert [row["name"] for row in client.list()] == ["demo"]
    assert client.delete("demo").name == "demo" and env.kube.get(JOBS, NS, "demo") is None
