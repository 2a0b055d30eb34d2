"""Fixtures for the spec/render tests: the example files and a loader for them."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.job import loading

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def example_ids() -> list[str]:
    return [path.stem for path in EXAMPLES]


@pytest.fixture(params=EXAMPLES, ids=example_ids())
def example(request: pytest.FixtureRequest) -> Path:
    """Each file in examples/ in turn (new examples are picked up automatically)."""
    return request.param


def load(text: str, tmp_path: Path, *overrides: str):
    """A JobSpec from job.yaml text (written to tmp_path), through the real loader."""
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    return loading.load_job(path, overrides)
