"""Where a sweep's trials run. The controller (sweep/controller.py) asks a `TrialRunner` to start a trial, to
take over one the study holds as running after a restart, and polls what it started; `LocalTrials` runs each
trial as an `orch run` of its own on this machine, `ClusterTrials` (sweep/cluster_trials.py) as a job on a
cluster, found again by its labels.

A local trial is `python -m orchestrator run JOB --set PATH=VALUE ... --out runs/NAME/trial-N`, in a session
of its own (a Ctrl-C in the terminal reaches `orch sweep` only, which stops the trials), tied to `orch sweep`
by PR_SET_PDEATHSIG: SIGTERM when the sweep dies however it dies, so the trial checkpoints and stops instead
of training on unwatched. Its console goes to trial-N/console.log. The trainer writes the objective to
trial-N/objective.json (orchestrator/trainer/objective.py); a trial is pruned by creating trial-N/prune.request,
which the trainer's stop path ends as a finished run (checkpoint, summary.json, exit 0).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, Protocol

from orchestrator import hardware, outputs, runtime_env
from orchestrator.sweep import owners
from orchestrator.sweep.spec import Sweep


@dataclass(frozen=True)
class TrialPlan:
    """What one trial runs: the study's trial number, its parameters, and where."""

    number: int
    params: dict[str, Any]
    run: str
    """Its run dir, relative to the sweep's folder (trial-N), or its job's name."""
    env: dict[str, str] = field(default_factory=dict)
    """What its processes' environment gets besides the job's (its MLflow run's name and parent)."""
    avoid_nodes: tuple[str, ...] = ()
    """Nodes earlier trials' failures pointed at (suspected hardware): a cluster trial is kept off them."""


OutcomeState = Literal["complete", "pruned", "failed", "interrupted", "retry"]


@dataclass(frozen=True)
class Outcome:
    """How a trial ended. `interrupted`: stopped by the sweep (or cut off), to be resumed or asked again;
    `retry`: failed for a reason its values did not cause (its node's hardware), to be asked again elsewhere."""

    state: OutcomeState
    value: float | None = None
    exit_class: str | None = None
    error: str | None = None
    recorded: list[str] = field(default_factory=list)
    """The metrics the trial recorded, when the objective was not among them."""
    nodes: list[str] = field(default_factory=list)
    """The nodes its failure points at (a cluster trial's suspected nodes): later trials are kept off them."""


class Running(Protocol):
    """A trial being run."""

    plan: TrialPlan

    def values(self) -> list[tuple[int, float]]:
        """The objective's values so far, (step, value), in step order."""
        ...

    def prune(self) -> None:
        """Stop it as pruned (its checkpoint kept, an exit nothing retries)."""
        ...

    def interrupt(self, signum: int) -> None:
        """The sweep stops: stop the trial so that it can be resumed (its stop checkpoint)."""
        ...

    def kill(self) -> None:
        """Stop it now (a second Ctrl-C)."""
        ...

    def poll(self) -> Outcome | None:
        """How it ended, or None while it runs."""
        ...


Where = Literal["local", "cluster"]


class TrialRunner(Protocol):
    where: Where
    """Where its trials run; a sweep's study keeps it, and is continued only there."""
    place: dict[str, str]
    """Which cluster and namespace (study.CLUSTER's keys); {} here. Kept in the study too."""

    def prepare(self) -> None:
        """Before the first trial, once the study is known to be continued here: what must hold first."""
        ...

    def run_name(self, number: int) -> str:
        """Trial `number`'s run (kept in the study): its run dir, or its job's name."""
        ...

    def describe(self, plan: TrialPlan) -> str:
        """Where the trial runs, as the sweep's lines show it."""
        ...

    def start(self, plan: TrialPlan) -> Running:
        """Start a new trial, or resume one this runner found cut off."""
        ...

    def reconcile(self, plan: TrialPlan) -> Running | Outcome | None:
        """A trial the study holds as running whose sweep process died: go on with it (re-attached or
        resumed), or how it ended (finished meanwhile, or lost: `interrupted`); None while it is still
        stopping (try again later)."""
        ...


# --- here: one `orch run` per trial -------------------------------------------------------------------------


class LocalTrials:
    """Trials as `orch run` processes on this machine."""

    where: Where = "local"

    def __init__(self, sweep: Sweep) -> None:
        self.sweep = sweep
        self.place: dict[str, str] = {}

    def prepare(self) -> None:
        pass

    def run_name(self, number: int) -> str:
        return f"trial-{number}"

    def describe(self, plan: TrialPlan) -> str:
        return f"{self.run_dir(plan)}/"

    def run_dir(self, plan: TrialPlan) -> Path:
        return self.sweep.folder / plan.run

    def start(self, plan: TrialPlan) -> LocalTrial:
        run_dir = self.run_dir(plan)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / outputs.PRUNE_REQUEST).unlink(missing_ok=True)
        argv = [sys.executable, "-m", "orchestrator", "run", str(self.sweep.job_file)]
        for override in self.sweep.overrides(plan.params):
            argv += ["--set", override]
        argv += ["--out", str(run_dir)]
        env = {
            **os.environ,
            **plan.env,
            runtime_env.OBJECTIVE: self.sweep.metric,
            runtime_env.PRUNE_FILE: str((run_dir / outputs.PRUNE_REQUEST).resolve()),
        }
        console = open(run_dir / outputs.CONSOLE, "ab")  # noqa: SIM115 (the child's stdout; closed when it ends)
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_stop_with_parent,
        )
        return LocalTrial(plan, run_dir, process, console, self.sweep.metric)

    def reconcile(self, plan: TrialPlan) -> LocalTrial | Outcome | None:
        run_dir = self.run_dir(plan)
        if not run_dir.is_dir():
            return Outcome("interrupted", error=f"{run_dir} is gone")
        if owners.locked(run_dir / outputs.RUN_LOCK):
            return None  # its orch run outlived the sweep and is still writing its stop checkpoint
        if (run_dir / outputs.SUMMARY).exists():  # it finished while no sweep watched
            return finished(run_dir, self.sweep.metric)
        if has_checkpoint(run_dir, self.sweep):
            return self.start(plan)  # `orch run` on the same --out resumes from the checkpoint
        return Outcome("interrupted", exit_class="interrupted", error="cut off before its first checkpoint")


