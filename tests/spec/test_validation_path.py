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
    document = json.loads(ok.output)
    assert (document["ok"], document["name"], document["job"]["train"]["batch_size"]) == (True, "demo", 64)
    assert document["summary"][0].startswith("nodes 1 x 1 processes = world size 1")
    bad = validate(job, "-o", "json", "--set", "nodes=0")
    assert bad.exit_code == 2
    assert json.loads(bad.output) == {
        "ok": False,
        "error": "--set nodes=0: nodes: Input should be greater than 0",
        "file": "--set nodes=0",
        "line": None,
        "column": None,
        "field": "nodes",
        "message": "Input should be greater than 0",
    }


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
