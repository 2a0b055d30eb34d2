"""`orch sweep --cluster` against the Kubernetes API emulator (tests/fakes/, real HTTP through the unpatched
official client) and a real S3 server (moto, tests/s3server.py): one job per trial with the sweep's labels,
their results read from the store, a pruned trial stopped through the store and its job deleted, and a sweep
whose CLI is SIGKILLed, then run again: running trials re-attached, finished ones recorded, gone ones asked
again.

What cannot run here is played by the test (`Cluster`), as its upstream sources write it: the training
operator's conditions (tests/fakes/kube.py's set_conditions: type, status, reason PyTorchJob<Type>, as
kubeflow/training-operator's pkg/controller.v1/pytorch writes them), Kueue holding a queued job suspended until
it admits it (the job reconciler keeps runPolicy.suspend until the Workload is admitted:
kubernetes-sigs/kueue pkg/controller/jobframework/reconciler.go; the operator then reports Suspended, then
Running), and the trainer in the pods: objective.json and summary.json in the trial's prefix of the store
(ORCH_OUTPUT_URL), as orchestrator/trainer/objective.py and trainer/main.py upload them. The trainer's own side
of this (the upload, the prune watch, a real `orch run` pruned through the store, the MLflow run a trial's pods
create as the sweep's child) is tested at the end. Two tests need no store (the fast tier): a sweep continued
in another namespace or on another cluster, refused first; the MLflow variables of a trial's job.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator import api, outputs, storage
from orchestrator.sweep import spec
from orchestrator.sweep import study as studies
from tests.fakes.cli import FAST, run_orch, write_kubeconfig
from tests.fakes.emulator import CONFIGMAPS, JOBS, serve
from tests.s3server import s3_server
from tests.sweep.conftest import DIGITS_JOB, write_sweep

NS = "team-a"


def job_storing_at(base: str) -> dict[str, Any]:
    return {**DIGITS_JOB, "image": "registry.example/trainer:1", "output": {"url": base},
            "scheduling": {"queue": "team-queue"}}  # fmt: skip


SWEEP = """\
job: job.yaml
name: lr
objective: {metric: eval/loss, goal: minimize}
parameters:
  train.optimizer.lr: {type: float, low: 1.0e-4, high: 1.0, log: true}
max_trials: MAX
parallel: PARALLEL
"""


def sweep_text(max_trials: int, parallel: int, extra: str = "") -> str:
    return SWEEP.replace("MAX", str(max_trials)).replace("PARALLEL", str(parallel)) + extra


def value_of(lr: float) -> float:
    """What the test's trainer reports for a trial: best at lr 0.01."""
    return abs(math.log10(lr) + 2)


@pytest.fixture(scope="module")
def s3():  # type: ignore[no-untyped-def]
    with s3_server() as server:
        server.create_bucket("bkt")
        yield server


