"""`orch logs` and `orch wait` while the test, playing the training operator and the kubelet, runs a job."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time

import pytest

from tests.fakes.emulator import JOBS, PODS

NS = "team-a"


def start_job(env, job_file, *, pods=(("master", 0), ("worker", 0))):
    assert env.orch("submit", str(job_file)).exit_code == 0
    env.kube.set_conditions(NS, "demo", ("Created", "True"), ("Running", "True"))
    return [env.kube.add_pod(NS, "demo", role, index) for role, index in pods]


class Follower:
    """`orch ...` in its own process (a real stdout stream), read line by line as it prints."""

    def __init__(self, env, *args):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *args],
            env={**os.environ, **env.vars},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()

    def _pump(self):
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    # Deadlines for a condition, not timings: a Python start with the kubernetes import took > 20 s on a loaded
    # 2-core machine (docs/testing.md), so they are set where only a hang reaches them.
    def expect(self, *wanted, timeout=120):
        """Wait until every wanted line was printed (any order)."""
        deadline = time.monotonic() + timeout
        while not set(wanted) <= set(self.seen):
            try:
                self.seen.append(self.lines.get(timeout=max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                pytest.fail(f"never printed {set(wanted) - set(self.seen)}; got {self.seen}")

    def finish(self, timeout=120):
        """The exit code and stderr, once the process has ended by itself."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            pytest.fail(f"did not end within {timeout}s; printed {self.seen}")
        self.pump.join(5)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return code, self.process.stderr.read()


def test_logs_of_all_pods_merged_and_followed_until_the_job_succeeds(env, job_file):
    kube = env.kube
    master, worker0 = start_job(env, job_file)
    kube.add_pod(NS, "demo", "worker", 1, state="waiting")  # not scheduled yet
    kube.write_log(NS, master, "step 1 loss 2.30", "step 2 loss 2.10")
    kube.write_log(NS, worker0, "worker 0 ready")

    follower = Follower(env, "logs", "demo", "-f")
    follower.expect("[master-0] step 1 loss 2.30", "[master-0] step 2 loss 2.10", "[worker-0] worker 0 ready")

    kube.write_log(NS, worker0, "worker 0 step 1")
    kube.set_pod_state(NS, "demo-worker-1", "running")  # the late pod starts: picked up
    kube.write_log(NS, "demo-worker-1", "worker 1 ready")
    kube.write_log(NS, master, "step 3 loss 1.90")
    follower.expect("[worker-0] worker 0 step 1", "[worker-1] worker 1 ready", "[master-0] step 3 loss 1.90")

    kube.write_log(NS, master, "training done")
    for pod in (master, worker0, "demo-worker-1"):
        kube.end_log(NS, pod)
        kube.set_pod_state(NS, pod, "succeeded")
    kube.set_conditions(NS, "demo", ("Running", "False"), ("Succeeded", "True"))

    code, stderr = follower.finish()
    assert code == 0, stderr
    assert "[worker-1] waiting for demo-worker-1 to start (Pending)" in stderr
    master_lines = [line for line in follower.seen if line.startswith("[master-0]")]
    assert master_lines == [
        "[master-0] step 1 loss 2.30",
        "[master-0] step 2 loss 2.10",
        "[master-0] step 3 loss 1.90",
        "[master-0] training done",
    ]
    assert sorted(follower.seen) == sorted(
        master_lines
        + ["[worker-0] worker 0 ready", "[worker-0] worker 0 step 1", "[worker-1] worker 1 ready"]
    )  # every line exactly once


def test_logs_follow_picks_up_a_restarted_container(env, job_file):
    kube = env.kube
    (master,) = start_job(env, job_file, pods=(("master", 0),))
    kube.write_log(NS, master, "attempt 1 step 1")
    follower = Follower(env, "logs", "demo", "--follow")
    follower.expect("[master-0] attempt 1 step 1")

    kube.write_log(NS, master, "CUDA error: an illegal memory access")
    kube.restart_container(NS, master, reason="Error", exit_code=1)
    kube.set_conditions(NS, "demo", ("Running", "False"), ("Restarting", "True"))
    kube.write_log(NS, master, "attempt 2 resumed from checkpoint step 1")
    follower.expect(
        "[master-0] CUDA error: an illegal memory access",
        "[master-0] attempt 2 resumed from checkpoint step 1",
    )

    kube.end_log(NS, master)
    kube.set_pod_state(NS, master, "succeeded", restarts=1)
    kube.set_conditions(NS, "demo", ("Restarting", "False"), ("Succeeded", "True"))
    code, stderr = follower.finish()
    assert code == 0, stderr
    assert "[master-0] container restarted (restart 1)" in stderr
    assert follower.seen == [
        "[master-0] attempt 1 step 1",
        "[master-0] CUDA error: an illegal memory access",
        "[master-0] attempt 2 resumed from checkpoint step 1",
    ]


