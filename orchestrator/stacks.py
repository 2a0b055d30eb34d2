"""`orch stacks`: every live rank's Python stack, on demand, for a job that is slow rather than dead.

Each rank of the trainer says who it is in OUT/stacks/rank-N.json (pid, host) and registers Python's
faulthandler on STACK_SIGNAL, appending every thread's stack to OUT/stacks/rank-N.txt
(orchestrator/trainer/heartbeat.py). `dump(OUT)` reads the ranks of this machine: with py-spy installed it
runs `py-spy dump` on each (native frames too, and no help needed from the process); otherwise, or when
py-spy is refused (ptrace), it sends the signal and reads what the rank appended. `orch stacks` calls it on
a live local run (found through the live-run index); on a cluster it runs `python -m orchestrator.stacks`
in each pod (exec), which prints the same for the pod's ranks.

Stdlib only: it runs inside the pods' image and in `orch` alike.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator import outputs

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

    def block(self) -> str:
        return f"--- rank {self.rank} (pid {self.pid} on {self.host}, {self.how}) ---\n{self.text.rstrip()}\n"


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