class Cluster:
    """What runs on a cluster besides the API server, played for the sweep's jobs (see the module's doc)."""

    def __init__(self, kube) -> None:  # type: ignore[no-untyped-def]
        self.kube = kube
        self.most_unfinished = 0

    def jobs(self) -> dict[str, dict[str, Any]]:
        found = {name: self.kube.get(JOBS, NS, name) for name in self.kube.names(JOBS, NS)}
        return {name: job for name, job in found.items() if job is not None}

    @staticmethod
    def true(job: dict[str, Any]) -> set[str]:
        return {c["type"] for c in (job.get("status") or {}).get("conditions") or [] if c["status"] == "True"}

    def unfinished(self) -> dict[str, dict[str, Any]]:
        jobs = {n: j for n, j in self.jobs().items() if not self.true(j) & {"Succeeded", "Failed"}}
        self.most_unfinished = max(self.most_unfinished, len(jobs))
        return jobs

    @staticmethod
    def env(job: dict[str, Any]) -> dict[str, str]:
        container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        return {item["name"]: item.get("value", "") for item in container["env"]}

    def lr(self, name: str) -> float:
        """The learning rate the trial's pods train with: its ConfigMap's train.json. `orch submit` creates it
        just after the job (cluster/objects.py: its ownerReference names the job's uid), so the pods wait for
        it, as the kubelet retries the mount."""
        deadline = time.monotonic() + 10
        while (config := self.kube.get(CONFIGMAPS, NS, f"{name}-config")) is None:
            assert time.monotonic() < deadline, f"no ConfigMap {name}-config"
            time.sleep(0.01)
        return float(json.loads(config["data"]["train.json"])["optimizer"]["lr"])

    def url(self, name: str) -> str:
        return self.env(self.kube.get(JOBS, NS, name))["ORCH_OUTPUT_URL"]

    def upload(self, name: str, file: str, data: dict[str, Any]) -> None:
        (storage.location(self.url(name)) / file).write_bytes(json.dumps(data).encode())

    def report(self, name: str, values: list[tuple[int, float]], *, final: float | None = None,
               pruned: bool = False) -> None:  # fmt: skip
        self.upload(name, outputs.OBJECTIVE, {
            "metric": "eval/loss", "values": [list(v) for v in values], "final": final, "pruned": pruned,
            "recorded": ["eval/accuracy", "eval/loss"],
        })  # fmt: skip

    def succeed(self, name: str, value: float, *, pruned_at: list[tuple[int, float]] | None = None) -> None:
        """The trainer's end (objective.json's final value, summary.json; a pruned run's values so far, no final
        value), then the operator's Succeeded."""
        if pruned_at is None:
            self.report(name, [(10, value * 2), (20, value)], final=value)
        else:
            self.report(name, pruned_at, pruned=True)
        pruned = {"pruned": True} if pruned_at is not None else {}
        self.upload(name, outputs.SUMMARY, {"job": name, "steps": 20, **pruned})
        self.kube.set_conditions(NS, name, ("Running", "False"), ("Succeeded", "True"))

    def run(self, name: str) -> None:
        self.kube.set_conditions(NS, name, ("Created", "True"), ("Running", "True"))

    def trains(self, name: str, job: dict[str, Any]) -> None:
        """A trial that trains to its end, a step each time it is looked at: Running, then Succeeded with the
        value its learning rate gets."""
        if "Running" in self.true(job):
            self.succeed(name, value_of(self.lr(name)))
        else:
            self.run(name)

    def queue(self, name: str) -> None:
        self.kube.set_conditions(NS, name, ("Created", "True"), ("Suspended", "True"))

    def admit(self, name: str) -> None:
        self.kube.set_conditions(NS, name, ("Suspended", "False"), ("Running", "True"))


@dataclass
class User:
    cluster: Cluster
    env: dict[str, str]
    """What the user's shell has: the kubeconfig, the store's credentials and endpoint."""
    base: str
    """The job's output.url: a prefix of the test's own in the module's store."""


