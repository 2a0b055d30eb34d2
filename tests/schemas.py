"""Where the tests find the upstream CRD schemas: the one place that knows.

The CRDs (PyTorchJob, TrainJob, JobSet, Prometheus Operator kinds) are upstream files kept beside a checkout,
never copied into the repo. The setting `ORCH_CRD_SCHEMAS` names their folder; unset, it is `../shared/schemas`
relative to the repo root; a relative value is relative to the repo root too. A test that needs a file that is
not there skips with one line naming the file and the setting, except under `CI=true`, where it fails (CI has
the schemas and must run every schema test).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import IN_CI

REPO = Path(__file__).resolve().parents[1]
SETTING = "ORCH_CRD_SCHEMAS"
DEFAULT = "../shared/schemas"


def schemas_dir() -> Path:
    """The folder `ORCH_CRD_SCHEMAS` names (it may not exist)."""
    return (REPO / os.environ.get(SETTING, DEFAULT)).resolve()


def crd_file(name: str) -> Path:
    """The path of one CRD file, e.g. `pytorchjobs.kubeflow.org.yaml`; skip (fail in CI) when it is absent."""
    path = schemas_dir() / name
    if not path.is_file():
        message = (
            f"CRD schema {name} not found in {schemas_dir()}: "
            f"set {SETTING} to the folder holding the upstream CRD files (default {DEFAULT})"
        )
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path
