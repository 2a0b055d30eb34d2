"""The output directory's files as another process reads them (orchestrator/outputs.py): whole or absent, and
a file that is not what it should be is one line (a missing one is None or {}), never a traceback."""

from __future__ import annotations

import json
import os

import pytest

from orchestrator import outputs


def test_a_summary_is_read_when_it_is_one(tmp_path):
    assert outputs.read_summary(tmp_path) is None  # not written yet (or the task left early)
    outputs.write_json(tmp_path / outputs.SUMMARY, {"steps": 12, "final_loss": 0.5})
    assert outputs.read_summary(tmp_path) == {"steps": 12, "final_loss": 0.5}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"steps": 1', "cannot read .*summary.json: "),
        ("[1, 2]", r"summary.json is not a summary of a run \(no step count\)"),
        ('{"steps": "12"}', r"summary.json is not a summary of a run \(no step count\)"),
    ],
)
def test_a_summary_that_is_not_one_is_one_line(tmp_path, text, why):
    (tmp_path / outputs.SUMMARY).write_text(text)
    with pytest.raises(outputs.UnreadableSummary, match=why):
        outputs.read_summary(tmp_path)


def test_a_json_file_appears_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / outputs.RUN_RECORD
    path.write_text('{"pid": 1}\n')
    outputs.write_json(path, {"pid": 2, "job": "j"})
    assert json.loads(path.read_text()) == {"pid": 2, "job": "j"}
    assert [p.name for p in tmp_path.iterdir()] == [outputs.RUN_RECORD]
    assert outputs.read_run_record(tmp_path) == {"pid": 2, "job": "j"}


@pytest.mark.parametrize("text", [None, "", "not json", '["a list"]'])
def test_a_missing_or_foreign_record_reads_as_empty(tmp_path, text):
    for name in (outputs.RUN_RECORD, outputs.LINKS):
        if text is not None:
            (tmp_path / name).write_text(text)
    assert outputs.read_run_record(tmp_path) == {}
    assert outputs.read_links(tmp_path) == {}


def test_links_are_the_strings_of_tracking_json(tmp_path):
    (tmp_path / outputs.LINKS).write_text('{"mlflow": "http://m/#/runs/1", "tensorboard": 3}')
    assert outputs.read_links(tmp_path) == {"mlflow": "http://m/#/runs/1"}


def test_the_logs_layout(tmp_path):
    logs = tmp_path / outputs.LOGS
    assert outputs.rank_log(logs, 3) == logs / "rank-3.log"
    assert outputs.error_file(logs, 1, 3) == logs / "errors" / "attempt-1" / "rank-3.json"


def test_pid_alive_knows_this_process_and_that_0_is_none():
    assert outputs.pid_alive(os.getpid())
    assert not outputs.pid_alive(0) and not outputs.pid_alive(-1)