@pytest.fixture
def user(s3, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The emulator, a kubeconfig whose context is in NS, and the store's credentials and endpoint in this
    process's environment (the sweep reads the store as the CLI would, with the shell's)."""
    with serve() as kube:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, contexts={"dev": NS}, current="dev")
        env = {**s3.env(), **FAST, "KUBECONFIG": str(kubeconfig)}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        yield User(Cluster(kube), env, f"s3://bkt/{tmp_path.name}")


def in_a_thread(path: Path, lines: list[str]) -> tuple[threading.Thread, dict[str, Any]]:
    """api.sweep on a thread of its own (no signal handlers there), polling the cluster and the store fast."""
    box: dict[str, Any] = {}

    def sweep() -> None:
        try:
            box["result"] = api.sweep(path, client=api.Client(), poll_seconds=0.05, notice=lines.append)
        except BaseException as error:  # noqa: BLE001 (raised again by `finished`)
            box["error"] = error

    thread = threading.Thread(target=sweep, daemon=True)
    thread.start()
    return thread, box


def finished(thread: threading.Thread, box: dict[str, Any]) -> Any:
    thread.join(5)
    assert not thread.is_alive(), "the sweep did not end"
    if "error" in box:
        raise box["error"]
    return box["result"]


def play_until_done(cluster: Cluster, thread: threading.Thread, step, timeout: float = 90) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while thread.is_alive():
        assert time.monotonic() < deadline, "the sweep did not finish"
        for name, job in cluster.unfinished().items():
            step(name, job)
        time.sleep(0.05)


def test_each_trial_is_one_labelled_job_queued_and_its_result_read_from_the_store(user, tmp_path):
    cluster, base = user.cluster, user.base
    path = write_sweep(tmp_path, sweep_text(max_trials=4, parallel=2), job=job_storing_at(base))
    lines: list[str] = []
    thread, box = in_a_thread(path, lines)

    def kueue_admits_one_at_a_time(name: str, job: dict[str, Any]) -> None:
        conditions = cluster.true(job)
        if not conditions:
            cluster.queue(name)
        elif "Running" in conditions:
            cluster.succeed(name, value_of(cluster.lr(name)))
        elif not any("Running" in cluster.true(j) for j in cluster.unfinished().values()):
            cluster.admit(name)  # the queue's quota holds one trial: the others wait, suspended

    play_until_done(cluster, thread, kueue_admits_one_at_a_time)
    result = finished(thread, box)

    assert [row.state for row in result.rows] == ["complete"] * 4
    for row in result.rows:
        assert row.value == value_of(row.params["train.optimizer.lr"])  # read from its trial's store prefix
    assert [row.value for row in result.rows] == sorted(row.value for row in result.rows)  # best first
    jobs = cluster.jobs()
    assert sorted(jobs) == [f"lr-trial-{n}" for n in range(4)]  # one job per trial, none twice
    for row in result.rows:
        name = f"lr-trial-{row.number}"
        assert row.run == name and cluster.lr(name) == row.params["train.optimizer.lr"]
        job = jobs[name]
        labels = {"orch.dev/sweep": "lr", "orch.dev/trial": str(row.number)}
        assert labels.items() <= job["metadata"]["labels"].items()
        assert (
            labels.items()
            <= job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["labels"].items()
        )
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-queue"
        assert job["spec"]["runPolicy"]["suspend"] is True  # Kueue decides when it starts
        env = cluster.env(job)
        assert env["ORCH_OUTPUT_URL"] == f"{base}/{name}"
        assert env["ORCH_OBJECTIVE"] == "eval/loss"
        assert env["ORCH_PRUNE_FILE"] == f"{base}/{name}/prune.request"
    assert (
        cluster.most_unfinished == 2
    )  # `parallel`: queued trials count, and no third is submitted meanwhile
    started = next(line for line in lines if line.startswith("trial 0 started: "))
    assert started.endswith(f"-> job lr-trial-0 ({base}/lr-trial-0/)")
    warnings = [line for line in lines if line.startswith("warning: ")]
    # what every trial's job risks (this job sets no resources) is said once, not once per trial
    assert len([w for w in warnings if "BestEffort" in w]) == 1 and len(warnings) == len(set(warnings))
    # the study says where its trials are: `orch sweep status` shows their jobs
    shown = run_orch("sweep", "status", str(path), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    header, *table = shown.stdout.splitlines()
    assert header.split() == ["TRIAL", "STATE", "EVAL/LOSS", "LR", "JOB"]
    assert table[0].split()[-1] == f"lr-trial-{result.best.number}"
    document = api.sweep_status(path, plot=False).to_json()
    assert document["where"] == "cluster"
    assert {t["job"] for t in document["trials"]} == set(jobs) and {
        t["run_dir"] for t in document["trials"]
    } == {None}


def test_a_hopeless_trial_is_pruned_through_the_store_and_its_job_deleted(user, tmp_path):
    cluster, base = user.cluster, user.base
    extra = "early_stopping: {name: median, min_trials: 1}\n"
    path = write_sweep(tmp_path, sweep_text(max_trials=3, parallel=1, extra=extra), job=job_storing_at(base))
    study = studies.open_study(spec.load_sweep(path, where="cluster"))
    for lr in (0.03, 0.02, 0.1):  # each better than the median before it, but the third: hopeless
        study.enqueue_trial({"train.optimizer.lr": lr})
    lines: list[str] = []
    thread, box = in_a_thread(path, lines)
    prune_requests: list[str] = []

    def loss(lr: float, step: int) -> float:
        return abs(lr - 0.01) * (4 - step) * (1000 if lr == 0.1 else 1)

    def trainer(name: str, job: dict[str, Any]) -> None:
        """Reports the loss at steps 1..3, one step a time, then ends; the hopeless trial ends as pruned once
        its prune request is in the store, as the trainer's stop path does."""
        lr, request = cluster.lr(name), storage.location(cluster.url(name)) / outputs.PRUNE_REQUEST
        cluster.run(name)
        for step in (1, 2, 3):
            so_far = [(s, loss(lr, s)) for s in range(1, step + 1)]
            cluster.report(name, so_far)
            deadline = time.monotonic() + (10 if lr == 0.1 else 0.3)  # time for the sweep to read and judge
            while time.monotonic() < deadline and not request.exists():
                time.sleep(0.05)
            if request.exists():
                prune_requests.append(name)
                cluster.succeed(name, loss(lr, step), pruned_at=so_far)
                return
        cluster.succeed(name, loss(lr, 3))

    play_until_done(cluster, thread, trainer)
    result = finished(thread, box)

    by_lr = {row.params["train.optimizer.lr"]: row for row in result.rows}
    assert by_lr[0.1].state == "pruned" and by_lr[0.1].step == 1  # judged at its first report
    assert by_lr[0.03].state == by_lr[0.02].state == "complete"
    assert prune_requests == ["lr-trial-2"]  # the request reached the trial's prefix, and only that one
    assert sorted(cluster.jobs()) == ["lr-trial-0", "lr-trial-1"]  # the pruned trial's job was deleted
    assert "trial 2 pruned at step 1: eval/loss 270" in lines


