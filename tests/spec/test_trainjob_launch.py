"""The rendered TrainJob's pod command trains, as two "nodes", to the same parameters as `orch run`.

torch is real here (CPU, gloo): two torchrun process groups on 127.0.0.1, each started with the command, env and
mounted train.json that the TrainJob and its TrainingRuntime give the `node` container, plus the PET_* env
Trainer v2's torch plugin injects (pkg/runtime/framework/plugins/torch/torch.go: PET_NNODES = numNodes,
PET_NPROC_PER_NODE = numProcPerNode, PET_NODE_RANK = the Job completion index, PET_MASTER_ADDR =
<job>-node-0-0.<job>, here 127.0.0.1, PET_MASTER_PORT = 29500, here a free port). The controller, JobSet and the
kubelet are not (they cannot run here); the shared output dir stands for a ReadWriteMany volume.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import naming
from orchestrator.apis import trainjob
from orchestrator.job.spec import JobSpec
from orchestrator.rendering import render
from tests.spec.test_restart_launch import kill_all
from tests.spec.test_torchrun_launch import free_port
from tests.trainer.conftest import REPO, Run, assert_same_params, job, orch_run, write_job

pytestmark = pytest.mark.slow


def test_trainjob_pod_command_on_two_nodes_trains_like_orch_run(tmp_path):
    spec_dict = {**job("twonode", nodes=2), "image": "example.com/trainer:1", "metrics": {"enabled": False}}
    reference = orch_run(write_job(tmp_path, spec_dict), tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr

    objects = {o["kind"]: o for o in render.render(JobSpec.model_validate(spec_dict), api="trainjob")}
    trainer = objects["TrainJob"]["spec"]["trainer"]
    (replicated_job,) = objects["TrainingRuntime"]["spec"]["template"]["spec"]["replicatedJobs"]
    (container,) = replicated_job["template"]["spec"]["template"]["spec"]["containers"]
    assert container["name"] == trainjob.TRAINER_NODE and trainer["command"] == container["command"]
    # The ConfigMap mounted at /etc/orch, here a folder of our own.
    config = tmp_path / "etc-orch"
    config.mkdir()
    (config / naming.TRAIN_CONFIG_KEY).write_text(objects["ConfigMap"]["data"][naming.TRAIN_CONFIG_KEY])
    command = [
        str(config / naming.TRAIN_CONFIG_KEY) if a == naming.TRAIN_CONFIG_PATH else a
        for a in trainer["command"]
    ]
    assert command != trainer["command"]

    out = tmp_path / "pods"
    port = free_port()
    pod_env = {e["name"]: e["value"] for e in trainer["env"]}
    pod_env["ORCH_OUTPUT_DIR"] = str(out)  # the output volume's mount, here a folder both "nodes" share
    bin_dir = str(Path(sys.executable).parent)
    nodes = []
    for rank in range(trainer["numNodes"]):
        plugin_env = {
            "PET_NNODES": str(trainer["numNodes"]),
            "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(port),
        }
        env = {
            **os.environ,
            **pod_env,
            **plugin_env,
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        }
        nodes.append(
            subprocess.Popen(
                command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    try:
        outputs = [node.communicate(timeout=300)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
        kill_all(out)  # torchrun's workers live in their own sessions
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    pods = Run(0, "", "", out)
    assert pods.summary["world_size"] == 2
    assert_same_params(reference.state_dict(), pods.state_dict())
