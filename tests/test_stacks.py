"""`orch stacks` on a cluster: the request and the answers in the job's object store (orchestrator/stacks.py),
as the asker and the ranks write and read them. obstore's own in-memory store holds them here (the same
obstore calls the S3 backend answers; tests/cluster/test_stacks_through_the_store.py runs them against a real
S3 server, moto, with a real run's ranks answering)."""

from __future__ import annotations

import json
import time

import pytest
from obstore.store import MemoryStore

from orchestrator import outputs, stacks

KEY = "runs/demo"  # the prefix of output.url in its bucket


def keys(store) -> list[str]:
    import obstore

    return sorted(meta["path"] for batch in obstore.list(store) for meta in batch)


def answer(rank: int, world: int = 2, **extra) -> dict:
    return {"rank": rank, "world_size": world, "pid": 100 + rank, "host": f"pod-{rank}", "how": "faulthandler",
            "text": f'File "train.py", line {rank}', "step": 5, "phase": "backward", "seconds": 3.0,
            "at": time.time(), **extra}  # fmt: skip


def test_a_request_is_answered_by_rank_collected_and_nothing_is_left_behind():
    store = MemoryStore()
    request = stacks.post_request(store, KEY, seconds=30)
    assert keys(store) == [f"{KEY}/stacks.request"]
    assert stacks.read_request(store, KEY) == request  # what a rank's watch reads
    assert stacks.post_answer(store, KEY, request, 1, answer(1))
    assert keys(store) == [f"{KEY}/stacks.request", f"{KEY}/stacks/{request.id}/rank-1.json"]
    first = stacks.read_answers(store, KEY, request, {})
    assert list(first) == [1]
    stacks.post_answer(store, KEY, request, 0, answer(0))
    assert list(stacks.read_answers(store, KEY, request, first)) == [0]  # only what is new
    stacks.withdraw(store, KEY, request)
    assert keys(store) == []
    assert stacks.read_request(store, KEY) is None  # a rank that looks now finds nothing to answer


def test_one_asker_at_a_time_and_a_dead_askers_request_is_taken_over_with_its_late_answers():
    store = MemoryStore()
    waiting = stacks.post_request(store, KEY, seconds=30)
    with pytest.raises(
        stacks.StacksBusy, match=r"another orch stacks asks these ranks now \(for 30 s more\)"
    ):
        stacks.post_request(store, KEY, seconds=30)
    assert stacks.read_request(store, KEY) == waiting  # untouched
    # the first asker was killed: its request outlived its wait, and a rank's answer is still there
    stacks.post_answer(store, KEY, waiting, 0, answer(0))
    later = stacks.post_request(store, KEY, seconds=30, now=waiting.until + 1)
    assert later.id != waiting.id
    assert keys(store) == [f"{KEY}/stacks.request"]  # the stale request and its answer are gone
    assert stacks.read_request(store, KEY) == later


def test_a_rank_does_not_answer_once_its_asker_stopped_waiting():
    store = MemoryStore()
    request = stacks.post_request(store, KEY, seconds=30, now=time.time() - 31)
    assert not stacks.post_answer(store, KEY, request, 0, answer(0))
    assert keys(store) == [f"{KEY}/stacks.request"]


def test_a_rank_that_did_not_answer_is_named_with_its_last_heartbeat():
    now = time.time()
    beats = {"0": {"step": 5, "seq": 9, "phase": "backward", "since": now - 40, "beat": now - 1, "pid": 100,
                   "host": "pod-0"},
             "1": {"step": 5, "seq": 2, "phase": "forward", "since": now - 60, "beat": now - 20, "pid": 101,
                   "host": "pod-1"}}  # fmt: skip
    found = stacks.ranked({0: answer(0, beats=beats, at=now)}, seconds=30)
    assert [(s.rank, s.answered) for s in found] == [(0, True), (1, False)]
    assert found[0].doing() == "step 5 in backward for 3 s"
    assert (
        found[0]
        .block()
        .startswith("--- rank 0 (pid 100 on pod-0, faulthandler): step 5 in backward for 3 s ---\n")
    )
    silent = found[1]
    assert (silent.pid, silent.host, silent.step, silent.phase, silent.seconds) == (
        101,
        "pod-1",
        5,
        "forward",
        60,
    )
    assert silent.block() == (
        "--- rank 1 (pid 101 on pod-1): no answer ---\n"
        "no answer within 30 s; its last heartbeat, 20 s older than the answers, had it at step 5 in forward "
        "for 40 s: a process that is stopped or dead, or of which no thread can run (the hung one)\n"
    )


def test_a_world_larger_than_the_answers_names_every_rank_missing():
    found = stacks.ranked({1: answer(1, world=4)}, seconds=10)
    assert [(s.rank, s.answered) for s in found] == [(0, False), (1, True), (2, False), (3, False)]
    assert found[0].text == "no answer within 10 s, and no heartbeat of it is known"


def test_an_answer_that_is_no_stack_is_left_out():
    import obstore

    store = MemoryStore()
    request = stacks.post_request(store, KEY, seconds=30)
    obstore.put(store, f"{KEY}/{outputs.stacks_answer(request.id, 0)}", b"not json")
    obstore.put(store, f"{KEY}/{outputs.stacks_answer(request.id, 1)}", json.dumps({"rank": 1}).encode())
    obstore.put(store, f"{KEY}/{outputs.stacks_answer(request.id, 'x')}", json.dumps(answer(0)).encode())
    assert stacks.read_answers(store, KEY, request, {}) == {}


def test_the_poll_interval_comes_from_the_jobs_env_when_it_is_a_positive_number():
    assert stacks.poll_seconds({}) == stacks.POLL_SECONDS == 10
    assert stacks.poll_seconds({stacks.POLL_ENV: "2.5"}) == 2.5
    for value in ("0", "-1", "nan", "inf", "soon"):
        with pytest.raises(
            ValueError, match=rf"^\$ORCH_STACKS_POLL_SECONDS: '{value}' is not a positive number"
        ):
            stacks.poll_seconds({stacks.POLL_ENV: value})


def test_own_stack_is_every_thread_of_this_process(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no py-spy to run: faulthandler's (in process, every thread)
    text, how = stacks.own_stack()
    assert how == "faulthandler"
    assert "Current thread" in text and "in test_own_stack_is_every_thread_of_this_process" in text
