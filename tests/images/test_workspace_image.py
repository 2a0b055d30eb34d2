"""A workspace layer built for real with buildah (#24.1): its files, its tag's stability, a rebuild after one
file changes, and a job whose task lives in the workspace trained by the rendered pod command inside it.

What is real: buildah, the trainer image (the top-level Dockerfile on the CPU `torch` stage, as in
test_image.py), the layer's Dockerfile from orchestrator/imaging/workspace.py, torchrun and the trainer. What stands
in: the base images (no registry here, see conftest.py), the registry (nothing is pushed: push=False) and the
training operator, whose PET_* env the test sets.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.imaging import workspace
from tests.images.conftest import ORCH, buildah, container, container_file, free_port, image_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # a cold cache builds the bases too

TASK = '''"""A task of the user's own: the synthetic regression, under another name."""

from orchestrator.trainer.tasks.synthetic import make


def make_task(**task_args):
    return make(**task_args)
'''


def user_project(root: Path, image: str) -> Path:
    (root / "mytasks").mkdir(parents=True)
    (root / "mytasks" / "__init__.py").write_text("")
    (root / "mytasks" / "tiny.py").write_text(TASK)
    (root / "job.yaml").write_text(
        f"name: ws\nimage: {image}\nprocs_per_node: 2\nresources: {{cpu: 1}}\ntrain:\n  task: 'mytasks.tiny:make_task'\n"
        "  task_args: {kind: regression, samples: 256, features: 8, hidden: 16}\n"
        "  batch_size: 32\n  max_steps: 3\n  log_every: 1\n  eval_every: 0\n"
    )
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".venv").mkdir()
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "runs" / "ws-1").mkdir(parents=True)
    (root / "runs" / "ws-1" / "model.pt").write_text("old weights")
    # #33: what must not reach a layer unless .orchignore names it (tests/images/test_workspace.py has each kind)
    for secret in (".env", ".aws/credentials", ".kube/config", "mytasks/id_ed25519", "tls/server.key"):
        (root / secret).parent.mkdir(parents=True, exist_ok=True)
        (root / secret).write_text("SECRET-VALUE\n")
    (root / "mytasks" / "notes.txt").write_text("-----BEGIN RSA PRIVATE KEY-----\nSECRET-VALUE\n")
    (root / "mytasks" / "hosts").symlink_to("/etc/hosts")  # outside the workspace
    return root


def test_a_layer_holds_no_secret_and_only_the_files_as_the_tag_hashed_them(
    buildah_env, tmp_path, monkeypatch
):
    """#33, one real build FROM scratch (no RUN in the layer without requirements.txt, so no base is needed): the
    layer's files are the workspace's code and nothing of its secrets, with the modes and owner the tag means."""
    for key, value in buildah_env.items():
        monkeypatch.setenv(key, value)
    root = user_project(tmp_path / "project", "scratch")
    (root / "mytasks" / "tiny.py").chmod(0o600)  # the layer holds 0644 whatever the checkout's mode
    layer = workspace.build_layer(root, "scratch", "localhost/orch-ws-secrets", tool="buildah", push=False)
    try:
        with container(buildah_env, layer.ref) as name:
            mounted = Path(buildah(buildah_env, "mount", name).strip())
            try:
                found = {
                    str(p.relative_to(mounted)): (oct(p.lstat().st_mode & 0o7777), p.lstat().st_uid)
                    for p in mounted.rglob("*")
                }
                held = b"".join(
                    p.read_bytes() for p in mounted.rglob("*") if p.is_file() and not p.is_symlink()
                )
            finally:
                buildah(buildah_env, "umount", name, check=False)
        assert found == {
            "orch": (oct(0o755), 10001),  # made by the COPY here; the trainer image has its own
            "orch/workspace": (oct(0o755), 10001),
            "orch/workspace/job.yaml": (oct(0o644), 10001),
            "orch/workspace/mytasks": (oct(0o755), 10001),
            "orch/workspace/mytasks/__init__.py": (oct(0o644), 10001),
            "orch/workspace/mytasks/tiny.py": (oct(0o644), 10001),
        }
        assert b"SECRET-VALUE" not in held
        assert len(layer.notes) == 2  # the secrets and the link out, each said in one line
    finally:
        buildah(buildah_env, "rmi", "--force", layer.ref, check=False)


def layers(env: dict[str, str], ref: str) -> list[str]:
    return json.loads(buildah(env, "inspect", "--type", "image", ref))["OCIv1"]["rootfs"]["diff_ids"]


def test_a_workspace_layer_holds_its_files_keeps_its_tag_and_trains_the_users_task(
    buildah_env, trainer_image, tmp_path: Path, monkeypatch
) -> None:
    env, trainer = buildah_env, trainer_image
    for key, value in env.items():  # build_layer runs buildah with this process's environment
        monkeypatch.setenv(key, value)
    refs: list[str] = []
    try:
        root = user_project(tmp_path / "project", trainer)
        spec_file = root / "job.yaml"
        layer = workspace.build_layer(root, trainer, "localhost/orch-ws", tool="buildah", push=False)
        refs.append(layer.ref)
        assert layer.built and layer.ref.startswith("localhost/orch-ws:workspace-")
        # One layer over the trainer image, holding exactly the workspace's files (no .git, venv, runs/).
        assert len(layers(env, layer.ref)) == len(layers(env, trainer)) + 1
        config = image_config(env, layer.ref)
        assert config["User"] == "10001" and config["WorkingDir"] == "/orch/workspace"
        assert "PYTHONPATH=/orch/workspace" in config["Env"]
        with container(env, layer.ref) as name:  # one container (a vfs copy of the whole image) for both
            shipped = buildah(env, "run", name, "--", "find", "/orch/workspace", "-type", "f").split()
            assert sorted(shipped) == [f"/orch/workspace/{f}" for f in ("job.yaml", "mytasks/__init__.py",
                                                                         "mytasks/tiny.py")]  # fmt: skip
            assert _train(env, name, layer.ref, spec_file, tmp_path)["steps"] == 3

        # Same files: same tag, nothing built. One file changed: a new tag, built again.
        again = workspace.build_layer(root, trainer, "localhost/orch-ws", tool="buildah", push=False)
        assert (again.ref, again.built) == (layer.ref, False)
        (root / "mytasks" / "tiny.py").write_text(TASK + "\n# tuned\n")
        changed = workspace.build_layer(root, trainer, "localhost/orch-ws", tool="buildah", push=False)
        refs.append(changed.ref)
        assert changed.built and changed.ref != layer.ref
    finally:
        for ref in refs:
            buildah(env, "rmi", "--force", ref, check=False)
        buildah(env, "rmi", "--prune", check=False)


def _train(env: dict[str, str], name: str, ref: str, spec_file: Path, tmp_path: Path) -> dict:
    """The rendered PyTorchJob's command (the job's image set to `ref`) in container `name` of `ref`, as the
    operator starts it: summary.json."""
    rendered = subprocess.run([ORCH, "render", str(spec_file), "--set", f"image={ref}"], capture_output=True,
                              text=True, timeout=60)  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    assert "warning" not in rendered.stderr  # the task is in the workspace
    objects = [o for o in yaml.safe_load_all(rendered.stdout) if o]
    (tmp_path / "train.json").write_text(
        next(o for o in objects if o["kind"] == "ConfigMap")["data"]["train.json"]
    )
    job = next(o for o in objects if o["kind"] == "PyTorchJob")
    (pod,) = [r["template"]["spec"] for r in job["spec"]["pytorchReplicaSpecs"].values()]
    (main,) = pod["containers"]
    assert main["image"] == ref
    buildah(env, "copy", "--chmod", "0644", name, str(tmp_path / "train.json"), "/etc/orch/train.json")
    pod_env = {e["name"]: e["value"] for e in main.get("env", []) if "value" in e}
    pod_env.update(PET_NNODES="1", PET_NODE_RANK="0", PET_MASTER_ADDR="127.0.0.1",
                   PET_MASTER_PORT=str(free_port()), ORCH_METRICS_PORT="0")  # fmt: skip
    env_args = [arg for key, value in pod_env.items() for arg in ("--env", f"{key}={value}")]
    result = subprocess.run(["buildah", "run", *env_args, name, "--", *main["command"]], capture_output=True,
                            text=True, env={**os.environ, **env}, timeout=300)  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "training mytasks.tiny:make_task for 3 steps" in result.stdout + result.stderr
    return json.loads(container_file(env, name, "/orch/output/summary.json"))