def test_a_killed_sweep_reattaches_running_trials_records_finished_ones_and_asks_gone_ones_again(
    user, tmp_path
):
    """`orch sweep --cluster` as a process, SIGKILLed once three trials are jobs; while no sweep runs, trial 0's
    job succeeds, trial 1's runs on, trial 2's is deleted. Run again, the sweep re-attaches trial 1 (its job
    not created again), records trial 0 as it ended, and fails trial 2 as interrupted and asks its values
    again; it ends with exactly max_trials trials counted."""
    cluster, env, base = user.cluster, user.env, user.base
    path = write_sweep(tmp_path, sweep_text(max_trials=4, parallel=3), job=job_storing_at(base))
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "sweep", str(path), "--cluster"],
        env={**os.environ, **env}, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    printed = []
    for line in process.stdout:  # until the third trial's job is created (and said so)
        printed.append(line)
        if line.startswith("trial 2 started:"):
            break
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert sorted(cluster.jobs()) == ["lr-trial-0", "lr-trial-1", "lr-trial-2"], "".join(printed)
    uids = {name: job["metadata"]["uid"] for name, job in cluster.jobs().items()}
    first_lr = cluster.lr("lr-trial-0")
    cluster.run("lr-trial-0")
    cluster.succeed("lr-trial-0", value_of(first_lr))  # finished while no sweep watched
    cluster.run("lr-trial-1")  # runs on
    gone_lr = cluster.lr("lr-trial-2")
    cluster.kube.delete(JOBS, NS, "lr-trial-2")  # someone deleted it (or its node pool went)

    lines: list[str] = []
    thread, box = in_a_thread(path, lines)

    def operator(name: str, job: dict[str, Any]) -> None:
        if name == "lr-trial-1" and not any(line.startswith("trial 1 re-attached") for line in lines):
            return  # it runs on until the sweep has found it again
        cluster.trains(name, job)

    play_until_done(cluster, thread, operator)
    result = finished(thread, box)

    rows = {row.number: row for row in result.rows}
    assert rows[0].state == "complete" and rows[0].value == value_of(first_lr)
    assert rows[1].state == "complete"
    assert rows[2].state == "failed" and rows[2].exit_class == "interrupted" and rows[2].rerun
    again = [row for row in result.rows if row.number > 2 and row.params["train.optimizer.lr"] == gone_lr]
    assert len(again) == 1 and again[0].state == "complete"  # trial 2's values, asked again as a new trial
    assert sum(not row.rerun for row in result.rows) == 4  # exactly max_trials counted
    jobs = cluster.jobs()
    assert {name: jobs[name]["metadata"]["uid"] for name in ("lr-trial-0", "lr-trial-1")} == {
        name: uids[name] for name in ("lr-trial-0", "lr-trial-1")
    }  # re-attached and recorded, not created again
    assert "lr-trial-2" not in jobs and len(jobs) == 4
    assert f"trial 1 re-attached -> job lr-trial-1 ({base}/lr-trial-1/)" in lines
    assert any(line.startswith("trial 0 complete: eval/loss") for line in lines)
    assert "trial 2 was cut off (its job lr-trial-2 is gone): its parameters asked again" in lines


