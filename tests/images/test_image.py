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
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.images.conftest import (
    ORCH,
    REPO_ROOT,
    buildah,
    container,
    container_file,
    free_port,
    image_config,
    orch_build,
    pip_from,
)

# A cold cache builds the base and torch images in the fixtures first (~9 min on a loaded 2-core machine): more than
# pytest-timeout's 600 s per test. The builds have their own subprocess timeouts (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


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


def _smoke(env: dict[str, str], name: str, tmp_path: Path) -> dict:
    """Run the rendered command in container `name` as the operator would start it; return summary.json."""
    pod, train_json = _rendered_pod(tmp_path)
    (tmp_path / "train.json").write_text(train_json)
    buildah(env, "copy", "--chmod", "0644", name, str(tmp_path / "train.json"), "/etc/orch/train.json")
    pod_env = {e["name"]: e["value"] for e in pod.get("env", []) if "value" in e}
    # What the training operator injects for a one-node job (here the node is the host's loopback,
    # since chroot isolation shares the host network); metrics off: no fixed port on a shared host.
    pod_env.update(PET_NNODES="1", PET_NODE_RANK="0", PET_MASTER_ADDR="127.0.0.1",
                   PET_MASTER_PORT=str(free_port()), ORCH_METRICS_PORT="0")  # fmt: skip
    env_args = [arg for key, value in pod_env.items() for arg in ("--env", f"{key}={value}")]
    result = subprocess.run(
        ["buildah", "run", *env_args, name, "--", *pod["command"], *pod.get("args", [])],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return json.loads(container_file(env, name, "/orch/output/summary.json"))


@pytest.fixture
def built(buildah_env: dict[str, str]):
    """Collects the images a test builds and removes them afterwards (the cached base stays)."""
    refs: list[str] = []
    yield refs
    for ref in refs:
        buildah(buildah_env, "rmi", "--force", ref, check=False)
    buildah(buildah_env, "rmi", "--prune", check=False)


def test_cpu_image_builds_and_trains(buildah_env, torch_base, wheelhouse, built, tmp_path: Path) -> None:
    """images/cpu/Dockerfile, whole. Its torch stage from a plain Python base is the torch_base fixture (`--target
    torch` on ci_base), so here the base is torch_base: the stage finds torch in its venv and installs nothing
    (pip installing torch a second time was ~40 of this test's ~100 CPU-s), and the rest is built as usual."""
    env = buildah_env
    cpu = orch_build(env, "--file", str(REPO_ROOT / "images/cpu/Dockerfile"), "--image", "localhost/orch-cpu",
                     "--build-arg", f"PYTHON_IMAGE={torch_base}", *pip_from(wheelhouse))  # fmt: skip
    built.append(cpu)
    assert cpu.startswith("localhost/orch-cpu:")

    config = image_config(env, cpu)
    assert config["User"] == "10001" and config["WorkingDir"] == "/orch"
    assert "ORCH_OUTPUT_DIR=/orch/output" in config["Env"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == __import__("orchestrator").__version__
    assert labels["org.opencontainers.image.base.name"] == torch_base
    with container(env, cpu) as name:
        versions = buildah(env, "run", name, "--", "python", "-c",
                           "import torch, orchestrator; print(torch.__version__)")  # fmt: skip
        assert versions.strip() == "2.13.0+cpu"  # the torch the torch stage installed, not re-resolved
        assert _smoke(env, name, tmp_path)["steps"] == 3


def test_cuda_dockerfile_keeps_the_base_torch(buildah_env, torch_base, trainer_image) -> None:
    """The top-level Dockerfile on torch_base (Python + CPU torch + torchrun, standing in for pytorch/pytorch):
    built by the trainer_image fixture, whose install script fails the build if pip moves the base's torch. That
    the rendered command trains in it is proven by test_workspace_image.py, which trains in a workspace layer
    on exactly this image (one container run instead of two; a vfs copy of the image each)."""
    config = image_config(buildah_env, trainer_image)
    assert config["User"] == "10001" and config["WorkingDir"] == "/orch"
    assert config["Labels"]["org.opencontainers.image.base.name"] == torch_base
