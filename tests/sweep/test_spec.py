"""The sweep file: every mistake is one line naming sweep.yaml:LINE:COL, exit 2, before any trial starts (no
folder made, no study); in-process (`orch sweep` through main(), as the console script runs it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.sweep import spec
from tests.fakes.cli import run_orch
from tests.spec.test_packaging import imported_modules
from tests.sweep.conftest import DIGITS_JOB, write_sweep

GOOD = """\
job: job.yaml
objective: {metric: eval/loss, goal: minimize}
parameters:
  train.optimizer.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
  train.micro_batch_size: {type: categorical, values: [8, 16, 32]}
  train.schedule.warmup_steps: {type: int, low: 0, high: 10, step: 5}
algorithm: tpe
max_trials: 16
parallel: 2
max_failed: 3
early_stopping: {name: median, min_steps: 10}
"""


def test_the_issues_sweep_file_loads(tmp_path):
    sweep = spec.load_sweep(write_sweep(tmp_path, GOOD))
    assert sweep.name == "sweep" and sweep.folder == tmp_path / "runs" / "sweep"
    assert sweep.trials == 16 and sweep.spec.parallel == 2 and sweep.metric == "eval/loss"
    assert sweep.overrides({"train.optimizer.lr": 1e-05, "train.micro_batch_size": 8}) == [
        "train.optimizer.lr=1.0e-05",
        "train.micro_batch_size=8",
    ]


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "train.optimizer.lr:",
            "train.optimizer.lrr:",
            "sweep.yaml:4:3: parameters.train.optimizer.lrr: not a field of job.yaml: unknown field; did you mean 'lr'?",
        ),
        (
            "low: 1.0e-4, high: 1.0e-1",
            "low: 1.0e-1, high: 1.0e-1",
            "sweep.yaml:4:37: parameters.train.optimizer.lr.low: 0.1 must be below high (0.1)",
        ),
        (
            "low: 0, high: 10",
            "low: 10, high: 3",
            "sweep.yaml:6:44: parameters.train.schedule.warmup_steps.low: 10 must be below high (3)",
        ),
        (
            "low: 1.0e-4, high",
            "low: -1.0, high",
            "parameters.train.optimizer.lr.low: must be > 0 on a log scale",
        ),
        (
            "values: [8, 16, 32]",
            "values: [8, 16, 33]",
            "sweep.yaml:5:3: parameters.train.micro_batch_size: 33 does not fit job.yaml: train.micro_batch_size:",
        ),
        (
            "values: [8, 16, 32]",
            "values: [8, 16, 8]",
            "parameters.train.micro_batch_size.values: 8 is listed twice",
        ),
        (
            "eval/loss",
            "eval/perplexity",
            "sweep.yaml:2:13: objective.metric: task digits records eval/loss, eval/accuracy, not eval/perplexity",
        ),
        ("eval/loss", "loss", "objective.metric: 'loss' is not eval/NAME or train/NAME"),
        ("goal: minimize", "goal: lowest", "objective.goal: Input should be 'minimize' or 'maximize'"),
        (
            "type: int,",
            "type: integer,",
            "sweep.yaml:6:33: parameters.train.schedule.warmup_steps.type: type must be float, int or categorical",
        ),
        (
            "low: 0, high: 10, step: 5",
            "low: 0, high: ten, step: 5",
            "parameters.train.schedule.warmup_steps.high: Input should be a valid integer",
        ),
        ("max_trials: 16\n", "", "sweep.yaml:1:1: max_trials: required for algorithm tpe"),
        (
            "algorithm: tpe",
            "algorithm: grid",
            "sweep.yaml:4:3: parameters.train.optimizer.lr: algorithm grid needs a step",
        ),
        (
            "algorithm: tpe",
            "algorithm: bayes",
            "sweep.yaml:7:1: algorithm: Input should be 'tpe', 'random' or 'grid'",
        ),
        (
            "parallel: 2",
            "parallel: 0",
            "sweep.yaml:9:1: parallel: Input should be greater than or equal to 1",
        ),
        ("parallel: 2", "paralel: 2", "sweep.yaml:9:1: paralel: unknown field"),
        (
            "log: true}",
            "log: true, step: 0.1}",
            "parameters.train.optimizer.lr.step: a log scale has no step",
        ),
        (
            "{name: median, min_steps: 10}",
            "{name: early}",
            "early_stopping.name: Input should be 'median', 'hyperband' or 'none'",
        ),
        ("max_failed: 3", "max_failed: .nan", "sweep.yaml:10:13: .nan is not a finite number"),
        ("job: job.yaml", "job: nope.yaml", "nope.yaml: no such file"),
    ],
    ids=lambda value: value if len(value) < 30 else None,
)
def test_a_mistake_is_one_line_at_its_position_before_anything_starts(tmp_path, old, new, expected):
    assert old in GOOD
    path = write_sweep(tmp_path, GOOD.replace(old, new))
    result = run_orch("sweep", str(path), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert expected in lines[0].replace(str(tmp_path) + "/", ""), lines[0]
    assert not (tmp_path / "runs").exists()  # nothing made: no study, no trial folder


def test_a_grid_too_large_and_max_trials_past_it(tmp_path):
    grid = GOOD.replace("algorithm: tpe", "algorithm: grid").replace("log: true}", "step: 1.0e-5}")
    path = write_sweep(tmp_path, grid)
    result = run_orch("sweep", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert "sweep.yaml:7:1: algorithm: grid of more than 10,000 points (the bound)" in result.stderr
    small = grid.replace("step: 1.0e-5}", "step: 0.05}")  # 2 x 3 x 3 = 18 points
    assert spec.load_sweep(write_sweep(tmp_path, small.replace("max_trials: 16\n", ""))).trials == 18
    result = run_orch("sweep", str(write_sweep(tmp_path, small.replace("max_trials: 16", "max_trials: 19"))))
    assert result.returncode == 2
    assert "sweep.yaml:8:1: max_trials: 19 is more than the grid's 18 points" in result.stderr


def test_pruning_on_eval_needs_evaluations_before_the_end(tmp_path):
    job = {**DIGITS_JOB, "train": {**DIGITS_JOB["train"], "eval_every": 0}}
    result = run_orch("sweep", str(write_sweep(tmp_path, GOOD, job=job)), cwd=tmp_path)
    assert result.returncode == 2
    assert "sweep.yaml:11:18: early_stopping.name: median judges eval/loss at evaluations" in result.stderr
    # without pruning the final evaluation is enough; train/* is reported at log steps
    assert spec.load_sweep(
        write_sweep(tmp_path, GOOD.replace("{name: median, min_steps: 10}", "{name: none}"), job=job)
    )
    assert spec.load_sweep(write_sweep(tmp_path, GOOD.replace("eval/loss", "train/loss"), job=job))


def test_a_bad_job_names_the_job_file(tmp_path):
    path = write_sweep(tmp_path, GOOD, job={**DIGITS_JOB, "nodes": "many"})
    result = run_orch("sweep", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert "job.yaml:2:1: nodes:" in result.stderr


def test_a_task_of_the_users_own_may_record_any_metric(tmp_path):
    job = {**DIGITS_JOB, "train": {**DIGITS_JOB["train"], "task": "mypkg.tasks:make"}}
    assert spec.load_sweep(write_sweep(tmp_path, GOOD.replace("eval/loss", "eval/bleu"), job=job))


def test_parameter_values_go_to_the_job_as_they_were_written():
    """Each value is a --set value the job loader reads back as the same value and type."""
    from orchestrator.job import loading

    for value in [1e-05, 3.0e-4, 0.1, 1e20, 2.5, 7, True, "cosine", "1e-3", "yes"]:
        data: dict = {}
        loading.apply_overrides(data, [f"x={spec.yaml_value(value)}"])
        assert data["x"] == value and type(data["x"]) is type(value), value


def test_the_builtin_tasks_record_the_metrics_the_sweep_expects():
    """spec.builtin_eval_metrics is a table (the spec must not import torch); the tasks themselves say."""
    pytest.importorskip("torch")
    import torch

    from orchestrator.trainer.tasks import build_task

    cases = [("digits", {}), ("gpt", {}), ("synthetic", {}), ("synthetic", {"kind": "classification"})]
    for task, args in cases:
        built = build_task(task, args)
        batch = next(iter(torch.utils.data.DataLoader(built.eval_dataset, batch_size=4)))
        with torch.no_grad():
            outputs = built.model(batch[0])
        names = {"loss", *(built.eval_metrics(outputs, batch[1]) if built.eval_metrics else {})}
        assert set(spec.builtin_eval_metrics(task, args) or ()) == names, task
    assert spec.builtin_eval_metrics("synthetic", {"eval_samples": 0}) == ()


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("output", {"url": "s3://bucket/runs"}, "output.url would have every trial write to the same store"),
        (
            "checkpoint",
            {"dir": "/shared/ckpt"},
            "train.checkpoint.dir /shared/ckpt would have every trial write",
        ),
    ],
)
def test_a_job_whose_trials_would_share_their_output_is_refused(tmp_path, field, value, expected):
    job = (
        {**DIGITS_JOB, "output": value}
        if field == "output"
        else {**DIGITS_JOB, "train": {**DIGITS_JOB["train"], "checkpoint": value}}
    )
    result = run_orch("sweep", str(write_sweep(tmp_path, GOOD, job=job)), cwd=tmp_path)
    assert result.returncode == 2
    assert f"sweep.yaml:1:1: job: job.yaml: {expected}" in result.stderr


def test_status_of_a_sweep_that_never_ran(tmp_path):
    result = run_orch("sweep", "status", "sweep.yaml", cwd=write_sweep(tmp_path, GOOD).parent)
    assert result.returncode == 2
    assert "error: sweep sweep has not run yet (no runs/sweep/study.journal): orch sweep " in result.stderr


@pytest.mark.parametrize("args", [("sweep", "--help"), ("sweep", "status", "--help")])
def test_sweep_help_imports_neither_optuna_nor_torch(args):
    modules = imported_modules(*args)
    assert "click" in modules and not modules & {"optuna", "torch", "matplotlib", "kubernetes"}


CLUSTER_JOB = {**DIGITS_JOB, "image": "registry.example/trainer:1", "output": {"url": "s3://bkt/sweeps"}}


def test_a_cluster_sweep_keeps_output_url_and_needs_it(tmp_path):
    """--cluster: each trial keeps its outputs under output.url (the sweep reads its objective there), so the
    job must name a store; locally the same job is refused (every trial would write to one store)."""
    sweep = spec.load_sweep(write_sweep(tmp_path, GOOD, job=CLUSTER_JOB), where="cluster")
    assert sweep.where == "cluster" and sweep.job.output is not None
    assert sweep.job.output.url == "s3://bkt/sweeps"
    pvc = {**CLUSTER_JOB, "output": {"pvc": "shared"}}
    result = run_orch("sweep", str(write_sweep(tmp_path, GOOD, job=pvc)), "--cluster", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (2, (
        f"error: {tmp_path}/sweep.yaml:1:1: job: job.yaml: a cluster sweep reads each trial's objective from the "
        "object store: set output.url (s3://BUCKET/PREFIX; each trial keeps its outputs under PREFIX/JOB, its job's "
        "name)\n"
    ))  # fmt: skip
    no_image = {**CLUSTER_JOB, "image": None}
    result = run_orch("sweep", str(write_sweep(tmp_path, GOOD, job=no_image)), "--cluster", cwd=tmp_path)
    assert result.returncode == 2 and "image: required to render or submit" in result.stderr
    assert not (tmp_path / "runs").exists()  # nothing made before the checks


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "name: 2024-lr\n",
            "sweep.yaml:12:1: name: '2024-lr' begins every trial's job name (2024-lr-trial-0): on the cluster",
        ),
        (f"name: {'a' * 37}\n", "starts with a letter and has at most 36 characters; set name:"),
    ],
)
def test_a_cluster_sweeps_name_begins_its_job_names(tmp_path, name, expected):
    path = write_sweep(tmp_path, GOOD + name, job=CLUSTER_JOB)
    with pytest.raises(SpecError, match=re.escape(expected)):
        spec.load_sweep(path, where="cluster")
    here = write_sweep(tmp_path / "here", GOOD + name)
    assert spec.load_sweep(here).name == name.split()[1]  # fine here: its trials are run dirs


def test_cluster_flags_need_cluster(tmp_path):
    result = run_orch("sweep", str(write_sweep(tmp_path, GOOD)), "--context", "prod", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (
        2, "error: --kubeconfig, --context and --namespace choose the cluster of --cluster: add --cluster\n"
    )  # fmt: skip


EXAMPLE_SWEEPS = sorted((Path(__file__).parents[2] / "examples" / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLE_SWEEPS, ids=[p.stem for p in EXAMPLE_SWEEPS])
def test_every_example_sweep_loads_with_its_job(path):
    """The sweeps the docs point at are valid as shipped: their job found beside them, every parameter a --set
    path that fits it (a micro-batch that does not divide the job's batch would be refused here)."""
    sweep = spec.load_sweep(path)
    assert sweep.name == path.stem
    assert sweep.job_file.is_file()
    assert sweep.spec.parameters and sweep.trials >= 1


def test_the_examples_folder_has_a_sweep():
    assert EXAMPLE_SWEEPS, "examples/sweeps/ holds no sweep file"
