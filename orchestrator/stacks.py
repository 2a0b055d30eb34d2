"""`orch stacks`: every live rank's Python stack, on demand, for a job that is slow rather than dead.

On this machine (`orch stacks NAME --local`): each rank of the trainer says who it is in
OUT/stacks/rank-N.json (pid, host) and registers Python's faulthandler on STACK_SIGNAL, appending every
thread's stack to OUT/stacks/rank-N.txt (orchestrator/trainer/heartbeat.py). `dump(OUT)` reads the ranks of
this machine: with py-spy installed it runs `py-spy dump` on each (native frames too, and no help needed
from the process); otherwise, or when py-spy is refused (ptrace), it sends the signal and reads what the rank
appended. In a pod, `python -m orchestrator.stacks` prints the same for the pod's ranks (kubectl exec).

On a cluster (`orch stacks NAME`), through the job's object store (output.url), which the pods write to and
`orch status` already reads, so orch needs no `pods/exec`: `ask_ranks` creates OUTPUT_URL/stacks.request
(a unique id, and until when it waits; one asker at a time, a conditional create), every rank's watch thread
(heartbeat.StacksWatch) looks for it every POLL_SECONDS (one GET) and answers under
OUTPUT_URL/stacks/ID/rank-N.json with its own stack (py-spy on itself where installed and allowed, else
faulthandler) and where its loop is; the first to answer adds every rank's last heartbeat (the c10d
store's), so a rank that does not answer (stopped, or no thread of it can run: the hung one) is named with
its last step and phase. The asker then removes the request and the answers.

Stdlib only at import (obstore when the store is asked): it runs inside the pods' image and in `orch` alike.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import outputs
from orchestrator.errors import OrchError

STACK_SIGNAL = signal.SIGUSR1
"""What a rank's faulthandler answers with every thread's stack (SIGUSR1: Python's own example)."""
WAIT_SECONDS = 10.0


@dataclass(frozen=True)
class RankStack:
    rank: int
    pid: int
    host: str
    text: str
    """Every thread's stack; or why there is none."""
    how: str
    """py-spy, faulthandler, or none."""
    step: int | None = None
    """Where the rank's loop is (a cluster job's answer; for a rank that did not answer, its last heartbeat's)."""
    phase: str | None = None
    seconds: float | None = None
    """How long it has been in that phase."""
    answered: bool = True
    """False: a cluster job's rank that did not answer in time (stopped, dead, or no thread of it runs)."""

    def doing(self) -> str:
        """`step 5 in forward for 12 s`; "" when not known."""
        if self.step is None:
            return ""
        held = f" for {self.seconds:.0f} s" if self.seconds is not None else ""
        return f"step {self.step} in {self.phase}{held}"

    def block(self) -> str:
        who = f"pid {self.pid} on {self.host}" if self.pid else "pid unknown"
        if not self.answered:
            return f"--- rank {self.rank} ({who}): no answer ---\n{self.text.rstrip()}\n"
        doing = f": {self.doing()}" if self.doing() else ""
        return f"--- rank {self.rank} ({who}, {self.how}){doing} ---\n{self.text.rstrip()}\n"


@dataclass(frozen=True)
class LiveRank:
    rank: int
    pid: int
    host: str


def live_ranks(output_dir: Path) -> list[LiveRank]:
    """The ranks of OUT that run on this machine now, by rank."""
    found = []
    host = socket.gethostname()
    for record_file in sorted((output_dir / outputs.STACKS).glob("rank-*.json")):
        record = outputs.read_json(record_file)
        pid, rank = record.get("pid"), record.get("rank")
        if not isinstance(pid, int) or not isinstance(rank, int) or record.get("host") != host:
            continue
        if outputs.pid_alive(pid) and _is_trainer(pid):
            found.append(LiveRank(rank, pid, host))
    return sorted(found, key=lambda r: r.rank)


def _is_trainer(pid: int) -> bool:
    """A reused pid is not a rank: the process must be the trainer (where /proc tells)."""
    try:
        return b"orchestrator.trainer" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no /proc to ask: trust the record


def dump(output_dir: Path, *, wait_seconds: float = WAIT_SECONDS) -> list[RankStack]:
    """Every live rank's stack on this machine: py-spy where installed, else the ranks' faulthandler."""
    ranks = live_ranks(output_dir)
    py_spy = shutil.which("py-spy")
    results: dict[int, RankStack] = {}
    signalled: dict[int, tuple[LiveRank, Path, int]] = {}
    for rank in ranks:
        if py_spy:
            spied = subprocess.run(
                [py_spy, "dump", "--pid", str(rank.pid)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if spied.returncode == 0:
                results[rank.rank] = RankStack(rank.rank, rank.pid, rank.host, spied.stdout, "py-spy")
                continue
        _, text_file = outputs.rank_stacks(output_dir, rank.rank)
        size = text_file.stat().st_size if text_file.exists() else 0
        try:
            os.kill(rank.pid, STACK_SIGNAL)
        except OSError as error:
            results[rank.rank] = RankStack(
                rank.rank, rank.pid, rank.host, f"cannot signal it: {error}", "none"
            )
            continue
        signalled[rank.rank] = (rank, text_file, size)
    deadline = time.monotonic() + wait_seconds
    for rank, text_file, size in signalled.values():
        text = _appended(text_file, size, deadline)
        results[rank.rank] = RankStack(
            rank.rank, rank.pid, rank.host,
            text or f"no stack within {wait_seconds:.0f} s (the process may be stopped)",
            "faulthandler" if text else "none",
        )  # fmt: skip
    return [results[n] for n in sorted(results)]


def _appended(path: Path, size: int, deadline: float) -> str:
    """What was appended to `path` past `size`, once it stopped growing (faulthandler writes in pieces)."""
    seen, quiet_since = size, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now_size = path.stat().st_size if path.exists() else 0
        if now_size != seen:
            seen, quiet_since = now_size, time.monotonic()
        elif seen > size and time.monotonic() - quiet_since >= 0.3:
            break
    if seen <= size:
        return ""
    with open(path, "rb") as file:
        file.seek(size)
        return file.read(seen - size).decode(errors="replace")


# --- a cluster job's ranks, asked through its object store (output.url) -------------------------------------

POLL_ENV = "ORCH_STACKS_POLL_SECONDS"
POLL_SECONDS = 10.0
"""How often every rank of a job with output.url looks for a request: one GET of OUTPUT_URL/stacks.request,
from a thread of its own (never in the step). $ORCH_STACKS_POLL_SECONDS (the job's env) sets another."""
ASK_SECONDS = 30.0
"""How long `orch stacks` waits for the answers by default: a live rank answers within POLL_SECONDS and two
small requests."""
COLLECT_SECONDS = 0.5  # how often the asker lists the answers while it waits


class StacksBusy(OrchError):
    """Another `orch stacks` is asking the job's ranks now (one request at a time per job)."""


@dataclass(frozen=True)
class Request:
    """`orch stacks`'s request (OUTPUT_URL/stacks.request)."""

    id: str
    asked: float
    until: float
    """When its asker stops waiting (Unix time, the asker's clock): a rank answers only before then, so
    nothing is written after the asker removed what was answered."""

    def body(self) -> bytes:
        return (json.dumps({"id": self.id, "asked": self.asked, "until": self.until}) + "\n").encode()

    @classmethod
    def parse(cls, data: bytes) -> Request | None:
        try:
            found = json.loads(data)
            return cls(str(found["id"]), float(found["asked"]), float(found["until"]))
        except (ValueError, TypeError, KeyError):
            return None


def poll_seconds(environ: Any = os.environ) -> float:
    """$ORCH_STACKS_POLL_SECONDS, POLL_SECONDS when unset; ValueError naming it when it is no positive number
    of seconds."""
    text = environ.get(POLL_ENV) or ""
    try:
        seconds = float(text or POLL_SECONDS)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"${POLL_ENV}: {text!r} is not a positive number of seconds")
    return seconds


def _path(key: str, name: str) -> str:
    return f"{key}/{name}" if key else name


def read_request(store: Any, key: str) -> Request | None:
    """The request waiting under the prefix `key` of obstore's `store`; None when there is none."""
    import obstore

    try:
        data = bytes(obstore.get(store, _path(key, outputs.STACKS_REQUEST)).bytes())
    except FileNotFoundError:
        return None
    return Request.parse(data)


def post_request(store: Any, key: str, *, seconds: float, now: float | None = None) -> Request:
    """A new request, waited for `seconds`: created only where there is none (If-None-Match), so two askers
    never share one. A request whose asker stopped waiting (a killed `orch stacks`) is removed first, as is
    whatever a late rank answered to an earlier one; one still waited for: StacksBusy."""
    import obstore
    from obstore.exceptions import AlreadyExistsError

    now = time.time() if now is None else now
    request = Request(uuid.uuid4().hex, now, now + seconds)
    path = _path(key, outputs.STACKS_REQUEST)
    for _ in range(3):
        try:
            obstore.put(store, path, request.body(), mode="create")
        except AlreadyExistsError:
            found = read_request(store, key)
            if found is not None and found.until > now:
                raise StacksBusy(
                    f"another orch stacks asks these ranks now (for {found.until - now:.0f} s more): one at a "
                    "time per job; try again then"
                ) from None
            obstore.delete(store, path)  # its asker is gone (or it is no request): take its place
            continue
        except NotImplementedError:  # a store without conditional writes: the last asker wins
            obstore.put(store, path, request.body())
        remove_answers(store, key, keeping=request.id)
        return request
    raise StacksBusy("another orch stacks keeps taking these ranks' request: try again in a few seconds")


def post_answer(store: Any, key: str, request: Request, rank: int, answer: dict[str, Any]) -> bool:
    """A rank's answer to `request` (STACKS/ID/rank-N.json), written only while its asker waits (by this
    machine's clock); False when too late."""
    import obstore

    if time.time() >= request.until:
        return False
    obstore.put(store, _path(key, outputs.stacks_answer(request.id, rank)), json.dumps(answer).encode())
    return True


def read_answers(store: Any, key: str, request: Request, known: dict[int, Any]) -> dict[int, dict[str, Any]]:
    """The answers to `request` not in `known` yet, by rank (one list, and one get per new answer)."""
    import obstore

    found: dict[int, dict[str, Any]] = {}
    for batch in obstore.list(store, prefix=_path(key, outputs.stacks_answers(request.id)) + "/"):
        for meta in batch:
            rank_text = meta["path"].rpartition("/rank-")[2].removesuffix(".json")
            if not rank_text.isdigit() or int(rank_text) in known:
                continue
            try:
                answer = json.loads(bytes(obstore.get(store, meta["path"]).bytes()))
            except (FileNotFoundError, ValueError):
                continue
            if isinstance(answer, dict) and isinstance(answer.get("text"), str):
                found[int(rank_text)] = answer
    return found


def remove_answers(store: Any, key: str, *, keeping: str | None = None) -> None:
    """Delete every answer under STACKS/ but those to request `keeping`."""
    import obstore

    folder = _path(key, outputs.STACKS) + "/"
    kept = f"{folder}{keeping}/" if keeping else None
    for batch in obstore.list(store, prefix=folder):
        stale = [meta["path"] for meta in batch if not (kept and meta["path"].startswith(kept))]
        if stale:
            obstore.delete(store, stale)


def withdraw(store: Any, key: str, request: Request) -> None:
    """The asker is done: its request, then every answer, removed (a rank that reads the request after this
    finds none; one that read it before answers only until `request.until`)."""
    import obstore

    found = read_request(store, key)
    if found is not None and found.id == request.id:  # (S3 has no conditional delete)
        obstore.delete(store, _path(key, outputs.STACKS_REQUEST))
    remove_answers(store, key)


def ask_ranks(url: str, *, seconds: float = ASK_SECONDS) -> list[RankStack]:
    """Every rank's stack of the running job whose output.url is `url`: a request posted there, the answers
    collected until every rank of the job's world answered or `seconds` passed, then the request and the
    answers removed. A rank that did not answer is a RankStack with `answered` False, its last heartbeat's
    step and phase where another rank's answer had it. [] when no rank answered. StorageError when the store
    cannot be used, StacksBusy when another asker waits."""
    from orchestrator import storage

    store, key = storage.object_store(url, request_seconds=storage.PROBE_REQUEST_SECONDS,
                                      retry_seconds=storage.PROBE_SECONDS - storage.PROBE_REQUEST_SECONDS)  # fmt: skip
    try:
        request = post_request(store, key, seconds=seconds)
    except StacksBusy:
        raise
    except Exception as error:  # noqa: BLE001 (obstore's errors carry the whole HTTP exchange: one phrase)
        raise storage.StorageError(f"cannot write to {url}: {storage.describe(error)}") from error
    answers: dict[int, dict[str, Any]] = {}
    try:
        while True:
            answers |= read_answers(store, key, request, answers)
            world = world_size(answers)
            if (world and set(range(world)) <= set(answers)) or time.time() >= request.until:
                break
            time.sleep(COLLECT_SECONDS)
    except Exception as error:  # noqa: BLE001 (as above)
        raise storage.StorageError(f"cannot read {url}: {storage.describe(error)}") from error
    finally:
        # a store that fails now leaves a request that is stale after `until`: the next asker removes it
        with contextlib.suppress(Exception):
            withdraw(store, key, request)
    return ranked(answers, seconds=seconds)


def ranked(answers: dict[int, dict[str, Any]], *, seconds: float) -> list[RankStack]:
    """The answers as RankStacks, by rank, with one for every rank of the world that did not answer."""
    world = world_size(answers)
    beats: dict[str, Any] = {}
    at = 0.0
    for each in answers.values():
        if isinstance(each.get("beats"), dict):
            beats, at = each["beats"], float(each.get("at") or 0)
    found = []
    for rank in range(max(world, max(answers, default=-1) + 1)):
        answer = answers.get(rank)
        if answer is not None:
            found.append(RankStack(
                rank, int(answer.get("pid") or 0), str(answer.get("host") or ""), answer["text"],
                str(answer.get("how") or ""), step=_int(answer.get("step")), phase=_text(answer.get("phase")),
                seconds=_float(answer.get("seconds")),
            ))  # fmt: skip
            continue
        beat = beats.get(str(rank))
        if not isinstance(beat, dict):
            text = f"no answer within {seconds:.0f} s, and no heartbeat of it is known"
            found.append(RankStack(rank, 0, "", text, "none", answered=False))
            continue
        last, since = _float(beat.get("beat")) or 0.0, _float(beat.get("since")) or 0.0
        step, phase = _int(beat.get("step")), _text(beat.get("phase"))
        text = (
            f"no answer within {seconds:.0f} s; its last heartbeat, {max(0.0, at - last):.0f} s older than the "
            f"answers, had it at step {step} in {phase} for {max(0.0, last - since):.0f} s: a process that is "
            "stopped or dead, or of which no thread can run (the hung one)"
        )
        found.append(RankStack(
            rank, _int(beat.get("pid")) or 0, _text(beat.get("host")) or "", text, "none", step=step,
            phase=phase, seconds=round(max(0.0, at - since), 1), answered=False,
        ))  # fmt: skip
    return found


def world_size(answers: dict[int, dict[str, Any]]) -> int:
    """The job's world as its ranks' answers say it (0: no answer says)."""
    return max((_int(a.get("world_size")) or 0 for a in answers.values()), default=0)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def own_stack() -> tuple[str, str]:
    """This process's stack, every thread, and how it was taken: `py-spy dump` of itself where py-spy is
    installed and may read it (ptrace: a container often may not), else faulthandler's."""
    import faulthandler
    import tempfile

    py_spy = shutil.which("py-spy")
    if py_spy:
        try:
            spied = subprocess.run([py_spy, "dump", "--pid", str(os.getpid())], capture_output=True,
                                   text=True, timeout=30, check=False)  # fmt: skip
            if spied.returncode == 0 and spied.stdout.strip():
                return spied.stdout, "py-spy"
        except (OSError, subprocess.TimeoutExpired):
            pass
    with tempfile.TemporaryFile() as file:  # faulthandler writes to a file descriptor
        faulthandler.dump_traceback(file=file, all_threads=True)
        file.seek(0)
        return file.read().decode(errors="replace"), "faulthandler"


def main(argv: list[str] | None = None) -> int:
    """`python -m orchestrator.stacks [OUT]`: the stacks of this machine's ranks (in a pod: OUT is
    $ORCH_OUTPUT_DIR), as JSON lines, for `orch stacks` on a cluster."""
    args = sys.argv[1:] if argv is None else argv
    output_dir = Path(args[0] if args else os.environ.get(outputs.ENV) or ".")
    for stack in dump(output_dir):
        print(json.dumps({"rank": stack.rank, "pid": stack.pid, "host": stack.host, "how": stack.how,
                          "text": stack.text}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
