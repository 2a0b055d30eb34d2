"""The output directory of a local run: created and held by one run at a time (an flock on OUT/run.lock,
released by the kernel when the run ends however it ends); default directories are unique
(runs/NAME-TIMESTAMP, then -2, -3, ...)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator import outputs
from orchestrator.errors import OrchError, UsageError
from orchestrator.local.planning import LocalPlan


class OutputDirBusy(OrchError):
    """Another live `orch run` holds the output directory."""

    exit_code = 2


@contextmanager
def claim(local: LocalPlan) -> Iterator[LocalPlan]:
    """Create and lock the output directory for this run; yields the plan with the directory it got.

    The lock (flock on OUT/run.lock) lasts while the block runs and dies with this process, however it
    dies: a second run into the same directory is refused instead of mixing its files with this one's.
    """
    import fcntl

    directory = _create_output_dir(local.output_dir, unique=local.unique_output_dir)
    try:
        lock = open(directory / outputs.RUN_LOCK, "a+")  # noqa: SIM115 (held until the run ends)
    except OSError as error:
        raise UsageError(f"--out {directory}: cannot write in it: {error.strerror}") from None
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = outputs.read_run_record(directory).get("pid")
            raise OutputDirBusy(
                f"{directory}/ is in use by another orch run"
                + (f" (pid {holder})" if holder else "")
                + ": wait for it to finish, or pass another --out"
            ) from None
        if directory != local.output_dir:
            local = dataclasses.replace(
                local,
                output_dir=directory,
                env={**local.env, outputs.ENV: str(directory.resolve())},
            )
        yield local
    finally:
        lock.close()


def _create_output_dir(directory: Path, *, unique: bool) -> Path:
    """mkdir, turning what the filesystem says into one line. A unique directory is claimed by an
    exclusive mkdir: two runs started in the same second get NAME-STAMP and NAME-STAMP-2."""
    candidate, number = directory, 1
    while True:
        try:
            candidate.mkdir(parents=True, exist_ok=not unique)
            return candidate
        except FileExistsError:
            if unique and candidate.is_dir():
                number += 1
                candidate = directory.with_name(f"{directory.name}-{number}")
                continue
            raise UsageError(f"--out {candidate}: exists and is not a directory") from None
        except OSError as error:
            raise UsageError(f"--out {candidate}: cannot create it: {error.strerror}") from None
