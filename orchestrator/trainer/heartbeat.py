"""Hangs named: every rank's heartbeat of its step and phase, and the verdict of the first rank to notice a stall.

Each rank runs one daemon thread that, every `interval` seconds, writes where its loop is (timeline.Position)
into the store its process group was formed through (the c10d TCPStore of torchrun's agent, or of the
launcher's env:// rendezvous; a client of its own, so the loop's store is never shared across threads): one
`set` per interval, no collective, nothing in the step. When its own loop has not moved for `stall_after`
(half of train.collective_timeout, so before the collective fails), it reads every rank's heartbeat and
judges (`judge`): the ranks whose heartbeat went silent (a stopped or dead process), and the ranks behind the
others (ranks at one place have the same (step, seq); the one still in `forward` while the others wait in
`backward`'s gradient reduction is the one that stopped). The first rank to judge (an `add` on the store
decides) posts its verdict there, prints it, writes OUT/hang.json (and the store's copy when the run keeps
its results in one); every rank that reads the verdict writes its own Python stack (every thread,
faulthandler) into its log. The collective still fails at train.collective_timeout: the verdict names the
hang, it does not end it.

The same thread writes rank 0's goodput journal every few seconds (journal.py), and every rank registers
faulthandler on SIGUSR1 (STACK_SIGNAL) for `orch stacks --local`, which signals the ranks of a live run and
reads what they write to OUT/stacks/rank-N.txt. With an object store (output.url), every rank also runs a
StacksWatch, a thread that looks for a cluster `orch stacks`'s request there every few seconds and answers it
(orchestrator/stacks.py).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import outputs, stacks
from orchestrator.trainer.journal import NullJournal
from orchestrator.trainer.timeline import Timeline

if TYPE_CHECKING:
    from orchestrator.trainer.metrics import Meter

log = logging.getLogger(__name__)


def intervals(collective_timeout: float) -> tuple[float, float]:
    """(heartbeat interval, stall_after) for a collective timeout: a verdict at half the timeout, from
    heartbeats at least every 5 s (one `set` each)."""
    return min(5.0, max(0.5, collective_timeout / 20)), collective_timeout / 2


class NullHeartbeat:
    """No heartbeat (ORCH_HEARTBEAT=0: benchmark 12's comparison)."""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class Heartbeat(NullHeartbeat):
    """One rank's heartbeat thread (`start`, `stop`)."""

    def __init__(
        self,
        timeline: Timeline,
        *,
        rank: int,
        world_size: int,
        store_prefix: str,
        collective_timeout: float,
        output_dir: Path,
        kept: Any,
        journal: NullJournal,
        meter: Meter,
        stacks_url: str | None = None,
    ) -> None:
        """`stacks_url`: the run's object store (output.url), where a cluster `orch stacks` asks; None: none."""
        self.timeline, self.rank, self.world_size, self.journal = timeline, rank, world_size, journal
        self.meter = meter
        self.prefix = f"{store_prefix}/heartbeat"
        self.interval, self.stall_after = intervals(collective_timeout)
        self.stale_after = 3 * self.interval + 1.0
        self.output_dir, self.kept = output_dir, kept
        self.verdict: dict[str, Any] | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orch-heartbeat", daemon=True)
        self._host = socket.gethostname()
        self.stacks_watch = StacksWatch(stacks_url, self) if stacks_url else None

    def start(self) -> None:
        self._thread.start()
        if self.stacks_watch is not None:
            self.stacks_watch.start()

    def stop(self) -> None:
        self._stopping.set()
        if self.stacks_watch is not None:
            self.stacks_watch.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval)

    def _key(self, rank: int | str) -> str:
        return f"{self.prefix}/rank-{rank}"

    def _run(self) -> None:
        store = None
        failures = 0
        while not self._stopping.wait(self.interval):
            self.journal.flush()
            result = self.journal.account()  # rank 0's; None elsewhere
            if result is not None:
                self.meter.on_goodput(result)
            try:
                store = store or _connect()
                self._beat(store)
                failures = 0
            except Exception as error:  # the store is gone (the launcher ended): training decides, not this
                failures += 1
                store = None
                if failures == 3:
                    log.warning("heartbeat: the store cannot be reached (%s); no hang verdicts", error)

    def _beat(self, store: Any) -> None:
        now = time.time()
        where = self.timeline.where()
        store.set(self._key(self.rank), json.dumps({
            "step": where.step, "seq": where.seq, "phase": where.phase, "since": where.since, "beat": now,
            "pid": os.getpid(), "host": self._host,
        }))  # fmt: skip
        if self.verdict is not None:
            return
        if store.check([self._key("verdict")]):
            self._heard(json.loads(store.get(self._key("verdict"))))
        elif now - where.since >= self.stall_after:
            beats = {rank: _read(store, self._key(rank)) for rank in range(self.world_size)}
            verdict = judge(beats, now=now, stale_after=self.stale_after, noticed_by=self.rank)
            if store.add(self._key("claim"), 1) == 1:  # the first rank to notice speaks
                store.set(self._key("verdict"), json.dumps(verdict))
                self._post(verdict)
                self._heard(verdict)

    def _post(self, verdict: dict[str, Any]) -> None:
        """The noticing rank: the verdict on its stdout (rank 0's is `orch run`'s console), in OUT/hang.json
        and the store's copy."""
        print(f"orch: {verdict['line']}", flush=True)
        try:
            outputs.write_json(self.output_dir / outputs.HANG, verdict)
            if not isinstance(self.kept, Path):
                (self.kept / outputs.HANG).write_text(json.dumps(verdict) + "\n")
        except Exception as error:
            log.warning("heartbeat: cannot write %s (%s)", outputs.HANG, error)

    def _heard(self, verdict: dict[str, Any]) -> None:
        """Every rank that reads the verdict: it, and this rank's stack (every thread), into its log."""
        self.verdict = verdict
        sys.stdout.flush()
        print(
            f"orch: {verdict['line']}; rank {self.rank} is at {describe(self.timeline.where())}, "
            "its stack (every thread):",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def _connect() -> Any:
    """A store client of this thread's own, to the store the process group was formed through."""
    import torch.distributed as dist

    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=30),
        wait_for_workers=False,
    )


