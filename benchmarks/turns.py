"""The turn file loops use to take turns (see workload.py); torch-free, shared by the loops and the harness.

turn.json: {"order": [loop names], "turn": name, "visits": {name: turns given so far}, "done": [names]}.
Only the turn's holder writes it: its rank 0 when handing the turn on, or the harness once the holder's
processes have exited (the trainer may leave with os._exit, skipping atexit handlers).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def start(path: Path, names: list[str]) -> None:
    write(
        path, {"order": names, "turn": names[0], "visits": {n: int(n == names[0]) for n in names}, "done": []}
    )


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def write(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)  # atomic: a reader sees the old or the new file, never half of one


def hand_on(path: Path, state: dict[str, Any], holder: str) -> None:
    """Give the turn to the next loop after `holder` that is still running (back to `holder` if none)."""
    order = state["order"]
    start_at = order.index(holder)
    for offset in range(1, len(order) + 1):
        candidate = order[(start_at + offset) % len(order)]
        if candidate not in state["done"] or candidate == holder:
            break
    state["turn"] = candidate
    state["visits"][candidate] += 1
    write(path, state)


def finished(path: Path, name: str) -> None:
    """`name` has exited: take it out of the rotation, and hand the turn on if it held it."""
    state = read(path)
    state["done"].append(name)
    if state["turn"] == name:
        hand_on(path, state, name)
    else:
        write(path, state)
