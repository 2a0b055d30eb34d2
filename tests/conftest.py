"""Shared test helpers. Each area keeps its own fixtures in tests/<area>/conftest.py."""

from __future__ import annotations

import os
import shutil

import pytest

# tests/tiers.py marks every test's tier (launch/slow/smoke) at collection and checks it while the test runs.
pytest_plugins = ["tests.tiers", "pytester"]

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_tool(name: str) -> str:
    """Path of an external tool the test needs. Missing: skip locally, fail in CI (CI must run everything)."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (.ci/run installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


require_tool.starts_a_process = True  # type: ignore[attr-defined]  # tests/tiers.py: the test runs the tool


@pytest.fixture(scope="session", autouse=True)
def _scratch_tmpdir(tmp_path_factory):
    """Processes the tests start write their temporary files (torchrun's torchelastic_* log folders, metrics
    files) under this session's pytest folder, which pytest rotates, instead of leaving them in /tmp."""
    scratch = tmp_path_factory.mktemp("tmpdir")
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(scratch)
    yield
    if saved is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved
