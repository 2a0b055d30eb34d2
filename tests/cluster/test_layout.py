"""The cluster package's boundaries: only it talks to `kubernetes`, and importing it costs nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"


def test_only_the_cluster_package_imports_kubernetes():
    importers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"^\s*(import kubernetes|from kubernetes\b)", path.read_text(), re.MULTILINE)
    }
    assert importers and all(p.startswith("cluster/") for p in importers), importers


def test_importing_the_cluster_package_does_not_import_kubernetes():
    """Every module is imported; `kubernetes` (~0.4 s) is loaded only inside the calls that need it."""
    modules = [
        "orchestrator.cluster." + ".".join(p.relative_to(PACKAGE / "cluster").with_suffix("").parts)
        for p in (PACKAGE / "cluster").rglob("*.py")
    ]
    code = f"import sys; import {', '.join(m.removesuffix('.__init__') for m in modules)}; print('kubernetes' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
