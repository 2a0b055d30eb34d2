"""Whole rendered objects for every file in examples/, compared with tests/spec/golden/<example>.yaml.

After an intended change to rendering (or a new example), regenerate and review the diff:
    ORCH_UPDATE_GOLDENS=1 .venv/bin/pytest tests/spec/test_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from orchestrator import loading, render
from tests.spec.conftest import EXAMPLES

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("ORCH_UPDATE_GOLDENS") == "1"


def test_rendered_objects_match_golden(example):
    objects = render.render(loading.load_job(example))
    golden = GOLDEN / f"{example.stem}.yaml"
    if UPDATE:
        golden.write_text(render.to_yaml(objects), encoding="utf-8")
    assert golden.exists(), f"no golden for {example.name}: run with ORCH_UPDATE_GOLDENS=1 and review it"
    assert list(yaml.safe_load_all(golden.read_text(encoding="utf-8"))) == objects


def test_no_golden_without_an_example():
    stale = {p.stem for p in GOLDEN.glob("*.yaml")} - {p.stem for p in EXAMPLES}
    assert not stale, f"golden files without an example (delete them): {sorted(stale)}"
