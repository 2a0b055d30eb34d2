"""Workspaces (#24.1): which folder, which files go in, the content tag, the layer's Dockerfile, and the
warning for code the job names that neither the image nor the workspace has. Real files in tmp_path; the
builds themselves are in test_workspace_image.py (buildah)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from orchestrator import workspace
from orchestrator.job import loading
from tests.fakes.cli import run_orch  # in process, as the console script runs: the warnings are on stderr

BASE = "registry.example/team/trainer:abc"


def project(root: Path, job: str = "train: {task: 'mypkg.tasks:make_task'}\n") -> Path:
    """A user's folder: job.yaml, a package with the task, and what must never ship."""
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "tasks.py").write_text("def make_task():\n    pass\n")
    (root / "job.yaml").write_text(f"name: demo\nimage: {BASE}\n{job}")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "env2").mkdir()  # a venv under another name
    (root / "env2" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "runs" / "demo-1").mkdir(parents=True)
    (root / "runs" / "demo-1" / "summary.json").write_text("{}")
    (root / "out").mkdir()  # `orch run --out out`
    (root / "out" / "run.json").write_text("{}")
    (root / "out" / "model.pt").write_text("weights")
    (root / "mypkg" / "__pycache__").mkdir()
    (root / "mypkg" / "__pycache__" / "tasks.cpython-311.pyc").write_text("")
    return root


def spec_of(root: Path):
    return loading.load_job(root / "job.yaml")


def test_the_files_that_go_in_leave_out_git_venvs_and_run_outputs(tmp_path):
    root = project(tmp_path / "p")
    assert workspace.files(root) == ["job.yaml", "mypkg/__init__.py", "mypkg/tasks.py"]


def test_orchignore_wins_over_dockerignore_and_cannot_bring_back_git(tmp_path):
    root = project(tmp_path / "p")
    (root / "data.bin").write_text("big")
    (root / ".dockerignore").write_text("mypkg\n")
    assert "mypkg/tasks.py" not in workspace.files(root)
    (root / ".orchignore").write_text("*.bin\n!.git\n")
    assert workspace.files(root) == [".dockerignore", ".orchignore", "job.yaml", "mypkg/__init__.py",
                                     "mypkg/tasks.py"]  # fmt: skip


def test_the_default_workspace_is_the_job_folder_only_when_it_holds_the_code(tmp_path):
    root = project(tmp_path / "p")
    assert workspace.resolve(spec_of(root), root / "job.yaml") == root.resolve()
    shutil.rmtree(root / "mypkg")
    assert workspace.resolve(spec_of(root), root / "job.yaml") is None
    builtin = project(tmp_path / "b", job="train: {task: digits}\n")
    assert workspace.resolve(spec_of(builtin), builtin / "job.yaml") is None  # the image has digits
    named = project(tmp_path / "n", job="workspace: mypkg\ntrain: {task: digits}\n")
    assert workspace.resolve(spec_of(named), named / "job.yaml") == (named / "mypkg").resolve()
    off = project(tmp_path / "o", job="workspace: false\ntrain: {task: 'mypkg.tasks:make_task'}\n")
    assert workspace.resolve(spec_of(off), off / "job.yaml") is None


@pytest.mark.parametrize(
    ("command", "reference"),
    [
        ("[python, train.py, --lr, '1']", ("command", "train.py", None, "train.py")),
        ("[python3, -m, mypkg.train]", ("command", "mypkg.train", "mypkg.train", None)),
        ("[bash, scripts/run.sh]", ("command", "scripts/run.sh", None, "scripts/run.sh")),
        ("[./train]", ("command", "./train", None, "./train")),
        ("[/usr/bin/env, echo]", None),
    ],
)
def test_scripts_and_modules_a_command_names(tmp_path, command, reference):
    (tmp_path / "job.yaml").write_text(f"name: demo\ncommand: {command}\n")
    found = workspace.references(loading.load_job(tmp_path / "job.yaml"))
    assert [(r.field, r.name, r.module, r.path) for r in found] == ([reference] if reference else [])


def test_the_tag_is_the_files_and_the_base_not_timestamps_or_the_folder(tmp_path):
    root = project(tmp_path / "p")
    first = workspace.tag(root, BASE)
    assert first.startswith("workspace-") and len(first) == len("workspace-") + 12
    copy = tmp_path / "elsewhere"
    shutil.copytree(root, copy)  # another checkout of the same files
    os.utime(copy / "mypkg" / "tasks.py", (0, 0))
    (copy / "runs" / "demo-2").mkdir()  # outputs do not count
    (copy / "runs" / "demo-2" / "x").write_text("y")
    assert workspace.tag(copy, BASE) == first
    assert workspace.tag(root, BASE.replace("abc", "def")) != first  # another trainer image
    (copy / "mypkg" / "tasks.py").write_text("def make_task():\n    return 1\n")
    changed = workspace.tag(copy, BASE)
    assert changed != first
    (copy / "mypkg" / "tasks.py").chmod(0o755)
    assert workspace.tag(copy, BASE) != changed


def test_the_layer_dockerfile_installs_requirements_only_when_there_are_some():
    plain = workspace.dockerfile(BASE, requirements=False)
    assert plain.splitlines()[1:] == [
        f"FROM {BASE}",
        "COPY --chown=10001:0 . /orch/workspace/",
        "ENV PYTHONPATH=/orch/workspace",
        "WORKDIR /orch/workspace",
    ]
    with_requirements = workspace.dockerfile(BASE, requirements=True)
    assert "-r /orch/workspace/requirements.txt" in with_requirements
    assert "--constraint /tmp/keep-base.txt" in with_requirements  # the base's torch is kept, not reinstalled
    assert with_requirements.splitlines()[-2:] == [
        "ENV PYTHONPATH=/orch/workspace",
        "WORKDIR /orch/workspace",
    ]


@pytest.mark.parametrize("command", ["validate", "render"])
def test_validate_and_render_warn_about_code_neither_the_image_nor_the_workspace_has(tmp_path, command):
    root = project(tmp_path / "p")
    found = run_orch(command, str(root / "job.yaml"))
    assert "warning" not in found.stderr
    if command == "validate":
        assert f"  workspace: {root.resolve()} (3 files; orch submit --build ships them over the image)" in (
            found.stdout.splitlines()
        )
    shutil.rmtree(root / "mypkg")
    result = run_orch(command, str(root / "job.yaml"))
    assert result.returncode == 0
    assert result.stderr.splitlines() == [
        "warning: train.task 'mypkg.tasks:make_task': module mypkg.tasks is neither in the image's orchestrator "
        f"package nor in a workspace (none: {root.resolve()} does not hold it): the pods cannot find it unless "
        "the image installs it; put it in the workspace (docs/images.md, Workspaces) and submit with --build"
    ]


def test_a_script_outside_the_named_workspace_is_warned_about(tmp_path):
    root = project(tmp_path / "p", job="workspace: mypkg\n")
    (root / "job.yaml").write_text(
        f"name: demo\nimage: {BASE}\nworkspace: mypkg\ncommand: [python, train.py]\n"
    )
    (root / "train.py").write_text("print(1)\n")  # beside job.yaml, but the workspace is mypkg/
    result = run_orch("validate", str(root / "job.yaml"))
    assert result.returncode == 0
    assert result.stderr.splitlines() == [
        f"warning: command 'train.py': script train.py is neither in the image's orchestrator package nor in "
        f"the workspace {(root / 'mypkg').resolve()}: the pods cannot find it unless the image installs it; put "
        "it in the workspace (docs/images.md, Workspaces) and submit with --build"
    ]
