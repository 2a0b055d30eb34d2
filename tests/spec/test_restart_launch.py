"""restart.policy job as rendered, with real processes: a training process dies mid-run, every rank restarts
together from the newest checkpoint, and the final parameters equal an uninterrupted `orch run`'s.

torch is real (CPU, gloo); each "pod" is the rendered container command with its rendered env on 127.0.0.1.
What cannot run here is played by the test and said so:
- PyTorchJob: the v1.9 operator's env for an elastic job (elastic.go: PET_NNODES=min:max, PET_RDZV_BACKEND,
  PET_RDZV_ENDPOINT=<job>-worker-0:<port>, here 127.0.0.1, PET_MAX_RESTARTS); the restart itself is
  torchrun's own elastic agents, unplayed.
- TrainJob: JobSet's failurePolicy. When one node's process fails, its Job fails (backoffLimit 0) and JobSet
  deletes every Job's pods and creates them again: the test kills the other "pod" and starts both again.
The shared output folder stands for output.pvc (a ReadWriteMany claim).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import naming
from orchestrator.job.spec import JobSpec
from orchestrator.rendering import render
from tests.spec.test_torchrun_launch import free_port
from tests.trainer.conftest import REPO, Run, assert_same_params, job, orch_run, write_job
from tests.trainer.test_faults import wait_for

pytestmark = pytest.mark.slow


def restart_job(name: str, release: Path | None = None) -> dict:
    """2 nodes x 1 process, 30 steps, a checkpoint every 10 (all kept). With `release`, the input holds once the
    step-10 checkpoint is on disk until that file exists (tests/trainer/plugin_tasks.py), so the test's kill
    lands after that checkpoint and before the end however loaded the machine is; the mathematics are the same."""
    task = {"task_args": {"samples": 256, "eval_samples": 64}}
    if release is not None:
        task = {"task": "tests.trainer.plugin_tasks:held_after_checkpoint",
                "task_args": {**task["task_args"], "step": 10, "release": str(release)}}  # fmt: skip
    spec = job(
        name,
        nodes=2,
        max_steps=30,
        log_every=5,
        checkpoint={"every_steps": 10, "keep": 5},
        optimizer={"name": "adamw", "lr": 0.01},
        **task,
    )
    return {
        **spec,
        "image": "i:1",
        "metrics": {"enabled": False},
        "restart": {"policy": "job", "max_restarts": 2},
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Run:
    tmp = tmp_path_factory.mktemp("reference")
    run = orch_run(write_job(tmp, restart_job("reference")), tmp / "out")
    assert run.returncode == 0, run.stderr
    return run


def processes(out: Path) -> dict[int, dict[str, str]]:
    """pid -> environment of every process of this test's "pods" (agents and workers): those writing to `out`."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            environ = dict(i.split("=", 1) for i in (entry / "environ").read_text().split("\0") if "=" in i)
        except OSError:
            continue
        if entry.name.isdigit() and environ.get("ORCH_OUTPUT_DIR") == str(out):
            found[int(entry.name)] = environ
    return found


def worker_pids(out: Path) -> dict[int, int]:
    """RANK -> pid of the training processes (torchrun's agents, which have no RANK, aside)."""
    return {int(env["RANK"]): pid for pid, env in processes(out).items() if "RANK" in env}


def kill_all(out: Path) -> None:
    """SIGKILL whatever of this test's processes still runs (torchrun puts its workers in their own
    sessions, so killing an agent leaves them behind)."""
    for pid in processes(out):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def pod_command(command: list[str], config_map: dict, folder: Path) -> list[str]:
    """The rendered command with the ConfigMap's train.json at a local path instead of /etc/orch."""
    folder.mkdir()
    (folder / naming.TRAIN_CONFIG_KEY).write_text(config_map["data"][naming.TRAIN_CONFIG_KEY])
    return [str(folder / naming.TRAIN_CONFIG_KEY) if a == naming.TRAIN_CONFIG_PATH else a for a in command]


