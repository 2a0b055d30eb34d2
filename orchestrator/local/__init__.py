"""`orch run`: the job's processes on this machine, through torch's elastic launcher (what torchrun uses).

The run goes plan -> claim -> launch, one module each, plus what it shows and where it is found:
- planning.py: LocalPlan and `plan()` (world size, steps, output directory, environment, restart budget),
  and the checks before anything starts (`check_devices`, `check_store`);
- output_dir.py: `claim()`, the output directory created and locked for one run at a time;
- processes.py: `run()`, the launch (torch's elastic agent, one process per rank through worker.py), its
  one-line failures (RunFailed, RunInterrupted) and summary.json;
- worker.py: the shim each rank starts through (`python -m orchestrator.local.worker`): tied to the
  launcher, its output to its log, then the rank's command;
- console.py: rank 0's log and the progress bar on the console, torch's logging and error files in
  OUT/logs/, the tracking links;
- index.py: the live-run index (`orch top NAME --local` finds a run's exporter).

Callers use the names below. Each is imported on first use, not with the package: every rank starts
through worker.py, inside this package, and must not wait for the job spec's models to load.

(Not to be confused with orchestrator/launch.py, `python -m orchestrator.launch`: torchrun's wrapper inside a
pod.)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.local.console import progress_text, tracking_links
    from orchestrator.local.index import live_runs, metrics_url_of, runs_index
    from orchestrator.local.output_dir import OutputDirBusy, claim
    from orchestrator.local.planning import LocalPlan, check_devices, check_store, plan, restart_budget
    from orchestrator.local.processes import RunFailed, RunInterrupted, run

# Each exported name and its module (tests/trainer/test_local_package.py checks them against __all__).
_EXPORTS = {
    "LocalPlan": "planning",
    "OutputDirBusy": "output_dir",
    "RunFailed": "processes",
    "RunInterrupted": "processes",
    "check_devices": "planning",
    "check_store": "planning",
    "claim": "output_dir",
    "live_runs": "index",
    "metrics_url_of": "index",
    "plan": "planning",
    "progress_text": "console",
    "restart_budget": "planning",
    "run": "processes",
    "runs_index": "index",
    "tracking_links": "console",
}

__all__ = [
    "LocalPlan",
    "OutputDirBusy",
    "RunFailed",
    "RunInterrupted",
    "check_devices",
    "check_store",
    "claim",
    "live_runs",
    "metrics_url_of",
    "plan",
    "progress_text",
    "restart_budget",
    "run",
    "runs_index",
    "tracking_links",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value  # once: the next access is a plain attribute
    return value
