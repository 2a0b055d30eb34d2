"""Fixtures of the cluster tests: an emulated API server (tests/fakes/) and a user whose kubeconfig points at it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.cli import FAST, Env, write_kubeconfig
from tests.fakes.emulator import serve
from tests.fakes.kube import Kube


@pytest.fixture
def kube():  # type: ignore[no-untyped-def]
    with serve() as k:
        yield k


@pytest.fixture
def env(kube: Kube, tmp_path: Path) -> Env:
    """A user whose kubeconfig points at the emulator; current context "dev" has namespace "team-a"."""
    home = tmp_path / "home"
    home.mkdir()
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig",
        kube.url,
        contexts={"dev": "team-a", "prod": "team-b", "bare": None},
        current="dev",
    )
    return Env(kube, kubeconfig, home, {"KUBECONFIG": str(kubeconfig), "HOME": str(home), **FAST})


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    """A 3-node job with a Master and Workers (restart.policy on-failure; policy job renders Workers only)."""
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: demo\nimage: registry.example/trainer:1\nnodes: 3\nrestart:\n  policy: on-failure\n"
        "train:\n  task: digits\n  batch_size: 96\n  max_steps: 10\n"
    )
    return path