def start(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    path = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    return subprocess.Popen(
        command,
        env={**os.environ, **env, "PATH": path},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(pods: list[subprocess.Popen], out: Path, timeout: float = 300) -> list[str]:
    """Each pod's output once it exits; pods still running after `timeout` are killed with every process
    they started (the output says so)."""
    outputs = []
    for pod in pods:
        try:
            outputs.append(pod.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            kill_all(out)
            pod.kill()
            outputs.append(pod.communicate()[0] + "\n[killed: still running after the timeout]")
            timeout = 10
    kill_all(out)
    return outputs


def elastic_operator_env(job_spec: dict) -> dict[str, str]:
    """The v1.9 operator's env for an elastic PyTorchJob's pods (elastic.go: PET_NNODES=min:max, the rendezvous
    backend and endpoint, PET_MAX_RESTARTS), the endpoint a free local port."""
    elastic = job_spec["elasticPolicy"]
    return {
        "PYTHONUNBUFFERED": "1",
        "PET_NPROC_PER_NODE": job_spec["nprocPerNode"],
        "PET_NNODES": f"{elastic['minReplicas']}:{elastic['maxReplicas']}",
        "PET_RDZV_BACKEND": elastic["rdzvBackend"],
        "PET_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}",
        "PET_MAX_RESTARTS": str(elastic["maxRestarts"]),
    }


def test_pytorchjob_restart_job_reforms_the_whole_group(tmp_path, reference):
    """Elastic agents with min = max = nodes: rank 1's process is SIGKILLed; its agent restarts its worker,
    the other agent sees the new rendezvous round and restarts its own, so both ranks resume together."""
    release = tmp_path / "release"
    spec = JobSpec.model_validate(restart_job("pyjob", release))
    found = {o["kind"]: o for o in render.render(spec, api="pytorchjob")}
    job_spec = found["PyTorchJob"]["spec"]
    assert set(job_spec["pytorchReplicaSpecs"]) == {"Worker"}
    (container,) = job_spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    command = pod_command(container["command"], found["ConfigMap"], tmp_path / "etc-orch")
    out = tmp_path / "out"
    operator_env = elastic_operator_env(job_spec)
    env = {e["name"]: e["value"] for e in container["env"]} | operator_env | {"ORCH_OUTPUT_DIR": str(out)}
    pods = [start(command, env) for _ in range(job_spec["pytorchReplicaSpecs"]["Worker"]["replicas"])]
    try:
        wait_for((out / "checkpoints" / "step-00000010").exists, timeout=240, what="the step-10 checkpoint")
        first = worker_pids(out)  # both held after the checkpoint: alive, whatever the load
        assert set(first) == {0, 1}
        os.kill(first[1], signal.SIGKILL)
    finally:
        release.touch()
        outputs = finish(pods, out)
    assert [p.returncode for p in pods] == [0, 0], outputs[0][-5000:] + "\n-----\n" + outputs[1][-5000:]
    # (summary["restarts"] is rank 0's agent's count: 0 when rank 0 sits on the node whose agent restarted
    # because the other node re-joined, which torchrun does not count as a restart.)
    assert Run(0, "", "", out).summary["resumed_from_step"] == 10  # the run was held between 10 and 20
    assert_same_params(reference.state_dict(), Run(0, "", "", out).state_dict())


def test_trainjob_restart_job_recreates_every_pod_and_resumes(tmp_path, reference):
    release = tmp_path / "release"
    spec = JobSpec.model_validate(restart_job("trainjob", release))
    found = {o["kind"]: o for o in render.render(spec, api="trainjob")}
    trainer = found["TrainJob"]["spec"]["trainer"]
    (rjob,) = found["TrainingRuntime"]["spec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["template"]["spec"]["backoffLimit"] == 0  # one failed pod fails its Job at once ...
    assert (
        found["TrainingRuntime"]["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 2
    )  # ... JobSet
    command = pod_command(trainer["command"], found["ConfigMap"], tmp_path / "etc-orch")
    out = tmp_path / "out"
    pod_env = {e["name"]: e["value"] for e in trainer["env"]} | {"ORCH_OUTPUT_DIR": str(out)}

    def jobset_attempt() -> list[subprocess.Popen]:
        port = str(free_port())
        plugin_env = {"PET_NNODES": str(trainer["numNodes"]), "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
                      "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": port}  # fmt: skip
        return [
            start(command, pod_env | plugin_env | {"PET_NODE_RANK": str(r)})
            for r in range(trainer["numNodes"])
        ]

    pods = jobset_attempt()
    try:
        wait_for((out / "checkpoints" / "step-00000010").exists, timeout=240, what="the step-10 checkpoint")
        os.kill(worker_pids(out)[1], signal.SIGKILL)
        pods[1].wait(timeout=120)  # node 1's torchrun fails: its Job fails ...
        assert pods[1].returncode != 0
        pods[0].kill()  # ... and JobSet's failurePolicy deletes the other Jobs' pods
    finally:
        finish(pods, out, timeout=60)
        release.touch()
    pods = jobset_attempt()  # the recreated Jobs: new pods, the same claim
    outputs = finish(pods, out)
    assert [p.returncode for p in pods] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    summary = Run(0, "", "", out).summary
    assert summary["resumed_from_step"] == 10  # the run was held between 10 and 20
    assert_same_params(reference.state_dict(), Run(0, "", "", out).state_dict())