def test_the_trials_are_followed_in_the_namespace_the_job_file_names(user, tmp_path, monkeypatch):
    """A job file naming its namespace, a context in another: the trials' jobs are created in the job's (as
    `orch submit` creates them), and listed, read and recorded there; the study keeps that namespace and
    the cluster's API server."""
    cluster, base = user.cluster, user.base
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", cluster.kube.url, contexts={"dev": "elsewhere"},
                                  current="dev")  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    job = {**job_storing_at(base), "namespace": NS}
    path = write_sweep(tmp_path, sweep_text(max_trials=2, parallel=1), job=job)
    lines: list[str] = []
    thread, box = in_a_thread(path, lines)
    play_until_done(cluster, thread, cluster.trains)
    result = finished(thread, box)

    assert [row.state for row in result.rows] == ["complete", "complete"], lines
    assert sorted(cluster.jobs()) == ["lr-trial-0", "lr-trial-1"]
    assert cluster.kube.names(JOBS, "elsewhere") == []
    study = studies.open_study(spec.load_sweep(path, where="cluster"))
    assert study.user_attrs[studies.CLUSTER] == {
        "server": cluster.kube.url, "namespace": NS, "shown": f"{cluster.kube.url} (context dev)",
    }  # fmt: skip


def test_a_trial_failed_on_suspected_hardware_is_asked_again_and_later_trials_avoid_the_node(user, tmp_path):
    """Trial 0's job fails and its pod's launcher names its own node's GPU (the record orchestrator/hardware.py
    encodes, which the kubelet copies into state.terminated.message: tests/cluster/test_suspected_nodes.py):
    its values did not fail it, so they are asked again, not counted toward max_failed (1 here), and every
    later trial's job is kept off that node (api.avoid_nodes: a required NotIn node affinity)."""
    from orchestrator import hardware
    from tests.fakes.emulator import PODS

    cluster, base = user.cluster, user.base
    path = write_sweep(
        tmp_path, sweep_text(max_trials=2, parallel=1, extra="max_failed: 1\n"), job=job_storing_at(base)
    )
    lines: list[str] = []
    thread, box = in_a_thread(path, lines)
    suspect = hardware.Suspect(host="lr-trial-0-master-0", node_rank=0, reason="uncorrectable ECC error",
                               rank=0, device="cuda:0")  # fmt: skip
    record = hardware.encode(hardware.Record(hardware.EXIT_CODE, hardware.CLASS_HARDWARE, (suspect,)))

    def operator(name: str, job: dict[str, Any]) -> None:
        if name != "lr-trial-0":
            cluster.trains(name, job)
            return
        pod = cluster.kube.add_pod(NS, name, "master", 0, node="gpu-node-7")
        cluster.kube.patch(PODS, NS, pod, {"status": {"phase": "Failed", "containerStatuses": [{
            "name": "pytorch", "restartCount": 0, "lastState": {},
            "state": {"terminated": {"exitCode": hardware.EXIT_CODE, "reason": "Error", "message": record}},
        }]}})  # fmt: skip
        cluster.kube.set_conditions(
            NS, name, ("Created", "True"), ("Failed", "True", "1 Master replica(s) failed.")
        )

    play_until_done(cluster, thread, operator)
    result = finished(thread, box)

    rows = {row.number: row for row in result.rows}
    assert (rows[0].state, rows[0].exit_class, rows[0].rerun) == ("failed", "hardware", True)
    assert rows[0].error == "job lr-trial-0: 1 Master replica(s) failed."
    assert [rows[n].state for n in (1, 2)] == ["complete", "complete"]  # exactly max_trials, no max_failed
    assert rows[1].params == rows[0].params  # its values, asked again
    for name in ("lr-trial-1", "lr-trial-2"):
        template = cluster.jobs()[name]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
        terms = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"] == [
            {
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-node-7"]}
                ]
            }
        ]
    assert (
        "trial 0 failed on suspected hardware (job lr-trial-0: 1 Master replica(s) failed.); the trials from now "
        "on are kept off gpu-node-7: its parameters asked again"
    ) in lines
    assert any(line.startswith("trial 1 and later: scheduling.exclude_nodes: + gpu-node-7") for line in lines)


