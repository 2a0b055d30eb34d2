"""The rendered command really launches under the env the operator gives a pod.

torch is real here (a CPU launch with torchrun); the operator is not: its setPodEnv (v1.9 envvar.go, see the
shared pytorchjob notes) is reproduced as a dict, including the pod-level WORLD_SIZE/RANK it sets, which
torchrun must replace per process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.job.spec import JobSpec
from orchestrator.rendering import render

# One os.write per process: with PYTHONUNBUFFERED (the operator sets it) print() writes its pieces separately and
# the two processes' lines interleave.
PROBE = (
    "import os; os.write(1, ('proc ' + ' '.join(os.environ[k] for k in "
    "('WORLD_SIZE', 'RANK', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE')) + '\\n').encode())"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_rendered_torchrun_command_gives_each_process_its_rank(tmp_path):
    spec = JobSpec.model_validate(
        {"name": "probe", "image": "i:1", "procs_per_node": 2, "command": ["python", "-c", PROBE]}
    )
    (job,) = [o for o in render.render(spec) if o["kind"] == "PyTorchJob"]
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]
    (container,) = master["template"]["spec"]["containers"]
    total_replicas = sum(r["replicas"] for r in job["spec"]["pytorchReplicaSpecs"].values())
    operator_env = {  # what the v1.9 operator sets on the Master pod (nprocPerNode "2" -> int 2)
        "PYTHONUNBUFFERED": "1",
        "PET_NPROC_PER_NODE": job["spec"]["nprocPerNode"],
        "MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port := free_port()),
        "PET_MASTER_PORT": str(port),
        "WORLD_SIZE": str(total_replicas * 2),
        "RANK": "0",
        "PET_NODE_RANK": "0",
        "PET_NNODES": str(total_replicas),
    }
    pod_env = {e["name"]: e["value"] for e in container["env"]}
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, **pod_env, **operator_env, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    env["TMPDIR"] = str(tmp_path)  # torchrun's log folder (torchelastic_*) goes with the test's
    result = subprocess.run(container["command"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("proc"))
    assert lines == ["proc 2 0 0 2", "proc 2 1 1 2"]
