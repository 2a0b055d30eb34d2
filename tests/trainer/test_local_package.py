"""orchestrator.local's names are imported on first use: every rank of `orch run` starts through the shim in
the package (local/worker.py), which must start without the job spec's models (pydantic) or torch."""

from __future__ import annotations

import importlib
import subprocess
import sys

from orchestrator import local
from tests.trainer.conftest import REPO


def test_every_exported_name_comes_from_the_module_the_table_names():
    assert sorted(local.__all__) == sorted(local._EXPORTS)
    for name, module in local._EXPORTS.items():
        assert getattr(local, name) is getattr(importlib.import_module(f"orchestrator.local.{module}"), name)


def test_the_ranks_shim_imports_only_what_it_needs():
    code = (
        "import sys, orchestrator.local.worker\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('orchestrator', 'pydantic', 'torch')))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.stdout.split("\n")[0] == str(
        ["orchestrator", "orchestrator.errors", "orchestrator.exit_codes", "orchestrator.local", "orchestrator.local.worker",
         "orchestrator.outputs"]
    ), result.stderr  # fmt: skip
