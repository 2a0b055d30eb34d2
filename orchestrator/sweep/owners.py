"""Which `orch sweep` process runs which trial, so that two processes on one sweep never run the same trial.

Each process holds an flock on a file of its own, runs/NAME/owners/HOST-PID-RANDOM.lock, for as long as it
lives (the kernel drops it however the process ends), and writes that file's name on every trial it starts or
takes over (the trial's `orch.owner` attribute). Asking the study for trials, taking over a trial whose owner
died, and counting what runs all happen under a second flock, runs/NAME/sweep.lock, held for milliseconds: a
trial is never seen RUNNING without its owner, and never taken by two processes.

A trial's owner is alive while its lock file is locked. With a sweep folder on a filesystem that honours flock
(local disks, NFSv4) this holds across hosts; a trial whose owner's file is missing is another host's when the
owner names another host (a team sharing `storage:` from separate folders), and is left to that host.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import IO

OWNERS = "owners"
LOCK = "sweep.lock"


class Owner:
    """This process, as the owner of the trials it runs (`with Owner(folder) as owner:`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.host = socket.gethostname().split(".")[0] or "host"
        self.name = f"{self.host}-{os.getpid()}-{secrets.token_hex(3)}"
        self._file: IO[str] | None = None

    def __enter__(self) -> Owner:
        owners = self.folder / OWNERS
        owners.mkdir(parents=True, exist_ok=True)
        self._file = open(owners / f"{self.name}.lock", "w")  # noqa: SIM115 (held for the process's life)
        fcntl.flock(self._file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            (self.folder / OWNERS / f"{self.name}.lock").unlink(missing_ok=True)
            self._file.close()
            self._file = None

    def alive(self, owner: str | None) -> bool:
        """Whether the process `owner` names still runs (this one does)."""
        if not owner:
            return False
        if owner == self.name:
            return True
        path = self.folder / OWNERS / f"{owner}.lock"
        held = _held(path)
        if held is None:
            # no file: this host's process ended (it removes its file); another host's is that host's to judge
            return not owner.startswith(f"{self.host}-")
        if not held:
            path.unlink(missing_ok=True)  # a process that died without removing it
        return held


@contextlib.contextmanager
def exclusive(folder: Path) -> Iterator[None]:
    """The sweep's short critical section: ask, take over, count."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def locked(path: Path) -> bool:
    """Whether another process holds an flock on `path` (an `orch run` holding its run dir's run.lock)."""
    return bool(_held(path))


def _held(path: Path) -> bool | None:
    """Whether another process holds an flock on `path`; None when there is no such file."""
    try:
        with open(path) as file:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
    except FileNotFoundError:
        return None
    return False