class LocalTrial:
    """One trial's `orch run` process."""

    def __init__(
        self,
        plan: TrialPlan,
        run_dir: Path,
        process: subprocess.Popen[bytes],
        console: IO[bytes],
        metric: str,
    ) -> None:
        self.plan, self.run_dir, self.process, self.metric = plan, run_dir, process, metric
        self._console = console
        self._interrupted = False
        self._seen: tuple[float, list[tuple[int, float]]] = (0.0, [])

    def values(self) -> list[tuple[int, float]]:
        path = self.run_dir / outputs.OBJECTIVE
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            return []
        if mtime != self._seen[0]:
            self._seen = (mtime, reported_values(read_objective(path)))
        return self._seen[1]

    def prune(self) -> None:
        (self.run_dir / outputs.PRUNE_REQUEST).touch()

    def interrupt(self, signum: int) -> None:
        self._interrupted = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signum)  # orch run forwards it: every rank checkpoints and stops

    def kill(self) -> None:
        self._interrupted = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def poll(self) -> Outcome | None:
        code = self.process.poll()
        if code is None:
            return None
        self._console.close()
        if code == 0:
            return finished(self.run_dir, self.metric)
        error = last_error(self.run_dir / outputs.CONSOLE)
        stopped = code in (130, 128 + signal.SIGTERM) or -code in (signal.SIGINT, signal.SIGTERM)
        if self._interrupted and stopped:
            return Outcome("interrupted", exit_class="interrupted", error=error)
        return Outcome("failed", exit_class=exit_class(code), error=error)


def finished(run_dir: Path, metric: str) -> Outcome:
    """A trial whose `orch run` exited 0: complete with its final value, pruned, or failed for want of one."""
    objective = read_objective(run_dir / outputs.OBJECTIVE)
    return ended(objective, outputs.read_json(run_dir / outputs.SUMMARY), metric)


def ended(objective: dict[str, Any], summary: dict[str, Any], metric: str) -> Outcome:
    """How a trial that ran to its end did, from its objective.json and summary.json ({} where missing)."""
    values = reported_values(objective)
    if summary.get("pruned") or objective.get("pruned"):
        return Outcome("pruned", value=values[-1][1] if values else None)
    final = _number(objective.get("final"))
    if final is None:
        recorded = [str(name) for name in objective.get("recorded") or []]
        return Outcome(
            "failed",
            exit_class="no objective",
            error=f"the trial recorded no {metric}"
            + (f" (it recorded {', '.join(recorded)})" if recorded else f" ({outputs.OBJECTIVE})"),
            recorded=recorded,
        )
    if not math.isfinite(final):
        return Outcome("failed", value=None, exit_class="nan", error=f"{metric} is {final}")
    return Outcome("complete", value=final)


def read_objective(path: Path) -> dict[str, Any]:
    return outputs.read_json(path)


def reported_values(objective: dict[str, Any]) -> list[tuple[int, float]]:
    """objective.json's (step, value) pairs that are numbers (a NaN, written as "nan", is not reported)."""
    found = []
    for entry in objective.get("values") or []:
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int):
            value = _number(entry[1])
            if value is not None and math.isfinite(value):
                found.append((entry[0], value))
    return sorted(found)


def exit_class(code: int) -> str:
    """Why a trial's `orch run` failed, from its exit code (docs/sweeps.md lists them)."""
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    if code == 2:
        return "invalid"  # bad input: a combination of parameters the job refuses
    if code == hardware.EXIT_CODE:
        return "hardware"  # the pre-flight check or a CUDA error only bad hardware raises (orchestrator.hardware)
    if code == 130 or code == 128 + signal.SIGTERM:
        return "stopped"  # someone else stopped the trial's orch run (the sweep's own stop is "interrupted")
    if code > 128:
        return f"killed by {_signal_name(code - 128)}"
    return "failed"


def last_error(console: Path) -> str | None:
    """The `error: ...` line `orch run` ended with, if any."""
    try:
        lines = console.read_text(errors="replace").splitlines()
    except OSError:
        return None
    errors = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    return errors[-1][:500] if errors else None


def has_checkpoint(run_dir: Path, sweep: Sweep) -> bool:
    """Whether the trial's run dir holds a checkpoint to resume from (a `step-*` of the trainer's)."""
    train = sweep.job.train
    if train is None:
        return False
    directory = run_dir / (train.checkpoint.dir or outputs.CHECKPOINTS)
    return directory.is_dir() and any(entry.name.startswith("step-") for entry in directory.iterdir())


def _stop_with_parent() -> None:
    """In the trial's process before exec: SIGTERM when `orch sweep` dies (Linux; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value.lower() in ("nan", "inf", "-inf"):
        return float(value)
    return None
