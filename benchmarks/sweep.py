"""11. Sweep overhead: the time between one trial ending and the next starting, `orch sweep` beside a plain
shell loop of `orch run` over the same parameters.

A trial's end is when its summary.json was written (rank 0's last file), its start when its `orch run`
registered the run (run.json's `started`, once Python, orch and torch's launcher are imported and the
output dir is claimed). The gap therefore holds what both pay (the finished `orch run` leaving, the next one
starting) and, for the sweep, its own bookkeeping: reading objective.json, telling Optuna (the journal file),
asking for the next point, starting the process. Both run one trial at a time (`parallel: 1`), the same
tiny digits job (one process, 4 steps) and the same learning rates (the shell loop takes the sweep's).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import BenchError, median, ms, ratio, table

JOB = """\
name: bench-sweep
nodes: 1
procs_per_node: 1
metrics: {enabled: false}
train:
  task: digits
  batch_size: 32
  max_steps: 4
  log_every: 2
  eval_every: 2
"""

SWEEP = """\
job: job.yaml
objective: {metric: eval/loss, goal: minimize}
parameters:
  train.optimizer.lr: {type: float, low: 1.0e-3, high: 3.0e-2, log: true}
algorithm: random
max_trials: TRIALS
parallel: 1
"""


def overhead(*, trials: int) -> dict[str, Any]:
    workdir = harness.scratch_dir("orch-bench-sweep-")
    (workdir / "job.yaml").write_text(JOB)
    (workdir / "sweep.yaml").write_text(SWEEP.replace("TRIALS", str(trials)))
    env = harness.base_env()
    orch = [harness.PYTHON, "-m", "orchestrator"]
    swept = subprocess.run(
        [*orch, "sweep", "sweep.yaml"], cwd=workdir, env=env, capture_output=True, text=True
    )
    if swept.returncode != 0:
        raise BenchError(f"orch sweep failed: {swept.stdout[-2000:]}{swept.stderr[-2000:]}")
    status = subprocess.run(
        [*orch, "sweep", "status", "sweep.yaml", "-o", "json"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
    )
    rows = sorted(json.loads(status.stdout)["trials"], key=lambda row: row["number"])
    sweep_dirs = [workdir / row["run_dir"] for row in rows]  # relative to where `orch sweep` ran
    # the plain loop a user would write, over the sweep's own points
    loop = "\n".join(
        shlex.join([*orch, "run", "job.yaml", "--set", f"train.optimizer.lr={row['params']['train.optimizer.lr']!r}",
                    "--out", f"loop/trial-{row['number']}"]) + " > /dev/null"
        for row in rows
    )  # fmt: skip
    looped = subprocess.run(["bash", "-e", "-c", loop], cwd=workdir, env=env, capture_output=True, text=True)
    if looped.returncode != 0:
        raise BenchError(f"the shell loop failed: {looped.stderr[-2000:]}")
    loop_dirs = [workdir / "loop" / f"trial-{row['number']}" for row in rows]
    gaps = {"orch sweep": _gaps(sweep_dirs), "shell loop of orch run": _gaps(loop_dirs)}
    sweep_gap, loop_gap = median(gaps["orch sweep"]), median(gaps["shell loop of orch run"])
    print(
        f"\n11. Sweep overhead: time from one trial's end to the next one's start ({trials} trials, 1 at a time)"
    )
    print(
        table(
            ["runner", "median gap", "min", "max", "vs shell loop"],
            [
                [name, ms(median(values)), ms(min(values)), ms(max(values)), ratio(median(values) / loop_gap)]
                for name, values in gaps.items()
            ],
        )
    )
    print(f"the sweep's own cost per trial: {ms(sweep_gap - loop_gap)} (median gap minus the loop's)")
    return {
        "trials": trials,
        "gaps_seconds": gaps,
        "sweep_median": sweep_gap,
        "loop_median": loop_gap,
        "ratio": sweep_gap / loop_gap,
    }


def _gaps(run_dirs: list[Path]) -> list[float]:
    """Seconds from each trial's summary.json to the next trial's run.json `started`."""
    ends = [(d / "summary.json").stat().st_mtime for d in run_dirs]
    starts = [json.loads((d / "run.json").read_text())["started"] for d in run_dirs]
    return [start - end for end, start in zip(ends[:-1], starts[1:], strict=True)]
