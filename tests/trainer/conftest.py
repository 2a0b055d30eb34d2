"""Helpers for trainer tests: write a job file, run `orch run` as a subprocess (the honest exit code)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ORCH = [sys.executable, "-m", "orchestrator"]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    out: Path

    @property
    def summary(self) -> dict[str, Any]:
        return json.loads((self.out / "summary.json").read_text())

    def state_dict(self) -> dict[str, Any]:
        import torch

        return torch.load(self.out / "model.pt", weights_only=True)


def job(
    name: str = "t", *, nodes: int = 1, procs: int = 1, elastic: dict | None = None, **train: Any
) -> dict:
    """A job dict for the synthetic task; `train` keys override the defaults below."""
    spec: dict[str, Any] = {
        "name": name,
        "nodes": nodes,
        "procs_per_node": procs,
        "train": {
            "task": "synthetic",
            "task_args": {"samples": 256, "eval_samples": 64},
            "batch_size": 16,
            "micro_batch_size": 4,
            "max_steps": 12,
            "log_every": 4,
            "eval_every": 0,
            "optimizer": {"name": "sgd", "lr": 0.05},
            "deterministic": True,  # the tests compare parameters across runs bit for bit
            **train,
        },
    }
    if elastic:
        spec["elastic"] = elastic
    return spec


def write_job(directory: Path, spec: dict) -> Path:
    path = directory / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def orch_run(job_file: Path, out: Path, *args: str, timeout: float = 180, env: dict | None = None) -> Run:
    result = subprocess.run(
        [*ORCH, "run", str(job_file), "--out", str(out), *args],
        cwd=REPO,  # plug-in tasks in tests/ are imported by the workers as tests.trainer.plugin_tasks
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    return Run(result.returncode, result.stdout, result.stderr, out)


@pytest.fixture
def run_job(tmp_path):
    """run_job(spec, *args) -> Run, each in its own output directory."""
    counter = iter(range(1000))

    def run(spec: dict, *args: str, out: Path | None = None, **kwargs: Any) -> Run:
        job_file = write_job(tmp_path, spec)
        return orch_run(job_file, out or tmp_path / f"out-{next(counter)}", *args, **kwargs)

    return run


def assert_same_params(a: dict, b: dict, *, rtol: float = 0.0, atol: float = 0.0) -> None:
    import torch

    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.fixture
def tiny_disk(tmp_path):
    """A real filesystem of 256 KiB (tmpfs): writes past it fail with ENOSPC."""
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", f"orch-test-{uuid.uuid4().hex[:8]}", str(mount)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {result.stderr.strip()}")
    yield mount
    # --lazy: a file the test's process still holds open there (an FSDP writer thread, a failed save's handle)
    # made a plain umount fail as busy and left the mount behind after the run; lazy detaches it now and frees
    # it when the last handle closes.
    subprocess.run(["umount", "--lazy", str(mount)], check=False)


@pytest.fixture
def tf32_state():
    """Restores torch's process-wide TF32 settings after a test that changes them."""
    import torch

    saved = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32 = saved[1]
