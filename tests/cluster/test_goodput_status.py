"""`orch status` says where a cluster job's time went (#31): its milestones from the job, its Kueue Workload and
its pods (the emulator's objects, tests/fakes/queues.py playing Kueue), its goodput from the journal the
trainer's rank 0 writes under output.url (written here by the trainer's own journal code into a real S3
server, moto), across a whole-job restart; a rank's hang verdict; and what it says without a journal."""

from __future__ import annotations

import calendar
import json
import time

import pytest

from orchestrator import outputs, storage
from orchestrator.trainer import journal
from orchestrator.trainer.timeline import Timeline
from tests.cluster.test_why_pending import NS, queued  # noqa: F401  # the fixture: operator + Kueue
from tests.fakes.emulator import JOBS
from tests.fakes.queues import Kueue
from tests.s3server import s3_server

URL = "s3://runs/demo"


def job_file(tmp_path, output: str = f"{{url: {URL}}}"):
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: demo\nimage: registry.example/trainer:1\nnodes: 2\ngpus_per_node: 8\n"
        f"scheduling: {{queue: team-q}}\noutput: {output}\ntrain: {{task: digits, batch_size: 96, max_steps: 10}}\n"
    )
    return path


def attempt(tmp_path, name: str, *, resumed_from: int | None, steps: int, outcome: str) -> None:
    """One attempt's record, as rank 0 of a pod writes it: OUT/goodput/ and the store's goodput/."""
    timeline = Timeline(started=time.time())
    record = journal.Journal(timeline, places=[tmp_path / name, storage.location(URL) / outputs.GOODPUT],
                             job_started=None)  # fmt: skip
    with timeline.phase("setup"):
        time.sleep(0.01)
    timeline.at_step(resumed_from or 0)
    record.begin(resumed_from=resumed_from)
    for step in range((resumed_from or 0) + 1, steps + 1):
        with timeline.step(step), timeline.phase("forward"):
            time.sleep(0.01)
        if step % 5 == 0:
            record.kept(step)
    record.end(outcome)


def test_status_shows_milestones_goodput_across_a_restart_and_the_hang_line(queued, tmp_path, monkeypatch):  # noqa: F811
    with s3_server() as s3:
        s3.create_bucket("runs")
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)  # `orch status` reads the store with this shell's credentials
        assert queued.orch("submit", str(job_file(tmp_path)), "--api", "pytorchjob").exit_code == 0
        job = queued.kube.get(JOBS, NS, "demo")
        kueue = Kueue(queued.kube, NS, queued.kueue_version)
        kueue.local_queue("team-q", pending=0)
        kueue.admit(kueue.queue(job, pod_sets={"master": 1, "worker": 1}, message="waiting"))

        before = json.loads(queued.orch("status", "demo", "-o", "json").stdout)
        assert (
            before["goodput"] is None
            and before["goodput_note"] == f"no attempt has written to {URL}/goodput/ yet"
        )
        # the first pods' attempt died at step 8 (checkpoint at 5); the job restarted whole and resumed at 5
        attempt(tmp_path, "pod-a", resumed_from=None, steps=8, outcome="failed")
        attempt(tmp_path, "pod-b", resumed_from=5, steps=10, outcome="finished")
        storage.location(URL).joinpath(outputs.HANG).write_text(json.dumps(
            {"line": "hang: rank 1 stopped at step 8 in forward 300 s ago; rank 0 waits at step 8 in backward "
                     "(noticed by rank 0)", "at": time.time()}))  # fmt: skip

        shown = json.loads(queued.orch("status", "demo", "-o", "json").stdout)
        table = queued.orch("status", "demo").stdout
    result, milestones = shown["goodput"], shown["milestones"]
    assert milestones["created"] == job["metadata"]["creationTimestamp"]
    assert set(milestones) == {"created", "admitted", "first_step"}  # no pods in the emulator: not ready
    assert (result["attempts"], result["lost_steps"]) == (2, 3)
    assert result["badput_seconds"]["wasted_progress_from_disruption"] > 0
    # the record starts at the job's creation (whole seconds), not at the first pod's start
    created = milestones["created"]
    assert result["started"] == calendar.timegm(time.strptime(created, "%Y-%m-%dT%H:%M:%SZ"))
    parts = result["goodput_seconds"] + sum(result["badput_seconds"].values())
    assert parts == pytest.approx(result["wall_seconds"], abs=0.01)
    assert shown["hang"]["line"].startswith("hang: rank 1 stopped at step 8 in forward")
    assert f"Timeline:    created {created}, admitted +" in table
    assert "Goodput:     goodput " in table and "1 restart, 3 steps redone" in table
    assert "Hang:        hang: rank 1 stopped at step 8 in forward" in table


def test_status_says_why_it_shows_no_goodput(queued, tmp_path, monkeypatch):  # noqa: F811
    """No output.url: the journal stays in the pods. A store that does not answer: a note, within ~15 s."""
    assert queued.orch("submit", str(job_file(tmp_path, "{pvc: data}")), "--api", "pytorchjob").exit_code == 0
    shown = json.loads(queued.orch("status", "demo", "-o", "json").stdout)
    assert shown["goodput"] is None and shown["hang"] is None
    assert (
        shown["goodput_note"]
        == "the goodput journal is in the pods' output folder: set output.url to see it here"
    )
    queued.orch("delete", "demo")
    with s3_server() as s3:
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        s3.kill()  # the store is gone
        assert queued.orch("submit", str(job_file(tmp_path)), "--api", "pytorchjob").exit_code == 0
        result = queued.orch("status", "demo", "-o", "json")
    assert result.exit_code == 0, result.output
    note = json.loads(result.stdout)["goodput_note"]
    assert note.startswith(f"goodput unknown: cannot read {URL}: "), note
