"""The sweep file: what one sweep.yaml may say, as frozen pydantic models, and every check made before a trial
starts. Reads sweep.yaml and its job file; imports neither torch nor Optuna.

    job: job.yaml                      # relative to sweep.yaml's folder
    objective: {metric: eval/loss, goal: minimize}
    parameters:                        # any --set path of the job
      train.optimizer.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
      train.micro_batch_size: {type: categorical, values: [8, 16, 32]}
    algorithm: tpe                     # tpe | random | grid
    max_trials: 16
    parallel: 2
    max_failed: 3
    early_stopping: {name: median, min_steps: 100}
    storage: postgresql://...          # default: the journal file in the sweep's folder

Every problem is one SpecError naming sweep.yaml's line and column (exit 2), found by `load_sweep`, which also
loads the job once with each parameter's extreme values (low and high, every categorical value) as `--set`
overrides: a path the job does not have, or a value the job refuses, is reported at the parameter's line.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.errors import SpecError
from orchestrator.job.yaml_positions import FieldPath, Position

if TYPE_CHECKING:
    from orchestrator.job.spec import JobSpec

MAX_GRID_POINTS = 10_000  # GridSampler holds every combination in memory, and nobody runs more trials
MAX_PARAMETERS = 64
MAX_TRIALS = 100_000
MAX_SWEEP_NAME = 40  # a label value of every trial's job (cluster trials), with room for `-trial-NNNNN`
TRIAL_JOB = "{sweep}-trial-{number}"  # a cluster trial's job name (sweep/cluster_trials.py)
# A cluster sweep's name begins each trial's job name: a job name (naming.py) for trial numbers of 7 digits.
MAX_CLUSTER_SWEEP_NAME = 36
NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
METRIC = re.compile(r"(train|eval)/[A-Za-z0-9_.-]+")
# What the trainer records, by the names the trackers show (orchestrator/trainer/tracking/loop.py step_metrics):
# train/* at each log step; eval/loss and the built-in tasks' eval metrics at each evaluation and at the end.
TRAIN_METRICS = ("loss", "lr", "grad_norm", "samples_per_second")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class FloatParameter(_Model):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    """Sample on a log scale (learning rates); low must then be > 0."""
    step: float | None = Field(default=None, gt=0)
    """Only multiples of step above low (and a grid of them for algorithm: grid)."""

    @model_validator(mode="after")
    def _check(self) -> FloatParameter:
        _check_range(self.low, self.high)
        if self.log and self.low <= 0:
            raise _Problem("low", f"must be > 0 on a log scale (log: true), not {self.low:g}")
        if self.log and self.step is not None:
            raise _Problem("step", "a log scale has no step: set one of log and step")
        if self.step is not None and self.step > self.high - self.low:
            raise _Problem("step", f"{self.step:g} is larger than high - low ({self.high - self.low:g})")
        return self

    def grid(self) -> list[Any] | None:
        if self.step is None:
            return None
        count = math.floor((self.high - self.low) / self.step + 1e-9) + 1
        return [round(self.low + i * self.step, 12) for i in range(min(count, MAX_GRID_POINTS + 1))]

    def extremes(self) -> list[Any]:
        return [self.low, self.high]


class IntParameter(_Model):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _check(self) -> IntParameter:
        _check_range(self.low, self.high)
        if self.log and self.low < 1:
            raise _Problem("low", f"must be >= 1 on a log scale (log: true), not {self.low}")
        if self.log and self.step != 1:
            raise _Problem("step", "a log scale has no step: set one of log and step")
        if self.step > self.high - self.low:
            raise _Problem("step", f"{self.step} is larger than high - low ({self.high - self.low})")
        return self

    def grid(self) -> list[Any] | None:
        return list(range(self.low, self.high + 1, self.step)[: MAX_GRID_POINTS + 1])

    def extremes(self) -> list[Any]:
        return [self.low, self.low + (self.high - self.low) // self.step * self.step]


Scalar = str | bool | int | float


class CategoricalParameter(_Model):
    type: Literal["categorical"]
    values: list[Scalar] = Field(min_length=1, max_length=MAX_GRID_POINTS)

    @model_validator(mode="after")
    def _check(self) -> CategoricalParameter:
        seen = [json.dumps(value) for value in self.values]
        if dup := next((v for v in seen if seen.count(v) > 1), None):
            raise _Problem("values", f"{dup} is listed twice")
        return self

    def grid(self) -> list[Any] | None:
        return list(self.values)

    def extremes(self) -> list[Any]:
        return list(self.values)


Parameter = Annotated[FloatParameter | IntParameter | CategoricalParameter, Field(discriminator="type")]


class Objective(_Model):
    metric: str
    """What the trial is judged on, as the trackers name it: eval/loss, eval/accuracy, train/loss."""
    goal: Literal["minimize", "maximize"] = "minimize"

    @model_validator(mode="after")
    def _check(self) -> Objective:
        if not METRIC.fullmatch(self.metric):
            raise _Problem(
                "metric", f"{self.metric!r} is not eval/NAME or train/NAME (eval/loss, train/loss)"
            )
        return self


class EarlyStopping(_Model):
    name: Literal["median", "hyperband", "none"] = "none"
    min_steps: int = Field(default=0, ge=0)
    """No trial is stopped before this step (the pruner's warm-up)."""
    min_trials: int = Field(default=3, ge=1, le=MAX_TRIALS)
    """median: trials that must have finished before any is judged (Katib's default, 3)."""


class SweepSpec(_Model):
    job: str
    """The job file every trial runs, relative to the sweep file's folder."""
    objective: Objective
    parameters: dict[str, Parameter] = Field(min_length=1, max_length=MAX_PARAMETERS)
    """`--set` path -> its search space."""
    algorithm: Literal["tpe", "random", "grid"] = "tpe"
    max_trials: int | None = Field(default=None, ge=1, le=MAX_TRIALS)
    """Trials run to an end (complete, pruned or failed); algorithm grid: every point by default."""
    parallel: int = Field(default=1, ge=1, le=1024)
    """Trials running at once, never more."""
    max_failed: int = Field(default=3, ge=1, le=MAX_TRIALS)
    """The sweep stops once this many trials have failed."""
    early_stopping: EarlyStopping = EarlyStopping()
    storage: str | None = None
    """Optuna's storage as a database URL (sqlite:///, postgresql://, mysql://); default: a journal file in
    the sweep's folder."""
    name: str | None = None
    """The study's name (and the trials' label); default: the sweep file's name, made label-safe."""

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        if self.name is not None and not (NAME.fullmatch(self.name) and len(self.name) <= MAX_SWEEP_NAME):
            raise _Problem(
                "name",
                f"{self.name!r}: lowercase letters, digits and '-', at most {MAX_SWEEP_NAME} characters",
            )
        for path in self.parameters:
            if not re.fullmatch(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*", path):
                raise _Problem(("parameters", path), "is not a --set path (train.optimizer.lr)")
        if self.storage is not None and not re.fullmatch(r"[a-z][a-z0-9+]*://\S*", self.storage):
            raise _Problem("storage", "a database URL (sqlite:///sweep.db, postgresql://host/db)")
        if self.algorithm == "grid":
            self._check_grid()
        elif self.max_trials is None:
            raise _Problem("max_trials", f"required for algorithm {self.algorithm} (how many trials to run)")
        if self.early_stopping.name == "hyperband" and self.algorithm == "grid":
            raise _Problem(
                ("early_stopping", "name"), "hyperband needs a sampler that learns (tpe or random)"
            )
        return self

    def _check_grid(self) -> None:
        points = 1
        for path, parameter in self.parameters.items():
            values = parameter.grid()
            if values is None:
                raise _Problem(("parameters", path), "algorithm grid needs a step (or type categorical)")
            points *= len(values)
            if points > MAX_GRID_POINTS:
                raise _Problem(
                    "algorithm",
                    f"grid of more than {MAX_GRID_POINTS:,} points (the bound): use larger steps, fewer "
                    "values, or algorithm tpe or random with max_trials",
                )
        if self.max_trials is not None and self.max_trials > points:
            raise _Problem("max_trials", f"{self.max_trials} is more than the grid's {points} points")

    @property
    def grid_points(self) -> int:
        return math.prod(len(p.grid() or []) for p in self.parameters.values())

    @property
    def trials(self) -> int:
        """max_trials, or for a grid without it, every point."""
        return self.max_trials if self.max_trials is not None else self.grid_points


class _Problem(ValueError):
    """A rule of one field broken: raised inside a model's validator, placed by `_located`."""

    def __init__(self, field: str | FieldPath, message: str) -> None:
        super().__init__(message)
        self.parts: FieldPath = (field,) if isinstance(field, str) else field
        self.message = message


def _check_range(low: float, high: float) -> None:
    if low >= high:
        raise _Problem("low", f"{low:g} must be below high ({high:g})")


# --- loading: file -> SweepSpec -> the job, every check before a trial ------------------------------------


@dataclass(frozen=True)
class Sweep:
    """A checked sweep: its spec, where it is, and the job every trial runs."""

    spec: SweepSpec
    file: Path
    job_file: Path
    job: JobSpec
    name: str
    """The study's name (spec.name, else the file's name made label-safe)."""
    folder: Path
    """Beside the sweep file: runs/NAME/ holds the study's journal, one run dir per trial, the plot."""
    positions: Mapping[FieldPath, Position]
    where: Literal["local", "cluster", "anywhere"] = "local"
    """Where it was checked to run its trials (`anywhere`: read for `orch sweep status`, run nowhere)."""

    @property
    def metric(self) -> str:
        return self.spec.objective.metric

    @property
    def maximize(self) -> bool:
        return self.spec.objective.goal == "maximize"

    @property
    def trials(self) -> int:
        """How many trials the sweep runs (max_trials, or a grid's points)."""
        return self.spec.trials

    def overrides(self, params: Mapping[str, Any]) -> list[str]:
        """A trial's parameters as the `--set` flags of its `orch run`."""
        return [f"{path}={yaml_value(value)}" for path, value in params.items()]


def load_sweep(path: str | Path, *, where: Literal["local", "cluster", "anywhere"] = "local") -> Sweep:
    """Read and check sweep.yaml and its job, for trials run `where` (local: `orch run`; cluster: jobs, as
    `orch submit` checks them; anywhere: what both need, to read the sweep's study); SpecError (exit 2) at
    the first problem, before anything is created."""
    from orchestrator.job import loading

    file = Path(path)
    text = _read(file)
    try:
        data, positions = loading.parse_yaml(text, str(file))
    except SpecError as error:
        if error.reason.startswith("a job file is a mapping"):
            raise SpecError(
                "a sweep file is a mapping of fields (job:, objective:, parameters: ...)",
                file=error.file, line=error.line, column=error.column,
            ) from None  # fmt: skip
        if error.reason.startswith("the file is empty"):
            raise SpecError("the file is empty: docs/sweeps.md shows a sweep file", file=str(file)) from None
        raise

    def fail(parts: FieldPath, message: str) -> SpecError:
        line, column = _nearest(parts, positions)
        return SpecError(message, file=str(file), line=line, column=column, field=_dotted(parts))

    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        cause = (first.get("ctx") or {}).get("error")
        parts = loading.data_path(data, first)
        if first["type"].startswith("union_tag"):
            parts = (*parts, "type")
        if isinstance(cause, _Problem):
            raise fail((*parts, *cause.parts), cause.message) from None
        raise fail(parts, _message(first)) from None

    job_file = (file.parent / spec.job) if not Path(spec.job).is_absolute() else Path(spec.job)
    # what orchestrator.api.load_job checks for `orch run` (local) or `orch submit` (cluster)
    checks = {"require_image": where == "cluster", "local_run": where == "local"}
    job = loading.load_job(job_file, (), **checks)  # the job's own mistakes name the job file
    sweep = Sweep(
        spec=spec,
        file=file,
        job_file=job_file,
        job=job,
        name=spec.name or label_safe(file.stem),
        folder=file.parent / "runs" / (spec.name or label_safe(file.stem)),
        positions=positions,
        where=where,
    )
    if where == "cluster" and (problem := cluster_name_problem(sweep.name)):
        raise fail(("name",), problem)
    if where != "anywhere" and (problem := shared_output(job, cluster=where == "cluster")):
        raise fail(("job",), f"{job_file.name}: {problem}")
    for path, parameter in spec.parameters.items():
        for value in parameter.extremes():
            try:
                loading.load_job(job_file, sweep.overrides({path: value}), **checks)
            except SpecError as error:
                if error.reason.startswith("unknown field") or " is a list of " in error.reason:
                    problem = f"not a field of {job_file.name}: {error.reason}"
                else:
                    field = f"{error.field}: " if error.field else ""
                    problem = f"{yaml_value(value)} does not fit {job_file.name}: {field}{error.reason}"
                raise fail(("parameters", path), problem) from None
    if found := metric_problem(spec, job):
        raise fail(*found)
    return sweep


def shared_output(job: JobSpec, *, cluster: bool = False) -> str | None:
    """Why every trial would write to one place (each trial's results belong in its own run dir), or why the
    sweep could not read a cluster trial's: it reads them from the object store, under output.url."""
    url = job.output.url if job.output is not None else None
    if cluster and not url:
        return (
            "a cluster sweep reads each trial's objective from the object store: set output.url "
            "(s3://BUCKET/PREFIX; each trial keeps its outputs under PREFIX/JOB, its job's name)"
        )
    if url and not cluster:
        return "output.url would have every trial write to the same store: remove it for a sweep"
    directory = job.train.checkpoint.dir if job.train is not None else None
    if directory and (directory.startswith("/") or "://" in directory):
        return (
            f"train.checkpoint.dir {directory} would have every trial write to the same checkpoints: "
            "use a relative one (under each trial's run dir) or none"
        )
    return None


def cluster_name_problem(name: str) -> str | None:
    """Why `name` cannot begin the job names of a cluster sweep's trials (NAME-trial-N), or None."""
    if len(name) <= MAX_CLUSTER_SWEEP_NAME and name[0].isalpha():
        return None
    return (
        f"{name!r} begins every trial's job name ({TRIAL_JOB.format(sweep=name, number=0)}): on the cluster a "
        f"sweep's name starts with a letter and has at most {MAX_CLUSTER_SWEEP_NAME} characters; set name: "
        "(lowercase letters, digits and '-')"
    )


def metric_problem(spec: SweepSpec, job: JobSpec) -> tuple[FieldPath, str] | None:
    """Where and why the job never records the objective's metric (or never early enough to prune on it).
    A `command:` job and a task of the user's own may record any name: checked when the first trial ends."""
    kind, _, name = spec.objective.metric.partition("/")
    train = job.train
    pruning = spec.early_stopping.name != "none"
    if train is None:
        return None
    known = TRAIN_METRICS if kind == "train" else builtin_eval_metrics(train.task, train.task_args)
    if known is not None and name not in known:
        recorded = ", ".join(f"{kind}/{m}" for m in known) or f"no {kind}/* metric"
        return (("objective", "metric"), f"task {train.task} records {recorded}, not {spec.objective.metric}")
    if kind == "eval" and pruning and not train.eval_every:
        return (
            ("early_stopping", "name"),
            f"{spec.early_stopping.name} judges {spec.objective.metric} at evaluations, and the job evaluates "
            "only at its end (train.eval_every: 0): set train.eval_every, or early_stopping: {name: none}",
        )
    return None


def builtin_eval_metrics(task: str, task_args: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The eval/* names a built-in task records (its eval_metrics, plus the loss); None for a task of the
    user's own (tests/sweep/test_spec.py checks this table against the tasks themselves)."""
    if task in ("digits", "gpt"):
        return ("loss", "accuracy")
    if task == "synthetic":
        if task_args.get("eval_samples", 256) == 0:
            return ()
        return ("loss", "accuracy") if task_args.get("kind") == "classification" else ("loss",)
    return None


def label_safe(stem: str) -> str:
    """A file name as a study name and label value: lowercase, runs of other characters as '-'."""
    name = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")[:MAX_SWEEP_NAME].strip("-")
    return name or "sweep"


def yaml_value(value: Any) -> str:
    """A parameter's value as a `--set` value that parses back to itself: JSON, which is YAML, except that
    PyYAML reads `1e-05` as a string (its floats need a dot): written `1.0e-05`."""
    if isinstance(value, float) and math.isfinite(value):
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        if e:
            mantissa = mantissa if "." in mantissa else mantissa + ".0"
            exponent = exponent if exponent[0] in "+-" else "+" + exponent
            return f"{mantissa}e{exponent}"
        return text
    return json.dumps(value)


def _read(file: Path) -> str:
    from orchestrator.job import loading

    try:
        return loading.read_job_text(file)
    except SpecError as error:
        if "no such file" in error.reason:
            raise SpecError("no such file (docs/sweeps.md shows a sweep file)", file=str(file)) from None
        raise


def _message(error: Mapping[str, Any]) -> str:
    kind, message = error["type"], str(error["msg"])
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    if kind == "union_tag_invalid" or kind == "union_tag_not_found":
        return "type must be float, int or categorical"
    message = message.removeprefix("Value error, ")
    if kind.endswith("_type") or kind.endswith("_parsing") or kind == "literal_error":
        message += f" (got {json.dumps(error.get('input'), default=str)[:60]})"
    return message


def _nearest(path: FieldPath, positions: Mapping[FieldPath, Position]) -> tuple[int | None, int | None]:
    for length in range(len(path), -1, -1):
        if path[:length] in positions:
            return positions[path[:length]]
    return 1, 1


def _dotted(path: FieldPath) -> str:
    return ".".join(str(p) for p in path)
