"""Goodput accounting (orchestrator/goodput.py) over hand-made journals, the trainer's timeline, and the hang
verdict (heartbeat.judge): pure functions, in process. The trainer's own journals are checked in
test_faults.py (a clean run and a restarted one) and test_hang.py."""

from __future__ import annotations

import json
import time

import pytest

from orchestrator import goodput
from orchestrator.trainer import heartbeat
from orchestrator.trainer.timeline import Timeline


def attempt(started, updated, phases, kept=(), **fields) -> goodput.Attempt:
    record = {"started": started, "updated": updated, "phases": phases, "kept": list(kept), **fields}
    read = goodput.Attempt.read(record)
    assert read is not None
    return read


def test_one_finished_attempt_splits_its_time_by_phase():
    phases = {"startup": 3.0, "setup": 2.0, "checkpoint_load": 0.5, "data": 1.0, "forward": 4.0,
              "backward": 5.0, "optimizer": 1.0, "step": 0.5, "eval": 2.0, "checkpoint_save": 1.0}  # fmt: skip
    result = goodput.account([attempt(100.0, 120.0, phases, step=30, outcome="finished")], job_started=99.0)
    assert result is not None
    assert result.goodput_seconds == pytest.approx(10.5)
    assert result.badput_seconds == {
        "queued": 0.0,
        "program_startup": 4.0,  # the launcher's second before the trainer, and the trainer's startup
        "training_prep": 2.0,
        "unproductive_checkpoint_restore_time": 0.5,
        "data_loading_sync": 1.0,
        "eval": 2.0,
        "unproductive_checkpoint_save_time": 1.0,
        "wasted_progress_from_disruption": 0.0,
        "infrastructure_recovery_from_disruption": 0.0,
    }
    assert result.wall_seconds == 21.0
    assert result.goodput_seconds + sum(result.badput_seconds.values()) == pytest.approx(result.wall_seconds)
    assert result.ratio == pytest.approx(10.5 / 21.0)
    assert (result.attempts, result.lost_steps, result.step) == (1, 0, 30)


def test_a_restart_wastes_what_followed_the_checkpoint_it_resumed_from_and_idles_until_the_next_start():
    """Attempt 1 checkpointed step 10 at t=20 (12 s of steps by then), went on to step 13 and was last
    heard of at t=26; attempt 2 started at t=30 and resumed from step 10."""
    at_10 = {"startup": 2.0, "setup": 1.0, "forward": 12.0, "checkpoint_save": 5.0}
    first = attempt(
        0.0, 26.0, {"startup": 2.0, "setup": 1.0, "forward": 17.0, "data": 1.0, "checkpoint_save": 5.0},
        kept=[{"step": 0, "at": 3.0, "phases": {"startup": 2.0, "setup": 1.0}},
              {"step": 10, "at": 20.0, "phases": at_10}],
        step=13,
    )  # fmt: skip
    second = attempt(30.0, 50.0, {"startup": 4.0, "checkpoint_load": 1.0, "forward": 15.0},
                     resumed_from=10, step=30, outcome="finished")  # fmt: skip
    result = goodput.account([second, first])  # any order
    assert result is not None
    assert result.goodput_seconds == pytest.approx(12.0 + 15.0)
    assert result.badput_seconds["wasted_progress_from_disruption"] == pytest.approx(6.0)  # 20 -> 26
    assert result.badput_seconds["infrastructure_recovery_from_disruption"] == pytest.approx(4.0)  # 26 -> 30
    assert result.badput_seconds["program_startup"] == pytest.approx(6.0)
    assert result.lost_steps == 3
    assert result.attempts == 2
    assert result.goodput_seconds + sum(result.badput_seconds.values()) == pytest.approx(50.0)
    assert goodput.line(result.to_dict()) == (
        "goodput 54% of 50 s (badput: work redone 12%, startup 12%, checkpoint save 10%); 1 restart, 3 steps redone"
    )