def _read(store: Any, key: str) -> dict[str, Any] | None:
    if not store.check([key]):
        return None
    with contextlib.suppress(ValueError):
        beat = json.loads(store.get(key))
        return beat if isinstance(beat, dict) else None
    return None


# --- the verdict ---------------------------------------------------------------------------------------------


def judge(
    beats: Mapping[int, Mapping[str, Any] | None], *, now: float, stale_after: float, noticed_by: int
) -> dict[str, Any]:
    """Which ranks stopped, and where: those whose heartbeat is older than `stale_after` (or absent), and
    those behind the others. When every rank is at one place and alive, none is named: they all wait (a
    collective that never completes: the network, a device). Pure: the heartbeats are given."""
    silent = {r for r, b in beats.items() if b is None or now - float(b["beat"]) > stale_after}
    places = {r: (int(b["step"]), int(b["seq"])) for r, b in beats.items() if b is not None}
    lowest = min(places.values(), default=None)
    behind = {r for r, p in places.items() if p == lowest} if len(set(places.values())) > 1 else set()
    stopped = sorted(silent | behind)
    waiting = sorted(set(beats) - set(stopped))

    def entry(rank: int) -> dict[str, Any]:
        beat = beats.get(rank)
        if beat is None:
            return {"rank": rank, "step": None, "phase": None, "seconds": None, "heartbeat_age": None}
        return {
            "rank": rank, "step": int(beat["step"]), "phase": str(beat["phase"]),
            "seconds": round(now - float(beat["since"]), 1), "host": beat.get("host"), "pid": beat.get("pid"),
            "heartbeat_age": round(now - float(beat["beat"]), 1) if rank in silent else None,
        }  # fmt: skip

    verdict = {
        "noticed_by": noticed_by,
        "at": now,
        "stopped": [entry(r) for r in stopped],
        "waiting": [entry(r) for r in waiting],
    }
    verdict["line"] = hang_line(verdict)
    return verdict


def hang_line(verdict: Mapping[str, Any]) -> str:
    """The verdict in one line: `hang: rank 1 stopped at step 5 in forward 8 s ago; ranks 0, 2-3 wait at
    step 5 in backward (noticed by rank 0)`."""
    stopped, waiting = verdict.get("stopped") or [], verdict.get("waiting") or []
    parts = []
    for item in stopped:
        if item.get("step") is None:
            parts.append(f"rank {item['rank']} never sent a heartbeat")
            continue
        silent = (
            f" (no heartbeat for {item['heartbeat_age']:.0f} s)"
            if item.get("heartbeat_age") is not None
            else ""
        )
        parts.append(
            f"rank {item['rank']} stopped at step {item['step']} in {item['phase']} "
            f"{item['seconds']:.0f} s ago{silent}"
        )
    groups: dict[tuple[Any, Any], list[int]] = {}
    for item in waiting:
        groups.setdefault((item.get("step"), item.get("phase")), []).append(int(item["rank"]))
    for (step, phase), ranks in groups.items():
        every = "every rank" if not stopped else f"rank{'s' * (len(ranks) > 1)} {rank_list(ranks)}"
        wait = "waits" if not stopped or len(ranks) == 1 else "wait"
        parts.append(f"{every} {wait} at step {step} in {phase}")
    return f"hang: {'; '.join(parts)} (noticed by rank {verdict.get('noticed_by')})"