def test_a_store_the_sweep_cannot_write_to_stops_it_before_any_trial(user, tmp_path):
    cluster = user.cluster
    job = job_storing_at("s3://no-such-bucket/sweeps")
    result = run_orch(
        "sweep", str(write_sweep(tmp_path, sweep_text(2, 1), job=job)), "--cluster", cwd=tmp_path
    )
    assert (result.returncode, result.stderr) == (2, (
        "error: cannot write to s3://no-such-bucket/sweeps: the bucket does not exist (the sweep reads its "
        "trials' objectives there)\n"
    ))  # fmt: skip
    assert cluster.kube.requests() == []  # nothing was sent to the cluster


def test_a_foreign_run_in_a_trials_prefix_stops_the_sweep_before_its_job(user, tmp_path):
    """A new study of a sweep name used before (its study deleted, its outputs kept): resuming another run's
    checkpoints would mix two trials into one."""
    cluster, base = user.cluster, user.base
    (storage.location(f"{base}/old-trial-0") / "summary.json").write_bytes(b"{}")
    path = write_sweep(tmp_path, sweep_text(2, 1).replace("name: lr", "name: old"), job=job_storing_at(base))
    result = run_orch("sweep", str(path), "--cluster", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"error: {base}/old-trial-0/ already holds a run's outputs (an earlier sweep named old"
    )
    assert cluster.jobs() == {}


def study_left_by_a_sweep_in(path: Path, server: str, namespace: str, context: str) -> None:
    """The study as `orch sweep --cluster` in `context` left it: trial 0 a job in `namespace` (a real sweep
    records the same: test_the_trials_are_followed_in_the_namespace_the_job_file_names)."""
    sweep = spec.load_sweep(path, where="cluster")
    study = studies.open_study(sweep)
    trial = study.ask(studies.distributions(sweep))
    trial.set_user_attr(studies.RUN, "lr-trial-0")
    study.set_user_attr(studies.WHERE, "cluster")
    study.set_user_attr(
        studies.CLUSTER, {"server": server, "namespace": namespace, "shown": f"{server} (context {context})"}
    )


