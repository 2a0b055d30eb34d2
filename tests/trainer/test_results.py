"""The run's results at its end (orchestrator/trainer/results.py) on a disk that fills up: a real tmpfs of
256 KiB (tests/trainer/conftest.py `tiny_disk`). The object store's side is in test_object_store.py."""

from __future__ import annotations

import json
import os

import pytest
import torch

from orchestrator.trainer import results

SUMMARY = {"steps": 20, "final_loss": 0.5}


def fill(disk) -> None:
    """Take every byte left on the disk."""
    descriptor = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(descriptor, b"\0" * 4096):
            pass
    except OSError:  # ENOSPC: full
        pass
    finally:
        os.close(descriptor)


@pytest.mark.parametrize("model", [True, False], ids=["model.pt", "summary.json"])
def test_a_full_disk_at_the_end_is_one_line_and_no_summary_claims_the_results(tiny_disk, model):
    """#33: model.pt or summary.json that do not fit (a model too big for what is left; a benchmark's run writes
    no model) end in one line naming the file and the directory; nothing half-written is left, and the summary
    an earlier run left there (a resume into the same --out) does not stand beside this run's results."""
    out = tiny_disk / "out"
    out.mkdir()
    (out / "summary.json").write_text('{"steps": 10}')
    fill(tiny_disk)
    state = {"weight": torch.ones(64, 64)} if model else None  # 16 KiB: more than is left
    summary = {**SUMMARY, "task_args": {"vocabulary": "x" * 8192}}  # more than the earlier summary's page
    with pytest.raises(results.ResultsNotKept) as caught:
        results.keep(out, summary, model=state)
    what, unclaimed = ("model.pt", "no summary.json was written; ") if model else ("summary.json", "")
    assert str(caught.value) == (
        f"training finished at step 20, but {what} could not be written to {out}: no space left on device; "
        f"{unclaimed}free space there and run again with the same output: it resumes from its last checkpoint and "
        "writes the results"
    )
    assert sorted(p.name for p in out.iterdir()) == []  # no summary, no .model.pt.tmp, no .summary.json.*.tmp
    (tiny_disk / "filler").unlink()
    results.keep(out, summary, model=state)  # space again: the rerun writes them
    assert json.loads((out / "summary.json").read_text()) == summary
    assert (out / "model.pt").exists() == model
