"""`orch logs JOB -f` notices the end (#33): the job has finished and its containers have terminated, so it
returns, whether or not the log streams end by themselves.

The kubelet ends a followed log only when it next checks the container's state (every 5 s,
pkg/kubelet/kuberuntime/logs/logs.go `stateCheckPeriod`), and an API server or proxy in between may hold a
stream open longer. The emulator's log endpoint stands in for the slowest of those: its followed stream of a
container that exited stays open until the test ends the log, which these tests never do. The test plays the
training operator (the job's conditions) and the kubelet (the pod's container state), as tests/fakes/kube.py
does. The follower is called through orchestrator.cluster with a drain limit of an hour, so a follower that
waits for the streams instead of noticing the end shows as a hang (the watchdog), not as a slow pass.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from orchestrator import cluster
from tests.fakes.cli import Env

NS = "team-a"
HOUR = 3600.0


def follow(env: Env, **options: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """`stream_logs(..., follow=True)` on a thread, as `orch logs -f` calls it; its lines and outcome."""
    connected = cluster.connect(cluster.Target(kubeconfig=str(env.kubeconfig)), lean=True)
    box: dict[str, Any] = {"lines": []}

    def run() -> None:
        try:
            box["job"] = cluster.stream_logs(connected, "demo", follow=True, drain_seconds=HOUR,
                                             emit=lambda label, line: box["lines"].append(f"[{label}] {line}"),
                                             **options)  # fmt: skip
        except Exception as e:  # the test reports it
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def until(predicate: Any, what: str, timeout: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.mark.parametrize("breaks", [True, False], ids=["stream-breaks-at-exit", "stream-stays-open"])
def test_logs_follow_returns_once_the_job_finished_and_its_container_exited(
    env, job_file, monkeypatch, breaks
):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ORCH_POLL_SECONDS", "0.05")
    kube = env.kube
    assert env.orch("submit", str(job_file)).exit_code == 0
    kube.set_conditions(NS, "demo", ("Created", "True"), ("Running", "True"))
    master = kube.add_pod(NS, "demo", "master", 0)
    kube.write_log(NS, master, "step 1", "step 2")
    thread, box = follow(env)
    until(lambda: len(box["lines"]) == 2, "the first lines")

    kube.write_log(
        NS, master, "step 3", "final loss 0.01", broken=breaks
    )  # the last lines (the stream breaks)
    kube.set_pod_state(
        NS, master, "succeeded"
    )  # the container exits (its log is never ended here: see above)
    kube.set_conditions(NS, "demo", ("Running", "False"), ("Succeeded", "True"))

    thread.join(60)
    assert not thread.is_alive(), f"still following a job that has ended; printed {box['lines']}"
    assert "error" not in box, box.get("error")
    assert box["job"].phase == "Succeeded"
    assert box["lines"] == [
        "[master-0] step 1",
        "[master-0] step 2",
        "[master-0] step 3",
        "[master-0] final loss 0.01",
    ]


def test_logs_follow_still_follows_a_running_container_after_the_job_finished_elsewhere(
    env, job_file, monkeypatch
):  # type: ignore[no-untyped-def]
    """Noticing the end is about containers that exited: a container still running when the job is marked
    finished (an operator that marks success on the master's exit) is read until its stream ends."""
    monkeypatch.setenv("ORCH_POLL_SECONDS", "0.05")
    kube = env.kube
    assert env.orch("submit", str(job_file)).exit_code == 0
    kube.set_conditions(NS, "demo", ("Created", "True"), ("Running", "True"))
    master, worker = kube.add_pod(NS, "demo", "master", 0), kube.add_pod(NS, "demo", "worker", 0)
    thread, box = follow(env)
    kube.write_log(NS, master, "master done")
    kube.write_log(NS, worker, "worker step 9")
    until(lambda: len(box["lines"]) == 2, "the first lines")
    kube.set_pod_state(NS, master, "succeeded")
    kube.set_conditions(NS, "demo", ("Running", "False"), ("Succeeded", "True"))
    kube.write_log(NS, worker, "worker's last line")
    until(lambda: "[worker-0] worker's last line" in box["lines"], "the running worker's line")
    assert thread.is_alive()  # the worker's stream is still open: its lines still come
    kube.end_log(NS, worker)  # the worker exits
    kube.set_pod_state(NS, worker, "succeeded")
    thread.join(60)
    assert not thread.is_alive()
    assert sorted(box["lines"]) == sorted(
        ["[master-0] master done", "[worker-0] worker step 9", "[worker-0] worker's last line"]
    )