def test_an_attempt_resumed_from_before_its_own_start_wastes_all_its_steps():
    """Attempt 2 resumed from 10 and died before its first checkpoint; attempt 3 resumed from 10 again."""
    first = attempt(0.0, 10.0, {"startup": 1.0, "forward": 9.0},
                    kept=[{"step": 10, "at": 10.0, "phases": {"startup": 1.0, "forward": 9.0}}], step=10,
                    outcome="stopped")  # fmt: skip
    second = attempt(12.0, 20.0, {"startup": 1.0, "checkpoint_load": 1.0, "forward": 6.0}, resumed_from=10,
                     kept=[{"step": 10, "at": 14.0, "phases": {"startup": 1.0, "checkpoint_load": 1.0}}],
                     step=15)  # fmt: skip
    third = attempt(20.0, 25.0, {"startup": 1.0, "forward": 4.0}, resumed_from=10, outcome="finished")
    result = goodput.account([first, second, third])
    assert result is not None
    assert result.badput_seconds["wasted_progress_from_disruption"] == pytest.approx(6.0)
    assert result.goodput_seconds == pytest.approx(9.0 + 4.0)
    assert result.lost_steps == 5
    assert result.badput_seconds["infrastructure_recovery_from_disruption"] == pytest.approx(2.0)


def test_a_queued_cluster_job_counts_its_wait_for_admission_and_the_pods_start():
    run = attempt(100.0, 160.0, {"startup": 10.0, "forward": 50.0}, outcome="finished")
    result = goodput.account([run], job_started=40.0, admitted=70.0)
    assert result is not None
    assert result.badput_seconds["queued"] == 30.0
    assert result.badput_seconds["program_startup"] == 30.0 + 10.0  # pods, images; then the process's
    assert result.wall_seconds == 120.0


def test_the_journal_is_read_defensively(tmp_path):
    folder = tmp_path / "goodput"
    folder.mkdir()
    (folder / goodput.JOB_RECORD).write_text(json.dumps({"started": 5.0}))
    good = {"started": 10.0, "updated": 12.0, "phases": {"forward": 2.0, "not-a-phase": 7.0}}
    (folder / goodput.attempt_name(10.0, 1)).write_text(json.dumps(good))
    (folder / goodput.attempt_name(11.0, 2)).write_text("{half a record")
    (folder / goodput.attempt_name(12.0, 3)).write_text(json.dumps({"started": "soon"}))
    (folder / goodput.attempt_name(13.0, 4)).write_text(json.dumps([1, 2]))
    job_started, attempts = goodput.read_journal(folder)
    assert job_started == 5.0
    assert [(a.started, a.phases) for a in attempts] == [(10.0, {"forward": 2.0})]
    assert goodput.read_journal(tmp_path / "missing") == (None, [])
    assert goodput.account([]) is None


def test_the_timeline_gives_every_moment_to_one_phase():
    timeline = Timeline(started=time.time() - 2.0)  # the process started 2 s ago
    with timeline.phase("setup"):
        time.sleep(0.01)
    timeline.at_step(0)
    with timeline.step(1):
        assert timeline.where().phase == "step"
        with timeline.phase("data"):
            assert (timeline.where().step, timeline.where().phase) == (1, "data")
        with timeline.phase("forward"):
            pass
        first = timeline.where()
    assert timeline.done == 1
    with timeline.step(2), timeline.phase("data"):
        second = timeline.where()
    assert (second.step, second.seq) == (2, 2)  # the same place in step 2 as in step 1: same seq
    with pytest.raises(RuntimeError), timeline.step(3):
        raise RuntimeError("a step that fails is not done")
    assert timeline.done == 2
    assert first.seq == 5  # every switch counts: into the step, into and out of data and forward
    totals = timeline.totals()
    assert set(totals) == set(goodput.PHASES)
    assert totals["setup"] >= 0.01
    assert sum(totals.values()) == pytest.approx(time.time() - timeline.started, abs=0.05)


def beat(step, seq, phase, *, since, at):
    return {"step": step, "seq": seq, "phase": phase, "since": since, "beat": at, "host": "h", "pid": 1}