def rank_list(ranks: list[int]) -> str:
    """0, 2-5, 7: runs of ranks as ranges."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def describe(where: Any) -> str:
    return f"step {where.step} in {where.phase}"


# --- stacks on demand (`orch stacks`) --------------------------------------------------------------------------


def register_stacks(output_dir: Path, rank: int) -> None:
    """faulthandler on STACK_SIGNAL: every thread's stack appended to OUT/stacks/rank-N.txt, and who this rank
    is in OUT/stacks/rank-N.json, where `orch stacks` finds it. Nothing when OUT cannot be written."""
    record, text = outputs.rank_stacks(output_dir, rank)
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        file = open(text, "a")  # noqa: SIM115  # faulthandler keeps it, and writes to it from a signal handler
        faulthandler.register(stacks.STACK_SIGNAL, file=file, all_threads=True, chain=False)
        outputs.write_json(record, {"rank": rank, "pid": os.getpid(), "host": socket.gethostname()})
    except (OSError, RuntimeError, ValueError) as error:
        log.warning("orch stacks: cannot register rank %d's stack dump (%s)", rank, error)


def unregister_stacks() -> None:
    with contextlib.suppress(RuntimeError, ValueError):
        faulthandler.unregister(stacks.STACK_SIGNAL)


class StacksWatch:
    """`orch stacks` on a cluster: a thread of one rank that looks for a request in the run's object store
    (OUTPUT_URL/stacks.request: one GET every stacks.poll_seconds(), 10 s unless the job's env sets
    ORCH_STACKS_POLL_SECONDS; nothing in the step) and answers each request once, while its asker waits:
    every thread's stack (py-spy on itself, else faulthandler), where the loop is, the world size; the first
    rank to answer (an `add` on the c10d store decides) adds every rank's last heartbeat, which names a rank
    that cannot answer. A store that does not answer is asked again at the next look."""

    def __init__(self, url: str, beat: Heartbeat) -> None:
        self.url, self.beat = url, beat
        try:
            self.seconds = stacks.poll_seconds()
        except ValueError as error:  # the job's env: training goes on, at the default interval
            log.warning("orch stacks: %s; looking for requests every %g s", error, stacks.POLL_SECONDS)
            self.seconds = stacks.POLL_SECONDS
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orch-stacks-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()  # a daemon: a request in flight ends with the process

    def _run(self) -> None:
        from orchestrator import storage

        try:
            store, key = storage.object_store(self.url, request_seconds=min(5.0, self.seconds),
                                              retry_seconds=self.seconds)  # fmt: skip
        except storage.StorageError:
            return  # not a URL the store takes: the run's start said so
        answered, failures = None, 0
        while not self._stopping.wait(self.seconds):
            try:
                request = stacks.read_request(store, key)
                if request is not None and request.id != answered:
                    answered = request.id
                    stacks.post_answer(store, key, request, self.beat.rank, self._answer(request.id))
                failures = 0
            except Exception as error:  # noqa: BLE001 (obstore's errors: the next look tries again)
                failures += 1
                if failures == 3:
                    log.warning("orch stacks: cannot read %s (%s); this rank answers once it can", self.url,
                                error)  # fmt: skip

    def _answer(self, request_id: str) -> dict[str, Any]:
        text, how = stacks.own_stack()
        now, where = time.time(), self.beat.timeline.where()
        answer: dict[str, Any] = {
            "rank": self.beat.rank, "world_size": self.beat.world_size, "pid": os.getpid(),
            "host": self.beat._host, "how": how, "text": text, "step": where.step, "phase": where.phase,
            "seconds": round(now - where.since, 1), "at": now,
        }  # fmt: skip
        with contextlib.suppress(Exception):  # the c10d store is gone: no heartbeats to add
            store = _connect()
            if store.add(self.beat._key(f"stacks-{request_id}"), 1) == 1:
                beats = {rank: _read(store, self.beat._key(rank)) for rank in range(self.beat.world_size)}
                answer["beats"] = {str(rank): b for rank, b in beats.items() if b is not None}
        return answer
