"""`orch submit --build`: build and push the job's image under a content tag, then submit exactly that reference.

The cluster is the kmock API emulator from tests/cluster (real HTTP, official client); the build is a real
buildah build of a FROM-scratch context, and the registry is a local server that refuses the push as a
registry does for a user without rights (no registry can be reached from here).
"""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

pytest.importorskip("kmock")

from orchestrator.imaging import builder  # noqa: E402
from tests.cluster.conftest import env, kube  # noqa: E402,F401  (fixtures)
from tests.images.test_build import _RefusingRegistry  # noqa: E402


@pytest.fixture
def context(tmp_path: Path) -> Path:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY hello /hello\n")
    (ctx / "hello").write_text("hi\n")
    return ctx


def job_file(tmp_path: Path, image: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(f"name: demo\nimage: {image}\ntrain: {{task: digits, batch_size: 64, max_steps: 5}}\n")
    return path


def test_client_dry_run_shows_the_build_and_the_image_the_job_would_run(env, tmp_path, context):  # noqa: F811
    job = job_file(tmp_path, "registry.example/team/trainer:old")
    result = env.orch("submit", str(job), "--build", "--build-context", str(context), "--build-tool", "buildah",
                      "--dry-run=client")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    ref = f"registry.example/team/trainer:{builder.context_tag(str(context))}"
    pytorchjob = next(o for o in yaml.safe_load_all(result.stdout) if o["kind"] == "PyTorchJob")
    (container,) = pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    assert container["image"] == ref
    assert f"buildah push {ref}" in result.stderr
    assert env.kube.requests() == []


def test_a_refused_push_submits_nothing(env, tmp_path, context, buildah_env):  # noqa: F811
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RefusingRegistry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    registry = f"127.0.0.1:{server.server_address[1]}"
    registries_conf = tmp_path / "registries.conf"
    registries_conf.write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
    job = job_file(tmp_path, f"{registry}/team/trainer:1")
    try:
        result = env.orch("submit", str(job), "--build", "--build-context", str(context), "--build-tool", "buildah",
                          env={**buildah_env, "CONTAINERS_REGISTRIES_CONF": str(registries_conf)})  # fmt: skip
    finally:
        server.shutdown()
    # The image was built before the push was refused: it is removed, the test's store keeps nothing of it.
    built = f"{registry}/team/trainer:{builder.context_tag(str(context))}"
    removed = subprocess.run(["buildah", "rmi", built], capture_output=True, text=True,
                             env={**os.environ, **buildah_env})  # fmt: skip
    assert result.exit_code == 1, result.stderr
    assert removed.returncode == 0, removed.stderr  # the reference the build was tagged with
    assert "denied by the registry" in result.stderr.strip().splitlines()[-1]
    assert env.kube.requests("post") == []  # asked (before the build) but never sent the job


def test_the_cluster_is_checked_before_anything_is_built(env, tmp_path, context):  # noqa: F811
    """#24.1: a job of that name exists: the refusal comes before the build (here the build could not even
    start: no build tool on PATH), so a multi-GB image is not built and pushed for nothing."""
    job = job_file(tmp_path, "registry.example/team/trainer:1")
    assert env.orch("submit", str(job)).exit_code == 0
    result = env.orch(
        "submit", str(job), "--build", "--build-context", str(context), env={"PATH": str(tmp_path)}
    )
    assert result.exit_code != 0
    assert result.stderr.strip().splitlines()[-1] == (
        'error: job demo already exists in namespace "team-a"; use --replace to delete it and submit again, '
        "or `orch delete demo` first"
    )


def test_a_workspace_goes_on_top_of_the_job_image_on_a_client_dry_run(env, tmp_path):  # noqa: F811
    """#24.1: the task lives beside job.yaml and the folder has no Dockerfile: the job's image is the trainer
    image, and the workspace layer over it is what the job runs."""
    from orchestrator.imaging import workspace

    project = tmp_path / "project"
    (project / "mypkg").mkdir(parents=True)
    (project / "mypkg" / "tasks.py").write_text("def make_task():\n    pass\n")
    job = project / "job.yaml"
    job.write_text(
        "name: demo\nimage: registry.example/team/trainer:1\nresources: {cpu: 1}\n"
        "train: {task: 'mypkg.tasks:make_task'}\n"
    )
    result = env.orch("submit", str(job), "--build", "--build-context", str(project), "--build-tool", "buildah",
                      "--dry-run=client")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    ref = f"registry.example/team/trainer:{workspace.tag(project, 'registry.example/team/trainer:1')}"
    pytorchjob = next(o for o in yaml.safe_load_all(result.stdout) if o["kind"] == "PyTorchJob")
    (container,) = pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    assert container["image"] == ref
    assert f"workspace {project}: 2 files -> {ref} (FROM registry.example/team/trainer:1)" in result.stderr
    assert "warning" not in result.stderr
    assert env.kube.requests() == []