def test_the_verdict_names_the_rank_behind_and_the_silent_one():
    now = 100.0
    behind = {0: beat(5, 4, "backward", since=90, at=99), 1: beat(5, 3, "forward", since=88, at=99),
              2: beat(5, 4, "backward", since=91, at=99), 3: beat(5, 4, "backward", since=90, at=99)}  # fmt: skip
    verdict = heartbeat.judge(behind, now=now, stale_after=4.0, noticed_by=0)
    assert [s["rank"] for s in verdict["stopped"]] == [1]
    assert verdict["line"] == (
        "hang: rank 1 stopped at step 5 in forward 12 s ago; ranks 0, 2-3 wait at step 5 in backward "
        "(noticed by rank 0)"
    )
    silent = {0: beat(7, 2, "data", since=80, at=99), 1: beat(7, 2, "data", since=80, at=80)}
    verdict = heartbeat.judge(silent, now=now, stale_after=4.0, noticed_by=0)
    assert verdict["line"] == (
        "hang: rank 1 stopped at step 7 in data 20 s ago (no heartbeat for 20 s); rank 0 waits at step 7 in data "
        "(noticed by rank 0)"
    )
    together = {0: beat(9, 5, "optimizer", since=70, at=99), 1: beat(9, 5, "optimizer", since=71, at=99)}
    verdict = heartbeat.judge(together, now=now, stale_after=4.0, noticed_by=1)
    assert verdict["stopped"] == []
    assert verdict["line"] == "hang: every rank waits at step 9 in optimizer (noticed by rank 1)"
    never = heartbeat.judge({0: beat(1, 1, "step", since=90, at=99), 1: None}, now=now, stale_after=4.0,
                            noticed_by=0)  # fmt: skip
    assert (
        never["line"]
        == "hang: rank 1 never sent a heartbeat; rank 0 waits at step 1 in step (noticed by rank 0)"
    )


def test_heartbeats_come_often_enough_to_judge_before_the_collective_fails():
    assert heartbeat.intervals(600) == (5.0, 300.0)
    assert heartbeat.intervals(15) == (0.75, 7.5)
    interval, stall_after = heartbeat.intervals(2)
    assert interval == 0.5 and stall_after == 1.0


def test_attempts_whose_clocks_overlap_still_add_up_to_the_wall_time():
    """Rank 0 of the next attempt runs on another host whose clock is 1 s behind: its start comes before the
    last record of the attempt it follows. The overlap comes off the wasted tail, not counted twice."""
    first = attempt(0.0, 26.0, {"startup": 2.0, "forward": 24.0},
                    kept=[{"step": 10, "at": 20.0, "phases": {"startup": 2.0, "forward": 18.0}}], step=13)  # fmt: skip
    second = attempt(25.0, 40.0, {"startup": 3.0, "forward": 12.0}, resumed_from=10, outcome="finished")
    result = goodput.account([first, second])
    assert result is not None
    assert result.badput_seconds["wasted_progress_from_disruption"] == pytest.approx(5.0)  # 20 -> 25, not 26
    assert result.badput_seconds["infrastructure_recovery_from_disruption"] == 0.0
    assert result.goodput_seconds + sum(result.badput_seconds.values()) == pytest.approx(result.wall_seconds)


def test_milestones_come_from_the_job_its_workload_and_its_pods():
    from orchestrator import status

    job = {"metadata": {"creationTimestamp": "2026-12-01T10:00:00Z"}}
    workload = {"status": {"conditions": [
        {"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-12-01T10:00:30Z"},
        {"type": "Admitted", "status": "True", "lastTransitionTime": "2026-12-01T10:00:31Z"}]}}  # fmt: skip

    def pod(ready: str | None) -> dict:
        conditions = [{"type": "Ready", "status": "True", "lastTransitionTime": ready}] if ready else []
        return {"status": {"conditions": conditions}}

    ready = [pod("2026-12-01T10:01:10Z"), pod("2026-12-01T10:01:40Z")]
    assert status.milestones(job, ready, [workload]) == {
        "created": "2026-12-01T10:00:00Z", "admitted": "2026-12-01T10:00:31Z", "pods_ready": "2026-12-01T10:01:40Z",
    }  # fmt: skip
    assert status.milestones(job, [ready[0], pod(None)], []) == {"created": "2026-12-01T10:00:00Z"}
