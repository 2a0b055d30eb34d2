"""One validation path for every command (#20, #24 section 3): `orch validate` refuses what render, submit
and run refuse, `-o json` says the same in one object, and `orch doctor JOB --set` checks the overridden job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from tests.fakes.cli import _EntryPoint as Orch  # `orch` as the console script runs it (exit codes)

JOB = "name: demo\nimage: registry.example/trainer:1\ntrain:\n  task: digits\n  batch_size: 64\n"
NO_SERVER = "tracking:\n  mlflow:\n    experiment: sweep-7\n"


def validate(path: Path, *args: str, env: dict[str, str | None] | None = None):  # type: ignore[no-untyped-def]
    clean = {"ORCH_MLFLOW_TRACKING_URI": None, "MLFLOW_TRACKING_URI": None, **(env or {})}
    return CliRunner().invoke(Orch(), ["validate", str(path), *args], env=clean)


def test_validate_refuses_an_mlflow_job_that_no_side_can_give_a_server(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(JOB + NO_SERVER)
    refused = validate(job)
    assert refused.exit_code == 2
    assert "job.yaml:7:3: tracking.mlflow.tracking_uri: no MLflow server" in refused.stderr
    # The server named by this shell (orch run's) or by the job's env (the pods'): valid somewhere, so OK.
    assert validate(job, env={"ORCH_MLFLOW_TRACKING_URI": "http://mlflow:5000"}).exit_code == 0
    assert validate(job, "--set", "env.MLFLOW_TRACKING_URI=http://mlflow:5000").exit_code == 0


def test_validate_json_says_ok_or_the_problem_in_one_object(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    ok = validate(job, "-o", "json")
    assert ok.exit_code == 0
    document = json.loads(ok.stdout)
    assert (document["ok"], document["name"], document["job"]["train"]["batch_size"]) == (True, "demo", 64)
    assert document["summary"][0].startswith("nodes 1 x 1 processes = world size 1")
    bad = validate(job, "-o", "json", "--set", "nodes=0")
    assert bad.exit_code == 2
    problem = {
        "error": "--set nodes=0: nodes: Input should be greater than 0",
        "file": "--set nodes=0",
        "line": None,
        "column": None,
        "field": "nodes",
        "message": "Input should be greater than 0",
    }
    assert json.loads(bad.stdout) == {"ok": False, **problem, "errors": [problem]}


# Four mistakes, written out of the models' field order (pydantic reports train before resources, and the
# root's fields before train's), and one that a --set brings in.
FOUR_MISTAKES = """\
name: demo
image: registry.example/trainer:1
train:
  task: digits
  optimizr: {lr: 0.1}
  schedule: {name: plateau}
  eval_every: 0
resources: {cpu: lots}
nodes: 0
"""


def test_validate_reports_every_mistake_at_once_in_file_order(tmp_path):
    """#33: one run names every mistake one pass can find, each a line `FILE:LINE:COL: field: ...`, by line;
    a --set's after the file's. Before, each run named one (pydantic's first, in field order)."""
    job = tmp_path / "job.yaml"
    job.write_text(FOUR_MISTAKES)
    refused = validate(job, "--set", "train.log_every=0")
    assert refused.exit_code == 2
    assert refused.stdout == ""
    assert [line.split(": ")[:2] for line in refused.stderr.splitlines()] == [
        ["error", f"{job}:5:3"],
        ["error", f"{job}:8:13"],
        ["error", f"{job}:9:1"],
        ["error", "--set train.log_every=0"],
    ]
    fields = [line.split(": ")[2] for line in refused.stderr.splitlines()]
    assert fields == ["train.optimizr", "resources.cpu", "nodes", "train.log_every"]
    as_json = json.loads(validate(job, "-o", "json", "--set", "train.log_every=0").stdout)
    assert ["error: " + e["error"] for e in as_json["errors"]] == refused.stderr.splitlines()
    assert (as_json["ok"], as_json["field"], as_json["line"]) == (False, "train.optimizr", 5)


def test_rules_over_several_fields_are_reported_together_once_the_fields_are_valid(tmp_path):
    """The plateau rule (#33) and max_steps-or-epochs are one model's rules; the volumes' are the job's: each
    is one line, where the field to change is."""
    job = tmp_path / "job.yaml"
    job.write_text(JOB + "  schedule: {name: plateau}\n  eval_every: 0\n  max_steps: 10\n  epochs: 2\n")
    refused = validate(job)
    assert refused.exit_code == 2
    assert refused.stderr.splitlines() == [
        f"error: {job}:7:3: train.eval_every: schedule plateau lowers the rate when the loss stops improving at "
        "an evaluation, and 0 evaluates only at the end: the rate would never change; set eval_every (e.g. "
        "100), or another schedule",
        f"error: {job}:9:3: train.epochs: set max_steps or epochs, not both",
    ]
    volumes = "volumes:\n- {name: a, mount: /a, pvc: c}\n- {name: a, mount: /dev/shm, pvc: c}\n"
    job.write_text(JOB + volumes + "gpus_per_node: 2\nprocs_per_node: 1\n")
    assert [line.split(": ", 3)[2:] for line in validate(job).stderr.splitlines()] == [
        ["volumes", "volume name 'a' is used twice"],
        ["volumes", "mount path '/dev/shm' is reserved by orch"],
        ["procs_per_node", "procs_per_node (1) must equal gpus_per_node (2): each process drives one GPU"],
    ]


def test_doctor_checks_the_job_with_its_overrides(tmp_path):
    """`train.compile` set by --set, not in the file: doctor looks for a C compiler (none on this PATH)."""
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    orch = str(Path(sys.executable).parent / "orch")
    env = {k: v for k, v in os.environ.items() if k != "CC"}
    env["PATH"] = str(Path(orch).parent)
    result = subprocess.run([orch, "doctor", str(job), "--set", "train.compile=true", "-o", "json"],
                            capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert checks["C compiler (train.compile)"]["status"] == "FAIL" and result.returncode == 1
    alone = subprocess.run([orch, "doctor", "--set", "nodes=2"], capture_output=True, text=True, timeout=120)
    assert alone.returncode == 2 and "name the job file" in alone.stderr