def test_submit_follow_streams_and_exits_with_the_job_outcome(env, job_file):
    kube = env.kube
    follower = Follower(env, "submit", str(job_file), "--follow")
    follower.expect("pytorchjob.kubeflow.org/demo created")
    kube.set_conditions(NS, "demo", ("Created", "True"), ("Running", "True"))
    master = kube.add_pod(NS, "demo", "master", 0)
    kube.write_log(NS, master, "Traceback (most recent call last):", "RuntimeError: NCCL timeout")
    follower.expect("[master-0] RuntimeError: NCCL timeout")
    kube.end_log(NS, master)
    kube.set_pod_state(NS, master, "failed")
    kube.set_conditions(
        NS, "demo", ("Failed", "True", "PyTorchJob demo is failed because 1 Master replica(s) failed.")
    )
    code, stderr = follower.finish()
    assert code == 1
    assert stderr.strip().splitlines()[-1] == (
        "job demo failed: PyTorchJobFailed: PyTorchJob demo is failed because 1 Master replica(s) failed."
    )


def test_logs_without_follow_rank_pod_tail_since(env, job_file):
    kube = env.kube
    master, worker0, worker1 = start_job(env, job_file, pods=(("master", 0), ("worker", 0), ("worker", 1)))
    an_hour_ago = time.time() - 3600  # a time, not a sleep: --since below splits the lines by it
    kube.write_log(NS, master, "m1", "m2", "m3", at=an_hour_ago)
    kube.write_log(NS, worker0, "w0-1", at=an_hour_ago)
    kube.write_log(NS, worker1, "w1-1", "w1-2", at=an_hour_ago)

    everything = env.orch("logs", "demo")
    assert everything.exit_code == 0, everything.stderr
    assert everything.stdout.splitlines() == [
        "[master-0] m1",
        "[master-0] m2",
        "[master-0] m3",
        "[worker-0] w0-1",
        "[worker-1] w1-1",
        "[worker-1] w1-2",
    ]
    assert env.orch("logs", "demo", "--rank", "2").stdout.splitlines() == [
        "[worker-1] w1-1",
        "[worker-1] w1-2",
    ]
    assert env.orch("logs", "demo", "--pod", worker0).stdout.splitlines() == ["[worker-0] w0-1"]
    assert env.orch("logs", "demo", "--tail", "1").stdout.splitlines() == [
        "[master-0] m3",
        "[worker-0] w0-1",
        "[worker-1] w1-2",
    ]
    kube.write_log(NS, master, "m4 (recent)")
    assert env.orch("logs", "demo", "--since", "10m").stdout.splitlines() == ["[master-0] m4 (recent)"]

    both = env.orch("logs", "demo", "--rank", "0", "--pod", master)
    assert both.exit_code == 2 and "use one of them" in both.stderr
    missing = env.orch("logs", "nope")
    assert missing.exit_code == 1
    assert missing.stderr.strip() == (
        'error: job nope not found in namespace "team-a" '
        "(no pytorchjobs.kubeflow.org or trainjobs.trainer.kubeflow.org of that name)"
    )


def _later(seconds, fn, *args, **kwargs):
    timer = threading.Timer(seconds, fn, args, kwargs)
    timer.start()
    return timer


def test_wait_succeeded(env, job_file):
    start_job(env, job_file)
    timer = _later(0.3, env.kube.set_conditions, NS, "demo", ("Running", "False"), ("Succeeded", "True"))
    result = env.orch("wait", "demo", "--timeout", "30s")
    timer.join()
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines() == ["demo: Running", "demo: Succeeded", "job demo succeeded"]


def test_wait_failed_prints_the_condition(env, job_file):
    start_job(env, job_file)
    message = "PyTorchJob demo is failed because 1 Worker replica(s) failed."
    timer = _later(0.3, env.kube.set_conditions, NS, "demo", ("Failed", "True", message))
    result = env.orch("wait", "demo")
    timer.join()
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == f"job demo failed: PyTorchJobFailed: {message}"


def test_wait_timeout_exits_124(env, job_file):
    start_job(env, job_file)
    started = time.monotonic()
    result = env.orch("wait", "demo", "--timeout", "1s")
    assert result.exit_code == 124
    assert 1 <= time.monotonic() - started < 10
    assert result.stderr.splitlines()[-1] == "timed out after 1s waiting for job demo"


def test_wait_exit_code_from_a_real_process(env, job_file):
    """The console script itself (not CliRunner) returns 124, with one line and no traceback."""
    start_job(env, job_file)
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "wait", "demo", "--timeout", "1"],
        env={**os.environ, **env.vars},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 124
    assert "Traceback" not in result.stderr
    assert env.kube.get(JOBS, NS, "demo") is not None and env.kube.get(PODS, NS, "demo-master-0") is not None


def test_logs_follow_reports_a_forbidden_log(env, job_file):
    (master,) = start_job(env, job_file, pods=(("master", 0),))
    env.kube.fail(
        "get",
        f"/api/v1/namespaces/{NS}/pods/{master}/log",
        403,
        times=100,
        message=f'pods "{master}" is forbidden: User "tester" cannot get resource "pods/log"',
    )
    result = env.orch("logs", "demo", "-f")
    assert result.exit_code == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(f'error: forbidden: you may not get pods/log {master} in namespace "team-a"')
    )
