"""Real image builds with `orch build --tool buildah`, then the rendered PyTorchJob's command run inside.

What is real: buildah, both Dockerfiles, pip resolving orch-trainer[train] inside the build, torch (the
CPU wheel), torchrun and the trainer. What stands in: the base images (no registry is reachable, see
conftest.py) and the training operator, whose env (PET_NNODES, PET_MASTER_ADDR, ...) the test sets.
The top-level (CUDA) Dockerfile is built on the CPU image's `torch` stage in place of the pytorch/pytorch
base: no CUDA exists here, but its logic (wheel stage, torch kept, user, labels, PATH) is the same.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.images.conftest import REPO_ROOT, buildah

# A cold cache builds the base and torch images in the fixtures first (~9 min on a loaded 2-core machine): more than
# pytest-timeout's 600 s per test. The builds have their own subprocess timeouts (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
ORCH = str(Path(sys.executable).with_name("orch"))


def _orch_build(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([ORCH, "build", str(REPO_ROOT), "--tool", "buildah", *args], capture_output=True,
                            text=True, env={**os.environ, **env}, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout.strip().splitlines()[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rendered_pod(tmp_path: Path) -> tuple[dict, str]:
    """The Master container of `orch render` for a 3-step synthetic job, and its ConfigMap's train.json."""
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: smoke\nimage: localhost/x:1\nprocs_per_node: 2\ntrain:\n  task: synthetic\n"
        "  task_args: {kind: regression, samples: 256, features: 8, hidden: 16}\n"
        "  batch_size: 32\n  max_steps: 3\n  log_every: 1\n  eval_every: 0\n"
    )
    result = subprocess.run([ORCH, "render", str(job)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    config = next(o for o in objects if o["kind"] == "ConfigMap")
    job_object = next(o for o in objects if o["kind"] == "PyTorchJob")
    master = job_object["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    return master, config["data"]["train.json"]


def _smoke(env: dict[str, str], ref: str, tmp_path: Path) -> dict:
    """Run the rendered command in a container of `ref` as the operator would start it; return summary.json."""
    container, train_json = _rendered_pod(tmp_path)
    (tmp_path / "train.json").write_text(train_json)
    name = buildah(env, "from", ref).strip()
    try:
        buildah(env, "copy", "--chmod", "0644", name, str(tmp_path / "train.json"), "/etc/orch/train.json")
        pod_env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        # What the training operator injects for a one-node job (here the node is the host's loopback,
        # since chroot isolation shares the host network); metrics off: no fixed port on a shared host.
        pod_env.update(PET_NNODES="1", PET_NODE_RANK="0", PET_MASTER_ADDR="127.0.0.1",
                       PET_MASTER_PORT=str(_free_port()), ORCH_METRICS_PORT="0")  # fmt: skip
        env_args = [arg for key, value in pod_env.items() for arg in ("--env", f"{key}={value}")]
        result = subprocess.run(
            ["buildah", "run", *env_args, name, "--", *container["command"], *container.get("args", [])],
            capture_output=True, text=True, env={**os.environ, **env}, timeout=240,
        )  # fmt: skip
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
        return json.loads(buildah(env, "run", name, "--", "cat", "/orch/output/summary.json"))
    finally:
        buildah(env, "rm", name, check=False)


@pytest.fixture
def built(buildah_env: dict[str, str]):
    """Collects the images a test builds and removes them afterwards (the cached base stays)."""
    refs: list[str] = []
    yield refs
    for ref in refs:
        buildah(buildah_env, "rmi", "--force", ref, check=False)
    buildah(buildah_env, "rmi", "--prune", check=False)


def _config(env: dict[str, str], ref: str) -> dict:
    return json.loads(buildah(env, "inspect", "--type", "image", ref))["OCIv1"]["config"]


def test_cpu_image_builds_and_trains(buildah_env, ci_base, wheelhouse, built, tmp_path: Path) -> None:
    env = buildah_env
    pip = ["--build-arg", "PIP_NO_INDEX=1", "--build-arg", f"PIP_FIND_LINKS={wheelhouse}"]
    cpu = _orch_build(env, "--file", str(REPO_ROOT / "images/cpu/Dockerfile"), "--image", "localhost/orch-cpu",
                      "--build-arg", f"PYTHON_IMAGE={ci_base}", *pip)  # fmt: skip
    built.append(cpu)
    assert cpu.startswith("localhost/orch-cpu:")

    config = _config(env, cpu)
    assert config["User"] == "10001" and config["WorkingDir"] == "/orch"
    assert "ORCH_OUTPUT_DIR=/orch/output" in config["Env"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == __import__("orchestrator").__version__
    assert labels["org.opencontainers.image.base.name"] == ci_base
    versions = buildah(env, "run", buildah(env, "from", cpu).strip(), "--", "python", "-c",
                       "import torch, orchestrator; print(torch.__version__)")  # fmt: skip
    assert versions.strip() == "2.13.0+cpu"  # the torch the torch stage installed, not re-resolved

    summary = _smoke(env, cpu, tmp_path)
    assert summary["steps"] == 3


def test_cuda_dockerfile_keeps_the_base_torch(
    buildah_env, torch_base, wheelhouse, built, tmp_path: Path
) -> None:
    env, base = (
        buildah_env,
        torch_base,
    )  # base: Python + CPU torch + torchrun, standing in for pytorch/pytorch
    pip = ["--build-arg", "PIP_NO_INDEX=1", "--build-arg", f"PIP_FIND_LINKS={wheelhouse}"]
    ref = _orch_build(env, "--image", "localhost/orch-trainer", "--build-arg", f"BASE_IMAGE={base}", *pip)
    built.append(ref)
    config = _config(env, ref)
    assert config["User"] == "10001" and config["WorkingDir"] == "/orch"
    assert config["Labels"]["org.opencontainers.image.base.name"] == base
    assert _smoke(env, ref, tmp_path)["steps"] == 3
