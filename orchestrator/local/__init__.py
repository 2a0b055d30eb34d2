"""`orch run`: the job's processes on this machine, through torch's elastic launcher (what torchrun uses).

The run goes plan -> claim -> launch, one module each, plus what it shows and where it is found:
- plan.py: LocalPlan and `plan()` (world size, steps, output directory, environment, restart budget), and
  the checks before anything starts (`check_devices`, `check_store`);
- output_dir.py: `claim()`, the output directory created and locked for one run at a time;
- processes.py: `run()`, the launch (torch's elastic agent, one process per rank through local_worker), its
  one-line failures (RunFailed, RunInterrupted) and summary.json;
- console.py: rank 0's log and the progress bar on the console, torch's logging and error files in
  OUT/logs/, the tracking links;
- index.py: the live-run index (`orch top NAME --local` finds a run's exporter).

(Not to be confused with orchestrator/launch.py, `python -m orchestrator.launch`: torchrun's wrapper inside a
pod.)
"""

from orchestrator.local.console import progress_text, tracking_links
from orchestrator.local.index import live_runs, metrics_url_of, runs_index
from orchestrator.local.output_dir import OutputDirBusy, claim
from orchestrator.local.plan import LocalPlan, check_devices, check_store, plan, restart_budget
from orchestrator.local.processes import RunFailed, RunInterrupted, run

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
