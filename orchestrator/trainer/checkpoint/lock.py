"""One run at a time per checkpoint directory: its lock.

Rank 0 holds an flock on `.DIR.orch-lock` beside the directory (the directory's real path: the same directory
reached through a symlink is the same lock; recording the holder's host, pid and job) for the whole run,
taken before anything in the directory is touched. A second run that shares the directory (another `--out`
with the same absolute `train.checkpoint.dir`, or a second job on the same volume) stops with one line
naming the holder, instead of resuming from the first's live checkpoints and deleting its writes in flight.
A holder on another host may be a node that died (an NFS lock lives on until its lease ends): its lock is
waited for up to LOCK_WAIT_SECONDS first.

An object store has no flock: rank 0 holds a lease there instead (storage.Lease: the object `.DIR.orch-lock`
beside the prefix, created only if absent and renewed while the run lives), with the same effect: a second
run stops with one line naming the holder; the lease of a run that was killed is taken over at once on the
same machine, after one lease (ORCH_STORAGE_LEASE_SECONDS, 30 s) unrenewed from another.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from orchestrator import storage
from orchestrator.trainer.checkpoint.files import CheckpointError

LOCK_SUFFIX = ".orch-lock"
LOCK_WAIT_SECONDS = (
    120.0  # longer than an NFSv4 lease (90 s): the lock of a node that died is released by then
)


def lock_path(directory: Path) -> Path:
    """The lock of a checkpoint directory: beside it, so the directory holds checkpoints only."""
    real = directory.resolve()
    return real.with_name(f".{real.name}{LOCK_SUFFIX}")


def lock_directory(directory: Path, *, wait_seconds: float = LOCK_WAIT_SECONDS) -> Any:
    """Take the run's lock on a checkpoint directory; returns the open lock file (the lock lasts while it
    is open, and dies with the process). Raises CheckpointError naming the run that holds it."""
    import fcntl
    import socket
    import time

    me = {"host": socket.gethostname(), "pid": os.getpid(), "job": os.environ.get("ORCH_JOB_NAME", "")}
    lock = open(lock_path(directory), "a+")  # noqa: SIM115 (held for the run)
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            lock.seek(0)
            try:
                holder = json.loads(lock.read() or "{}")
            except ValueError:
                holder = {}
            holder = holder if isinstance(holder, dict) else {}
            if (holder.get("host"), holder.get("pid")) == (me["host"], me["pid"]):
                lock.close()  # this process holds it already (an earlier Checkpointer of the same run)
                return None
            # A live process on this host holds it; one elsewhere may be a dead node whose lease runs out.
            if holder.get("host") == me["host"] or time.monotonic() >= deadline:
                lock.close()
                who = ", ".join(f"{key} {holder[key]}" for key in ("job", "host", "pid") if holder.get(key))
                raise CheckpointError(
                    f"checkpoint directory {directory} is in use by another run ({who or 'unknown'}): one run "
                    "at a time; wait for it to finish, or give this run its own train.checkpoint.dir"
                ) from None
            time.sleep(1.0)
    lock.seek(0)
    lock.truncate()
    lock.write(json.dumps(me) + "\n")
    lock.flush()
    return lock


def lease_url(directory: Any) -> str:
    """Where the lease of a checkpoint prefix lives: beside it, as the lock of a directory (inside it when
    the prefix is a bucket's root, which has nothing beside it)."""
    url = str(directory).rstrip("/")
    head, _, name = url.partition("://")[2].rpartition("/")
    if not head:
        return f"{url}/{LOCK_SUFFIX}"
    return f"{url.rpartition('/')[0]}/.{name}{LOCK_SUFFIX}"


def lease_prefix(directory: Any) -> storage.Lease | None:
    """Rank 0 on an object store: take the run's lease on the checkpoint prefix before anything under it is
    touched. Raises CheckpointError naming the run that holds it."""
    lease = storage.Lease(lease_url(directory))
    try:
        held = lease.acquire(say=lambda line: print(line, flush=True))
    except storage.LeaseHeld as error:
        raise CheckpointError(
            f"checkpoint directory {directory} is in use by another run ({error.holder}; its lease "
            f"{lease.url} renewed within the last {lease.seconds:g} s): one run at a time; wait for it to "
            "finish, or give this run its own prefix (--out, output.url or train.checkpoint.dir)"
        ) from None
    return lease if held else None  # (None: this process holds it already, or the store cannot hold one)
