"""The live-run index: how `orch top NAME --local` finds a run's exporter. One small JSON file per live
local run of this user, written when the launch starts and removed when it ends (stale ones when read)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator import outputs, runtime_env
from orchestrator.local.planning import LocalPlan


def runs_index() -> Path:
    """One small JSON file per live local run (this user's), removed when the run ends."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"orch-{os.getuid()}" / "runs"


def register(local: LocalPlan, metrics_endpoint_file: Path | None) -> Path:
    """Write the run's record (OUT/run.json, and the live-run index); `metrics_endpoint_file`: where rank 0
    writes the address it serves, once it listens (orchestrator.trainer.metrics.announce)."""
    record = {
        "job": local.env[runtime_env.JOB_NAME],
        "pid": os.getpid(),
        "started": time.time(),
        "output_dir": str(local.output_dir.resolve()),
        "procs": local.world_size,
        "metrics_endpoint_file": str(metrics_endpoint_file) if metrics_endpoint_file else None,
    }
    outputs.write_json(local.output_dir / outputs.RUN_RECORD, record)
    index = runs_index()
    entry = index / f"{record['job']}-{os.getpid()}.json"
    try:
        index.mkdir(parents=True, exist_ok=True)
        entry.write_text(json.dumps(record) + "\n")
    except OSError:
        pass  # only `orch top --local` needs it
    return entry


def live_runs(job: str) -> list[dict[str, Any]]:
    """The local runs of `job` that are still running, newest first (stale entries are removed)."""
    found = []
    for entry in runs_index().glob(f"{job}-*.json"):
        record = outputs.read_json(entry)
        if record.get("job") != job:
            continue
        if not outputs.pid_alive(int(record.get("pid") or 0)):
            entry.unlink(missing_ok=True)
            continue
        found.append(record)
    return sorted(found, key=lambda r: r.get("started", 0), reverse=True)


def metrics_url_of(job: str) -> str | None:
    """The exporter URL of the newest live local run of `job` that serves metrics (rank 0 listens)."""
    served = (
        outputs.read_json(Path(r["metrics_endpoint_file"]))
        for r in live_runs(job)
        if r.get("metrics_endpoint_file")
    )
    return next((s["url"] for s in served if isinstance(s.get("url"), str)), None)
