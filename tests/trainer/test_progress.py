"""What `orch run` shows: a progress bar on a terminal, plain lines otherwise, the result at the end."""

from __future__ import annotations

import os
import pty
import subprocess

import pytest

from orchestrator.local import progress_text
from tests.trainer.conftest import ORCH, REPO, job, write_job


def test_progress_text_draws_a_bar_in_place():
    event = {"event": "step", "step": 15, "max_steps": 60, "loss": 0.12345, "lr": 1e-3, "grad_norm": 1.0,
             "samples_per_second": 12345.6, "eta_seconds": 75, "skipped": 0}  # fmt: skip
    assert progress_text(event) == (
        "\r[#######-----------------------] step 15/60  loss 0.1235  12,346 samples/s  ETA 0:01:15 "
    )
    evaluation = {"event": "eval", "step": 20, "loss": 0.5, "accuracy": 0.97}
    assert progress_text(evaluation) == "\r\x1b[2Keval at step 20: loss 0.5000  accuracy 0.9700\n"
    assert progress_text({"event": "done"}) == ""


@pytest.mark.slow
def test_a_terminal_gets_a_progress_bar(tmp_path):
    spec_file = write_job(tmp_path, job("bar", eval_every=6))
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [*ORCH, "run", str(spec_file), "--out", str(tmp_path / "tty")],
        cwd=REPO, stdout=follower, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait(timeout=120)
    terminal = b"".join(chunks).decode()
    assert process.returncode == 0, process.stderr.read()
    assert "\r[##############################] step 12/12  loss " in terminal
    assert "eval at step 6: loss " in terminal
    # no plain log lines on a terminal ("step 4/12  loss ..." at the start of a line)
    assert not [line for line in terminal.split("\n") if line.startswith(("step ", "training "))]
    assert "result: eval loss " in terminal