def test_a_cluster_sweep_is_continued_only_in_the_namespace_and_cluster_its_trials_run_in(
    tmp_path, monkeypatch
):
    """Continued in another namespace or on another cluster, the sweep would list none of its jobs there and ask
    every running trial again: refused in one line naming both places, exit 2, before the cluster or the store
    is asked anything. Where the trials go is where `orch submit` would create them: -n, else the job file's
    namespace, else the context's."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never reached: the refusal comes first
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with serve() as kube, serve() as elsewhere:
        contexts = {"dev": NS, "research": "team-b"}
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, contexts=contexts, current="dev")
        other = write_kubeconfig(tmp_path / "other", elsewhere.url, contexts={"dev": NS}, current="dev")
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        path = write_sweep(tmp_path, sweep_text(max_trials=2, parallel=1), job=job_storing_at("s3://bkt/lr"))
        study_left_by_a_sweep_in(path, kube.url, NS, "dev")
        here = f"namespace {NS} at {kube.url} (context dev)"
        for flags, there in [
            (["-n", "team-b"], f"namespace team-b at {kube.url} (context dev)"),
            (["--context", "research"], f"namespace team-b at {kube.url} (context research)"),
            (["--kubeconfig", str(other)], f"namespace {NS} at {elsewhere.url} (context dev)"),
        ]:
            result = run_orch("sweep", str(path), "--cluster", *flags, cwd=tmp_path)
            assert (result.returncode, result.stderr) == (2, (
                f"error: sweep lr runs its trials in {here}, not in {there}: continue it there (--context, "
                f"--namespace), or give this sweep a study of its own: another `name:` in {path}\n"
            )), flags  # fmt: skip
        # the job file's namespace is where the trials' jobs would be created
        (tmp_path / "job.yaml").write_text(
            json.dumps({**job_storing_at("s3://bkt/lr"), "namespace": "team-b"})
        )
        result = run_orch("sweep", str(path), "--cluster", cwd=tmp_path)
        assert (
            result.returncode == 2 and f"not in namespace team-b at {kube.url} (context dev)" in result.stderr
        )
        assert kube.requests() == [] and elsewhere.requests() == []


# --- the trainer's side: what the pods of a cluster trial do ---------------------------------------------------


def test_the_trainer_uploads_its_objective_and_a_new_pod_reads_it_back(user, tmp_path):
    from orchestrator.trainer.objective import ObjectiveReport

    kept = storage.location("s3://bkt/objective/run")
    first = ObjectiveReport("eval/loss", tmp_path / "pod-1", enabled=True, kept=kept)
    (tmp_path / "pod-1").mkdir()
    first.evaluated(5, {"loss": 0.5, "accuracy": 0.7})
    first.evaluated(10, {"loss": 0.4})
    uploaded = json.loads((kept / outputs.OBJECTIVE).read_bytes())
    assert uploaded == json.loads((tmp_path / "pod-1" / outputs.OBJECTIVE).read_text())
    assert uploaded["values"] == [[5, 0.5], [10, 0.4]] and uploaded["final"] is None
    (tmp_path / "pod-2").mkdir()  # the pod replaced: an empty output dir, the same store
    second = ObjectiveReport("eval/loss", tmp_path / "pod-2", enabled=True, kept=kept)
    second.evaluated(15, {"loss": 0.3})
    second.finish(15, pruned=False)
    assert json.loads((kept / outputs.OBJECTIVE).read_bytes())["values"] == [[5, 0.5], [10, 0.4], [15, 0.3]]
    assert json.loads((kept / outputs.OBJECTIVE).read_bytes())["final"] == 0.3


def test_a_prune_request_in_the_store_is_seen_by_the_rank_that_watches(user):
    import torch

    from orchestrator.trainer.stop import PRUNED, StopRequest

    url = "s3://bkt/prune/run/prune.request"

    def request(watches: bool) -> StopRequest:
        found = StopRequest(device=torch.device("cpu"), world_size=1, enabled=False, prune_file=url,
                            watches_store=watches, store_poll_seconds=0.05)  # fmt: skip
        found.install()
        return found

    watching, blind = request(True), request(False)
    time.sleep(0.3)
    assert watching.agreed() == 0
    storage.location(url).write_bytes(b"pruned by orch sweep\n")
    deadline = time.monotonic() + 10
    while watching.agreed() != PRUNED:
        assert time.monotonic() < deadline, "the request was never seen"
        time.sleep(0.05)
    assert blind.agreed() == 0  # the other ranks learn it from rank 0 through the step's all-reduce
    watching.restore()
    blind.restore()


def test_orch_run_with_a_prune_request_in_its_store_ends_as_a_pruned_trial(user, tmp_path):
    """The real trainer (one rank, `orch run --out s3://...` as a pod's trainer writes there): the request
    already in the store when it starts, it stops at its first step with a checkpoint, summary.json and
    objective.json marked pruned in the store, exit 0."""
    out = "s3://bkt/pruned-trial"
    (storage.location(out) / outputs.PRUNE_REQUEST).write_bytes(b"pruned by orch sweep\n")
    (tmp_path / "job.yaml").write_text(
        json.dumps({**DIGITS_JOB, "train": {**DIGITS_JOB["train"], "max_steps": 200}})
    )
    env = {**os.environ, "ORCH_OBJECTIVE": "eval/loss", "ORCH_PRUNE_FILE": f"{out}/{outputs.PRUNE_REQUEST}"}
    result = subprocess.run([sys.executable, "-m", "orchestrator", "run", "job.yaml", "--out", out], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((storage.location(out) / outputs.SUMMARY).read_bytes())
    objective = json.loads((storage.location(out) / outputs.OBJECTIVE).read_bytes())
    assert summary["pruned"] is True and summary["steps"] < 200
    assert objective["pruned"] is True and objective["metric"] == "eval/loss"
    assert any((storage.location(out) / "checkpoints").iterdir())  # the stop checkpoint, to resume from


def test_a_trial_jobs_pods_attach_their_mlflow_run_as_the_sweeps_child(tmp_path, monkeypatch):
    """A job tracking with MLflow on a server the pods reach (http://mlflow.team:5000): the sweep creates its
    parent run there (here a `file:` store standing for that server, through ORCH_MLFLOW_TRACKING_URI as a shell
    that reaches it otherwise would), and a trial's job, as submit renders it, carries what the pods need to
    attach their run as its child: tracking on, the job's server, the trial's own run name and the parent's
    id. The trainer's MLflow tracker, built from that container env as the pod's rank 0 builds it (the server
    again the file store), creates its run under the parent."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from orchestrator import runtime_env
    from orchestrator.rendering.render import render
    from orchestrator.sweep.cluster_trials import ClusterTrials
    from orchestrator.sweep.tracking import SweepTracking
    from orchestrator.sweep.trials import TrialPlan
    from orchestrator.trainer import tracking

    store = f"file:{tmp_path / 'mlruns'}"
    for name, value in {**tracking.MLFLOW_HTTP_DEFAULTS, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}.items():
        monkeypatch.setenv(name, value)  # what the sweep and the tracker set, undone after the test
    monkeypatch.setenv(runtime_env.ENV_MLFLOW_TRACKING_URI, store)
    server = {"tracking_uri": "http://mlflow.team:5000", "experiment": "lr-sweeps", "run_name": "lr"}
    job = {**job_storing_at("s3://bkt/lr"), "tracking": {"mlflow": server}}
    sweep = spec.load_sweep(write_sweep(tmp_path, sweep_text(2, 1), job=job), where="cluster")
    sweep_tracking = SweepTracking(sweep, studies.open_study(sweep), notice=pytest.fail)
    sweep_tracking.start()
    parent = sweep_tracking.run_id
    assert parent is not None
    params = {"train.optimizer.lr": 0.01}
    plan = TrialPlan(1, params, "lr-trial-1", env=sweep_tracking.env(TrialPlan(1, params, "lr-trial-1")))

    trial_job = ClusterTrials(sweep, api.Client(), place={}).trial_job(plan)
    (rendered,) = [obj for obj in render(trial_job, api="pytorchjob") if obj["kind"] == "PyTorchJob"]
    env = Cluster.env(rendered)
    assert {name: env.get(name) for name in ("ORCH_MLFLOW", "ORCH_MLFLOW_TRACKING_URI", "ORCH_MLFLOW_EXPERIMENT",
                                             "ORCH_MLFLOW_RUN_NAME", "ORCH_MLFLOW_PARENT_RUN_ID")} == {
        "ORCH_MLFLOW": "1", "ORCH_MLFLOW_TRACKING_URI": "http://mlflow.team:5000",
        "ORCH_MLFLOW_EXPERIMENT": "lr-sweeps", "ORCH_MLFLOW_RUN_NAME": "lr-trial-1",
        "ORCH_MLFLOW_PARENT_RUN_ID": parent,
    }  # fmt: skip

    pod = runtime_env.TrackingSettings.from_environ({**env, runtime_env.ENV_MLFLOW_TRACKING_URI: store})
    tracker = tracking.build(pod, enabled=True, job_name="lr-trial-1", output_dir=tmp_path / "pod")
    tracker.start()
    tracker.log_metrics(5, {"eval/loss": 0.5})
    assert tracker.close() == []
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("lr-sweeps")
    (child,) = [run for run in client.search_runs([experiment.experiment_id]) if run.info.run_id != parent]
    assert child.info.run_name == "lr-trial-1" and child.data.tags["mlflow.parentRunId"] == parent
    assert child.data.tags["orch.api_kind"] == "PyTorchJob" and child.data.metrics["eval/loss"] == 0.5
