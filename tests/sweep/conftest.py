"""A tiny digits job (one process, 20 steps, an evaluation every 5) and sweep files beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DIGITS_JOB: dict[str, Any] = {
    "name": "digits-sweep",
    "nodes": 1,
    "procs_per_node": 1,
    "metrics": {"enabled": False},
    "train": {
        "task": "digits",
        "batch_size": 32,
        "micro_batch_size": 32,
        "optimizer": {"name": "adamw", "lr": 3.0e-3},
        "max_steps": 20,
        "log_every": 5,
        "eval_every": 5,
        "checkpoint": {"every_steps": 10, "keep": 1},
    },
}


def write_sweep(
    folder: Path, text: str, *, job: dict[str, Any] | None = None, name: str = "sweep.yaml"
) -> Path:
    """sweep.yaml (as written: line numbers matter) and its job.yaml in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.yaml").write_text(yaml.safe_dump(job or DIGITS_JOB, sort_keys=False))
    path = folder / name
    path.write_text(text)
    return path
