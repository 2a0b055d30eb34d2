"""#31: `orch stacks NAME` of a cluster job, end to end without a cluster controller: a real 2-rank `orch run --out
s3://...` into a real S3 server (moto, 127.0.0.1) whose rank 1 stops at step 5 (a sleep in its forward: the job is
slow, not dead), and the CLI's cluster path against the API emulator, which holds a job object whose output
annotation (rendered by `orch submit`) names that same URL. The ranks' watch threads answer the request the CLI
writes there; the CLI prints both stacks by rank with what each is doing, then leaves nothing in the store. A
rank made unable to answer (SIGSTOP) is named with its last heartbeat. Then the hang verdict the noticing rank
printed into its log is what `orch logs` shows, the emulator serving the pods' logs as the run wrote them.
One launch for every test (module scope). The test plays the training operator, which cannot run here:
`Created`, then `Running` while the Master is active (kubeflow/training-operator
pkg/apis/kubeflow.org/v1/common_types.go, pytorchjob_controller.go; shared notes, pytorchjob.md §4)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator import storage
from orchestrator.trainer import heartbeat
from tests.fakes.cli import FAST, Env, write_kubeconfig
from tests.fakes.emulator import serve
from tests.s3server import S3Server, s3_server
from tests.trainer.conftest import ORCH, REPO, job, write_job
from tests.trainer.test_faults import wait_for

NS = "team-a"
URL = "s3://runs/hang"
TIMEOUT = 60  # train.collective_timeout: the verdict at 30 s after rank 1 stops, the run's failure at 60 s
POLL = "1"  # ORCH_STACKS_POLL_SECONDS in the job's env: each rank looks for a request every second


@dataclass
class HungRun:
    process: subprocess.Popen[str]
    out: Path  # the run's local folder: logs, the ranks' records (the store keeps the rest)
    s3: S3Server
    env: Env  # a user whose kubeconfig points at the emulator, with the store's credentials in the shell

    def orch(self, *args: str):  # type: ignore[no-untyped-def]
        return self.env.orch(*args, env=self.s3.env())

    def rank_pid(self, rank: int) -> int:
        return int(json.loads((self.out / "stacks" / f"rank-{rank}.json").read_text())["pid"])


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stacks")
    with s3_server() as s3, serve() as kube:
        s3.create_bucket("runs")
        spec = job(
            "hang", procs=2, max_steps=1000, log_every=1, collective_timeout=f"{TIMEOUT}s",
            checkpoint={"every_steps": 0, "on_stop": False},  # a SIGTERM ends the sleeper at once
            task="tests.trainer.plugin_tasks:stops_at_step",
            task_args={"rank": 1, "step": 5, "accumulation": 2, "samples": 256, "eval_samples": 0},
        )  # fmt: skip
        spec["env"] = {"ORCH_STACKS_POLL_SECONDS": POLL}
        run_env = {
            **os.environ, **s3.env(), "ORCH_METRICS_PORT": "0", "XDG_RUNTIME_DIR": str(tmp),
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        }  # fmt: skip
        process = subprocess.Popen(
            [*ORCH, "run", str(write_job(tmp, spec)), "--out", URL], cwd=tmp, env=run_env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            wait_for(lambda: any(tmp.glob("runs/hang-*/stopped-1")), what="rank 1 to stop at step 5")
            (out,) = tmp.glob("runs/hang-*")
            home = tmp / "home"
            home.mkdir()
            kubeconfig = write_kubeconfig(tmp / "kubeconfig", kube.url, contexts={"dev": NS}, current="dev")
            env = Env(kube, kubeconfig, home, {"KUBECONFIG": str(kubeconfig), "HOME": str(home), **FAST})
            job_file = (
                tmp / "cluster.yaml"
            )  # the same job as the cluster holds it: its outputs in the same store
            job_file.write_text(
                f"name: hang\nimage: registry.example/trainer:1\nnodes: 2\noutput: {{url: {URL}}}\n"
                "train: {task: digits, batch_size: 96, max_steps: 10}\n"
            )
            assert env.orch("submit", str(job_file), "--api", "pytorchjob").exit_code == 0
            kube.set_conditions(NS, "hang", ("Created", "True"), ("Running", "True"))
            kube.add_pod(NS, "hang", "master", 0)
            kube.add_pod(NS, "hang", "worker", 0)
            yield HungRun(process, out, s3, env)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGCONT)  # a rank left stopped cannot end
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.communicate(timeout=60)


def store_keys(run: HungRun) -> list[str]:
    import obstore

    with pytest.MonkeyPatch.context() as patch:
        for name, value in run.s3.env().items():
            patch.setenv(name, value)
        store, key = storage.object_store(URL)
        return sorted(m["path"] for batch in obstore.list(store, prefix=f"{key}/") for m in batch)


def blocks(text: str) -> dict[int, str]:
    return {int(b.split(" ", 1)[0]): b for b in text.split("--- rank ")[1:]}


def test_orch_stacks_prints_every_ranks_stack_by_rank_and_what_it_does(hung):
    before = store_keys(hung)
    shown = hung.orch("stacks", "hang")
    assert shown.exit_code == 0, shown.output
    found = blocks(shown.stdout)
    assert sorted(found) == [0, 1]
    header = {rank: block.splitlines()[0] for rank, block in found.items()}
    # rank 1 sleeps in its forward (the task's loss); rank 0 waits for it in backward's gradient reduction
    assert "faulthandler): step 5 in forward for " in header[1], header[1]
    assert " in stopping" in found[1] and "plugin_tasks.py" in found[1]
    assert "faulthandler): step 5 in backward for " in header[0], header[0]
    assert " in train_step" in found[0]
    assert all(
        "orch-stacks-watch" not in h and "(most recent call first)" in found[r] for r, h in header.items()
    )
    # the same as data
    data = json.loads(hung.orch("stacks", "hang", "-o", "json").stdout)
    assert [(r["rank"], r["answered"], r["how"], r["step"], r["phase"]) for r in data] == [
        (0, True, "faulthandler", 5, "backward"), (1, True, "faulthandler", 5, "forward"),
    ]  # fmt: skip
    assert {r["pid"] for r in data} == {hung.rank_pid(0), hung.rank_pid(1)}
    # nothing left behind: the request and the answers are gone, what the run keeps there is untouched
    after = store_keys(hung)
    assert after == before and not any("/stacks" in k for k in after), after


def test_a_rank_that_cannot_answer_is_named_with_its_last_heartbeat(hung):
    # rank 1's heartbeat thread beats every `interval`: stopped before its first beat at step 5, rank 1's last
    # one would still say where it was before (step 0, in setup, when steps 1-4 took under one interval)
    interval, _ = heartbeat.intervals(TIMEOUT)
    stopped_at = (hung.out / "stopped-1").stat().st_mtime
    time.sleep(max(0.0, stopped_at + 2 * interval + 0.5 - time.time()))
    pid = hung.rank_pid(1)
    os.kill(pid, signal.SIGSTOP)  # no thread of rank 1 runs now: it cannot answer
    try:
        shown = hung.orch("stacks", "hang", "--timeout", "5s")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert shown.exit_code == 0, shown.output
    found = blocks(shown.stdout)
    assert sorted(found) == [0, 1]
    assert " in train_step" in found[0]
    lines = found[1].splitlines()
    assert lines[0] == f"1 (pid {pid} on {os.uname().nodename}): no answer ---"
    assert lines[1].startswith("no answer within 5 s; its last heartbeat, ")
    assert " had it at step 5 in forward for " in lines[1] and lines[1].endswith("(the hung one)")
    assert not any("/stacks" in k for k in store_keys(hung))


def test_orch_logs_shows_the_hang_line_the_noticing_rank_printed(hung):
    logs = {rank: hung.out / "logs" / f"rank-{rank}.log" for rank in (0, 1)}

    def verdict() -> str | None:
        for log in logs.values():
            for line in log.read_text(errors="replace").splitlines() if log.exists() else ():
                if line.startswith("orch: hang: "):
                    return line
        return None

    wait_for(lambda: verdict() is not None, timeout=TIMEOUT + 120, what="a rank's hang verdict in its log")
    line = verdict()
    assert line is not None and "rank 1 stopped at step 5 in forward" in line, line
    # the pods' logs are what the ranks wrote (master-0 ran rank 0, worker-0 rank 1)
    for pod, rank in (("hang-master-0", 0), ("hang-worker-0", 1)):
        hung.env.kube.write_log(NS, pod, *logs[rank].read_text(errors="replace").splitlines())
    shown = hung.orch("logs", "hang")
    assert shown.exit_code == 0, shown.output
    printed = shown.stdout.splitlines()
    assert any(p.endswith(line) and p.startswith(("[master-0] ", "[worker-0] ")) for p in printed), printed[
        -20:
    ]
    # every live rank's stack follows the verdict in its log
    assert any(" is at step 5 in " in p and "its stack (every thread):" in p for p in printed)
