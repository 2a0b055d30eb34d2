"""Ctrl-C (or SIGTERM) of an `orch run` whose checkpoints go to an object store: the resume line names what
the rerun needs, the store, not the local folder of logs (a new one is made per run), and running it resumes
from the stop's checkpoint in the store. Against a real S3 server (moto, tests/s3server.py)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess

import pytest

from tests.s3server import s3_server
from tests.trainer.conftest import ORCH, REPO, write_job
from tests.trainer.test_faults import steps_logged, stop_job, wait_for


@pytest.mark.slow
def test_ctrl_c_of_a_run_into_a_store_names_the_store_to_resume_from(tmp_path):
    spec_file = write_job(tmp_path, stop_job("stored"))
    with s3_server() as server:
        server.create_bucket("bkt")
        # cwd: the local folder (runs/...) lands in tmp_path; PYTHONPATH: the workers import the test tasks
        env = {**os.environ, **server.env(), "ORCH_METRICS_PORT": "0", "PYTHONPATH": str(REPO)}
        process = subprocess.Popen(
            [*ORCH, "run", str(spec_file), "--out", "s3://bkt/stored"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        progress = lambda: [steps_logged(p) for p in tmp_path.glob("runs/*/progress.jsonl")]  # noqa: E731
        wait_for(lambda: max(progress(), default=0) >= 5, what="5 steps")
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 130, stderr
        (line,) = stderr.strip().splitlines()
        stopped = re.search(r"stopped at step (\d+) after writing a checkpoint .*; resume: (.*)$", line)
        assert stopped, line
        stopped_at, again = int(stopped.group(1)), stopped.group(2)
        assert again == f"orch run {spec_file} --out s3://bkt/stored"

        argv = shlex.split(again)
        resumed = subprocess.run(
            [*ORCH, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
        )
        assert resumed.returncode == 0, resumed.stderr
        checkpoint = f"s3://bkt/stored/checkpoints/step-{stopped_at:08d}"
        assert f"resumed from {checkpoint} at step {stopped_at}" in resumed.stdout


def test_the_resume_line_names_what_the_rerun_needs(tmp_path):
    from orchestrator.commands.run_cmd import resume_out

    local = tmp_path / "runs" / "job-1"
    # --out s3://...: the store (a rerun without it would start over in a new local folder)
    assert resume_out("s3://bkt/run", "s3://bkt/run", local) == "s3://bkt/run"
    # output.url in the job file: nothing, the job file names the store already
    assert resume_out(None, "s3://bkt/run", local) is None
    # a local run: its folder, which holds the checkpoints
    assert resume_out(None, None, local) == str(local)
    assert resume_out(str(local), None, local) == str(local)
