"""`orch render` stays light (no torch, no kubernetes) and works from an installed wheel, not only a checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
EXAMPLE = REPO / "examples" / "gpt-multinode.yaml"
HEAVY = ("torch", "kubernetes", "optuna", "matplotlib")


def imported_modules(*args: str) -> set[str]:
    """Top-level modules the real `orch` entry point imports for `args` (python -X importtime)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line.split("|")[-1] for line in result.stderr.splitlines() if line.startswith("import time:")]
    return {name.strip().split(".")[0] for name in lines}


@pytest.mark.parametrize(
    "args",
    [("--help",), ("render", str(EXAMPLE)), ("validate", str(EXAMPLE))],
    ids=["help", "render", "validate"],
)
def test_cli_does_not_import_torch_or_kubernetes(args):
    modules = imported_modules(*args)
    assert "orchestrator" in modules and "click" in modules  # the measurement sees imports at all
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def test_help_does_not_import_jinja2_or_pydantic():
    assert not imported_modules("--help") & {"jinja2", "pydantic", "yaml"}


def test_render_does_not_import_logging():
    """runtime_env imports logging only to warn in the trainer (benchmarks/cli.py times `orch render`)."""
    assert "logging" not in imported_modules("render", str(EXAMPLE))


def test_render_does_not_import_the_status_model_or_the_image_builder():
    """benchmarks/cli.py times `orch render`: the API modules import the job status model where they read a
    job (~4 ms), the missing-code warning imports the builder only for a job with a workspace (~3 ms)."""
    probe = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('loaded:', *sorted(m for m in sys.modules if m.startswith('orch'))))\n"
        "sys.argv = ['orch', 'render', sys.argv[1]]\n"
        "from orchestrator.cli import main\n"
        "main()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(EXAMPLE)], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(result.stdout.rsplit("loaded:", 1)[1].split())
    assert {"orchestrator.apis.pytorchjob", "orchestrator.imaging.workspace"} <= loaded  # it sees them
    assert not loaded & {"orchestrator.status", "orchestrator.imaging.builder"}


def test_the_cli_freezes_its_objects_before_python_finalizes():
    """orch's entry point leaves Python's last collection nothing to scan (~30 ms of `orch render`, whose
    pydantic validators and compiled templates are cycles of many objects). An exit handler registered
    before the CLI runs runs after the CLI's (they run last registered first) and sees the freeze."""
    probe = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen objects:', gc.get_freeze_count()))\n"
        "sys.argv = ['orch', 'render', sys.argv[1]]\n"
        "from orchestrator.cli import main\n"
        "main()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(EXAMPLE)], capture_output=True, text=True, timeout=60, check=True
    )
    frozen = int(result.stdout.rsplit("frozen objects:", 1)[1])
    assert frozen > 10_000, frozen  # the imports' objects, not a handful


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Build the wheel from a copy of the sources (keeps build/ and *.egg-info out of the checkout)."""
    source = tmp_path_factory.mktemp("src")
    # pyproject's package-data: README, and the trainer image's build files the wheel carries
    # (orchestrator.build_context: `orch build` from any folder) beside the code and the templates.
    for name in ("pyproject.toml", "README.md", "Dockerfile", ".dockerignore"):
        shutil.copy(REPO / name, source / name)
    for name in ("orchestrator", "manifests", "images"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            str(source),
            "-w",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("orch_trainer-*.whl")
    return built


def test_wheel_ships_the_templates(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in ("pytorchjob.yaml.j2", "configmap.yaml.j2", "podmonitor.yaml.j2", "__init__.py"):
        assert f"orchestrator/manifests/{template}" in names


def test_render_from_the_installed_wheel(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import orchestrator.manifests as m, orchestrator.rendering.render as r, orchestrator.rendering.templates as t;"
            "print(m.__file__, r.__file__, t._environment().get_template('pod.yaml.j2').filename)",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    ).stdout
    # the wheel's copy, not the checkout; its templates precompiled (rendering/precompiled/), not compiled again
    assert str(REPO) not in where and where.count(str(target)) == 3, where
    job = tmp_path / "job.yaml"
    shutil.copy(EXAMPLE, job)
    installed = subprocess.run(
        [sys.executable, "-m", "orchestrator", "render", str(job)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    checkout = subprocess.run(
        [sys.executable, "-m", "orchestrator", "render", str(job)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout == checkout.stdout and "kind: PyTorchJob" in installed.stdout


def test_wheel_ships_every_module_and_manifest(wheel):
    """A new subpackage (or manifests/ subfolder) must be listed in pyproject.toml, or the wheel lacks it."""
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {
        f"orchestrator/{p.relative_to(REPO / 'orchestrator')}" for p in (REPO / "orchestrator").rglob("*.py")
    }
    manifests = {
        f"orchestrator/manifests/{p.relative_to(REPO / 'manifests')}"
        for p in (REPO / "manifests").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert sorted((sources | manifests) - names) == []
