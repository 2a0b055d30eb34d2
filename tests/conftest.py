"""Shared test helpers. Each area keeps its own fixtures in tests/<area>/conftest.py."""

from __future__ import annotations

import os
import shutil

import pytest

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
