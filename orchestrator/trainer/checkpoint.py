"""Distributed checkpoints (torch.distributed.checkpoint) that survive a kill at any moment.

A checkpoint is a directory `step-00000120/`:

    .metadata, __0_0.distcp, __1_0.distcp ...   DCP: every rank writes its part (its shards under FSDP;
                                                under DDP the replicated tensors are spread over the ranks)
    train.pt                                    step, counters, LR-schedule and GradScaler states, the RNG
                                                states of every rank (plain values: loads with weights_only)
    orch-checkpoint.json                        the completion marker: format, step, world size, mode and
                                                the size and sha256 of every file above; written last

It is written as `.step-00000120.tmp/` and renamed into place by rank 0 once every rank's files and the
marker are on disk (fsync'ed), so a `step-*` directory is complete or absent; a `.tmp` left by a kill is
removed at the next start. A checkpoint is *complete* when its marker is well-formed (format, step, and a
`files` list that holds DCP's `.metadata` and train.pt) and every file it lists is there with its size;
it *verifies* when, besides, every file's content has the sha256 the marker recorded (markers of earlier
versions hold sizes only: those files are checked by size). Resume takes the newest checkpoint that verifies
(the ranks share the hashing) and names each newer one it skips, and why; rotation keeps the newest `keep`
complete checkpoints, and removes one that is not complete only once a newer complete one exists (until
then it may be all a user has left). A checkpoint written again at the same step replaces the old one only
once it is complete itself.

Who hashes what at a save: each rank hashes the files it wrote itself (DCP names them `__{rank}_N.distcp`;
rank 0 also `.metadata` and train.pt), so each reads back about checkpoint / world size bytes, and rank 0
only merges the digests: a synchronous save gathers them (one all_gather_object); an async save is not
collective until the next save, so a rank whose write is done (seen at `poll`) puts its digests in
`.orch-digests/RANK.json` inside the checkpoint, and rank 0 completes the checkpoint once every rank's
file is there (a listing of that folder per step), removing the folder before it writes the marker.

On an object store (`output.url`, `orch run --out s3://...`, a `checkpoint.dir` URL) there is no rename:
every rank writes its part straight into `step-00000120/` and rank 0 writes the marker last, once every
rank's objects are there, so the marker's presence (and its listing) is what makes a checkpoint complete. A
prefix without a marker is a write that was killed, removed at the next start as a `.tmp` is on disk. The
directory is a `pathlib.Path` or a `upath.UPath` (orchestrator/storage.py): the same code reads both.

One run at a time uses a checkpoint directory: rank 0 holds an flock on `.DIR.orch-lock` beside it (the
directory's real path: the same directory reached through a symlink is the same lock; recording the holder's
host, pid and job) for the whole run, taken before anything in the directory is touched. A second run that
shares the directory (another `--out` with the same absolute `train.checkpoint.dir`, or a second job on the
same volume) stops with one line naming the holder, instead of resuming from the first's live checkpoints
and deleting its writes in flight. A holder on another host may be a node that died (an NFS lock lives on
until its lease ends): its lock is waited for up to LOCK_WAIT_SECONDS first.

On resume every rank reads its own part from the shared directory (DCP reshards: a checkpoint written by
4 ranks loads on 2, under DDP and FSDP alike); nothing is broadcast from rank 0. All ranks must therefore
see the same checkpoint directory: any local directory on one node, a shared volume across nodes.

Single-file checkpoints of earlier versions (`step-00000120.pt`, format orch-checkpoint/1) still resume:
every rank reads the file (memory-mapped) and takes its part of the full state.

Loading a checkpoint outside orch: see docs/trainer.md ("Loading a checkpoint outside orch").
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import random
import re
import shutil
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn, cast

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from orchestrator import storage

FORMAT = "orch-checkpoint/2"
LEGACY_FORMAT = "orch-checkpoint/1"
MARKER = "orch-checkpoint.json"
TRAIN_STATE = "train.pt"
NAME = re.compile(r"^step-(\d{8})$")
LEGACY_NAME = re.compile(r"^step-(\d{8})\.pt$")
TMP = re.compile(r"^\.step-\d{8}(\.pt)?(\.replaced)?\.tmp$")
DIGEST = "sha256"
DIGESTS = ".orch-digests"  # async saves: each rank's digests of what it wrote, until rank 0 merges them
REQUIRED_FILES = (
    ".metadata",
    "train.pt",
)  # DCP's index and orch's train state: a checkpoint without either is not one


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or no checkpoint could be resumed from; the message says why."""


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


def path_for(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}"


def legacy_path_for(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}.pt"


def _step_of(path: Path) -> int | None:
    match = NAME.match(path.name) or LEGACY_NAME.match(path.name)
    return int(match.group(1)) if match else None


def list_checkpoints(directory: Path) -> list[Path]:
    """Every checkpoint by name (directories and legacy files, temporaries excluded), newest first.
    Names only: see `verify` for whether one is complete."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if _step_of(p) is not None]
    # the same step in both forms: the directory (written by this version) first
    return sorted(found, key=lambda p: (_step_of(p), p.is_dir()), reverse=True)


def file_digest(stream: Any) -> str:
    """The sha256 of a binary stream, read in 1 MiB pieces. The one place checkpoint content is hashed,
    written and verified: any file-like object works (a local file, an object store's stream)."""
    digest = hashlib.new(DIGEST)
    while chunk := stream.read(1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


def _digest_of(path: Path) -> str:
    with path.open("rb") as stream:  # a Path or an object store's UPath
        return file_digest(stream)


def _marker_files(path: Path) -> dict[str, tuple[int, str | None]] | str:
    """{file: (size, sha256 or None)} from a checkpoint directory's marker, or why the marker is not one
    (missing, unreadable, hand-edited into another shape, no `files`)."""
    try:
        marker = json.loads((path / MARKER).read_text())
    except FileNotFoundError:
        return f"no {MARKER} (an incomplete write)"
    except (OSError, ValueError) as error:
        return f"unreadable {MARKER} ({error})"
    if not isinstance(marker, dict) or marker.get("format") != FORMAT:
        return f"{MARKER} is not {FORMAT}"
    if marker.get("step") != _step_of(path) or isinstance(marker.get("step"), bool):
        return f"{MARKER} names step {marker.get('step')!r}, not the directory's"
    listed = marker.get("files")
    if not isinstance(listed, dict) or not listed:
        return f"{MARKER} lists no files"
    files: dict[str, tuple[int, str | None]] = {}
    for name, entry in listed.items():
        if isinstance(entry, int) and not isinstance(entry, bool):
            files[name] = (entry, None)  # an earlier version's marker: sizes only
        elif (
            isinstance(entry, dict)
            and isinstance(entry.get("size"), int)
            and not isinstance(entry.get("size"), bool)
            and isinstance(entry.get(DIGEST), str)
        ):
            files[name] = (entry["size"], entry[DIGEST])
        else:
            return f"{MARKER} has a malformed entry for {name!r}"
        if "/" in name or name in (".", ".."):
            return f"{MARKER} lists {name!r}, not a file of the checkpoint"
    if missing := [name for name in REQUIRED_FILES if name not in files]:
        return f"{MARKER} does not list {missing[0]}"
    return files


def verify(path: Path, *, content: bool = True, share: tuple[int, int] = (0, 1)) -> str | None:
    """None when the checkpoint verifies, else why not (one short phrase). content=False: complete only
    (marker and sizes). `share` (index, count): hash only every count-th listed file from index on, so that
    the ranks of a job can split the reading of a big checkpoint between them."""
    if path.is_dir():
        files = _marker_files(path)
        if isinstance(files, str):
            return files
        for name, (size, _) in files.items():
            try:
                actual = (path / name).stat().st_size
            except OSError:
                return f"{name} is missing"
            if actual != size:
                return f"{name} has {actual} bytes, {size} were written"
        if not content:
            return None
        index, count = share
        for position, (name, (_, expected)) in enumerate(files.items()):
            if expected is None or position % count != index:
                continue
            try:
                if _digest_of(path / name) != expected:
                    return f"{name} does not have the content that was written (its {DIGEST} differs)"
            except OSError as error:
                return f"{name} cannot be read ({error.strerror or error})"
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # a truncated or foreign file
        return f"does not load ({type(error).__name__})"
    if not isinstance(state, dict) or state.get("format") != LEGACY_FORMAT:
        return f"not an orch checkpoint ({LEGACY_FORMAT})"
    return None


def newest_valid(directory: Path, *, content: bool = True) -> tuple[Path | None, dict[str, str]]:
    """The newest checkpoint that verifies (content=False: is complete), or None, and the reasons of the
    newer ones that do not."""
    invalid: dict[str, str] = {}
    for path in list_checkpoints(directory):
        reason = verify(path, content=content)
        if reason is None:
            return path, invalid
        invalid[path.name] = reason
    return None, invalid


# --- writing ---------------------------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_atomic(path: Path, state: dict[str, Any]) -> None:
    """torch.save to a temporary file, fsync, rename into place, fsync the directory (model.pt).
    On an object store one PUT is already atomic."""
    if storage.is_remote(path):
        path.write_bytes(_to_bytes(state))
        return
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _write_file(path: Path, data: bytes) -> None:
    if storage.is_remote(path):  # one PUT: an object appears whole or not at all
        path.write_bytes(data)
        return
    with open(path, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _hashed(path: Path) -> dict[str, Any]:
    """The marker's entry for one file: its size and sha256, from one reading (the size is what was hashed)."""
    with path.open("rb") as stream:  # a Path or an object store's UPath
        digest = file_digest(stream)
        return {"size": stream.tell(), DIGEST: digest}


def _hash_files(directory: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    return {name: _hashed(directory / name) for name in names}


def files_written_by(metadata: Any, rank: int) -> list[str]:
    """The files of a checkpoint that `rank` wrote, from the Metadata dcp.save returns on every rank: DCP's
    file writer names a rank's files `__{rank}_N.distcp` (torch/distributed/checkpoint/filesystem.py,
    prepare_global_plan), each item's `relative_path`; rank 0 (DCP's coordinator and orch's) also wrote
    `.metadata` and train.pt. A file left out here (a rank that DCP gave nothing to write still writes an
    empty one) is hashed by rank 0 when it lists the directory."""
    prefix = f"__{rank}_"
    items = getattr(metadata, "storage_data", None) or {}
    names = {getattr(info, "relative_path", None) for info in items.values()}
    own = sorted(name for name in names if isinstance(name, str) and name.startswith(prefix))
    return [*own, ".metadata", TRAIN_STATE] if rank == 0 else own


def _names_in(directory: Any) -> list[str]:
    """The names in a directory (local) or under a prefix (object store: one listing); [] when absent."""
    try:
        if storage.is_remote(directory):
            return [name.rsplit("/", 1)[-1] for name in directory.fs.ls(directory.path, detail=False)]
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def _plain_files(directory: Any) -> list[str]:
    """The files of a checkpoint being written (DIGESTS, a folder, excluded): one listing."""
    if storage.is_remote(directory):
        entries = directory.fs.ls(directory.path, detail=True)
        return sorted(e["name"].rsplit("/", 1)[-1] for e in entries if e.get("type") == "file")
    return sorted(entry.name for entry in os.scandir(directory) if entry.is_file())


DIGEST_FILE = re.compile(r"^\d+\.json$")


def _write_digests(tmp: Path, rank: int, hashed: dict[str, dict[str, Any]]) -> None:
    """Async saves, ranks other than 0: the digests of what this rank wrote, for rank 0 to merge. Appears
    whole (renamed into place; one PUT on an object store): rank 0 counts the files to know it has all."""
    data = json.dumps(hashed).encode()
    folder = tmp / DIGESTS
    if storage.is_remote(tmp):
        (folder / f"{rank}.json").write_bytes(data)
        return
    folder.mkdir(exist_ok=True)
    part = folder / f".{rank}.json.part"
    _write_file(part, data)
    os.rename(part, folder / f"{rank}.json")


def _digest_files(tmp: Path) -> list[str]:
    return [name for name in _names_in(tmp / DIGESTS) if DIGEST_FILE.match(name)]


def _collect_digests(tmp: Path) -> dict[str, dict[str, Any]]:
    """Rank 0: the other ranks' digests, read in parallel (an object store answers each GET in tens of
    milliseconds; hundreds of ranks would add up); their folder is removed, the marker does not list it."""
    from concurrent.futures import ThreadPoolExecutor

    folder = tmp / DIGESTS
    names = _digest_files(tmp)
    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=16) as pool:
        parts = list(pool.map(lambda name: json.loads((folder / name).read_bytes()), names))
    storage.remove_tree(folder)
    return {name: entry for part in parts for name, entry in part.items()}


def _finalize(
    tmp: Path, final: Path, *, step: int, world_size: int, mode: str, hashed: dict[str, dict[str, Any]]
) -> None:
    """Rank 0, once every rank's files are written and each rank has hashed its own (`hashed`, merged):
    list the directory, hash what no rank claimed (an empty file), write the marker, rename into place (on
    an object store `tmp` is `final` and the marker, written last, is what completes it)."""
    present = _plain_files(tmp)
    entries = {**_hash_files(tmp, [name for name in present if name not in hashed]), **hashed}
    files = {name: entries[name] for name in sorted(entries)}
    marker = {"format": FORMAT, "step": step, "world_size": world_size, "parallel": mode, "files": files}
    _write_file(tmp / MARKER, (json.dumps(marker, indent=1) + "\n").encode())
    if storage.is_remote(tmp):
        return
    fsync_dir(tmp)
    if final.exists():
        # The same step written again (a run resumed from an earlier checkpoint, this one skipped): the
        # old one goes only now that the new one is complete, and never before the new one is in place.
        replaced = final.with_name(f".{final.name}.replaced.tmp")
        shutil.rmtree(replaced, ignore_errors=True)
        os.rename(final, replaced)
        os.rename(tmp, final)
        shutil.rmtree(replaced, ignore_errors=True)
    else:
        os.rename(tmp, final)
    fsync_dir(final.parent)


# torch.save's zip writer reports a short write (ENOSPC underneath) as "unexpected pos N vs M".
SHORT_WRITE = "unexpected pos"
NEARLY_FULL = 16 * 2**20


def _describe(error: BaseException, directory: Path) -> str:
    """One phrase for a failed write; a full disk says so whichever rank and layer noticed it."""
    if storage.is_remote(directory):
        failures = getattr(error, "failures", None)  # DCP's CheckpointException: {rank: exception}
        if isinstance(failures, dict) and failures:
            error = next(iter(failures.values()))
        return storage.describe(error)
    text = str(error)
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        free = None
    chain: list[BaseException] = [error]
    failures = getattr(error, "failures", None)  # DCP's CheckpointException: {rank: exception}
    if isinstance(failures, dict):
        chain += [f for f in failures.values() if isinstance(f, BaseException)]
    for item in chain:
        cause: BaseException | None = item
        while cause is not None:
            if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
                return "no space left on device"
            cause = cause.__cause__ or cause.__context__
    if "No space left on device" in text or "ENOSPC" in text:
        return "no space left on device"
    if SHORT_WRITE in text:
        if free is not None and free < NEARLY_FULL:
            return "no space left on device"
        return "a file was cut short while writing (a full disk or quota?)"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first[:300]


def _load_failure(error: BaseException) -> str:
    """One line for a failed load: DCP's CheckpointException carries each rank's exception in `failures`
    (a WrappedException holding the real one); the first of them says what did not fit."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, failure = sorted(failures.items())[0]
        inner = getattr(failure, "exception", failure)
        text = " ".join(str(inner).split()) or type(inner).__name__
        return f"{type(inner).__name__} on rank {rank}: {text[:300]}"
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text[:300]}"


def rng_state() -> dict[str, Any]:
    """This process's random states as plain Python values (bytes, ints, lists): they travel through
    all_gather_object and load with weights_only=True."""
    legacy_state = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    kind, keys, position, has_gauss, cached = legacy_state
    state: dict[str, Any] = {
        "torch": torch.get_rng_state().numpy().tobytes(),
        "python": random.getstate(),
        "numpy": (kind, keys.tolist(), position, has_gauss, cached),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state().numpy().tobytes()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8))
    random.setstate(state["python"])
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), position, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(state["cuda"]), dtype=torch.uint8))


def check_stores(places: list[str | None], *, rank: int) -> None:
    """Collective: rank 0 writes a probe to each object store named in `places` (local paths are skipped)
    and every rank raises the same StorageError when one cannot be written: at start, in one line."""
    problem = None
    if rank == 0:
        for place in places:
            if place and storage.is_url(place):
                try:
                    storage.check_writable(place)
                except storage.StorageError as error:
                    problem = str(error)
                    break
    if dist.is_initialized():
        shared = [problem]
        dist.broadcast_object_list(shared, src=0)
        problem = shared[0]
    if problem:
        raise storage.StorageError(problem)


@dataclass
class Resumed:
    """What a resume found: the training state beside the model and optimizer (already loaded)."""

    path: Path
    step: int
    state: dict[str, Any]
    """train.pt: step, counters, scheduler, scaler, world_size, rng (one per saving rank)."""


@dataclass
class _Write:
    """An async save in flight: DCP's future, where it goes, and (once this rank's part is written) the
    digests of the files this rank wrote."""

    future: Any
    tmp: Path
    final: Path
    step: int
    hashed: dict[str, dict[str, Any]] | None = None


class Checkpointer:
    """Saves every `every_steps` and at the end, keeps `keep` that verify, resumes from the newest valid."""

    def __init__(
        self,
        directory: Path | Any,
        *,
        every_steps: int,
        keep: int,
        rank: int,
        world_size: int,
        mode: str = "ddp",
        async_save: bool = False,
        collective_timeout: timedelta | None = None,
    ) -> None:
        self.directory, self.every_steps, self.keep = directory, every_steps, keep
        self.rank, self.world_size, self.mode = rank, world_size, mode
        self.async_save = async_save
        self._pending: _Write | None = None
        # The background write's collectives get a group of their own (never interleaved with training's).
        # A new group does not inherit the default group's timeout (torch gives it 30 minutes): the run's
        # train.collective_timeout is passed down so that it bounds these collectives too.
        self._group = (
            dist.new_group(backend="gloo", timeout=collective_timeout)
            if async_save and dist.is_initialized()
            else None
        )
        self.remote = storage.is_remote(directory)
        self._lock: Any = None
        refused: str | None = None
        if rank == 0 and self.remote:
            # (an object store has no lock: one run per prefix is the user's to keep)
            for leftover in list_checkpoints(directory):  # writes that were killed: no marker
                if leftover.is_dir() and not (leftover / MARKER).exists():
                    storage.remove_tree(leftover)
        elif rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            try:
                self._lock = lock_directory(directory)  # before anything in it is touched
            except CheckpointError as error:
                refused = str(error)
            else:
                for leftover in directory.iterdir():  # from writes that were killed
                    if TMP.match(leftover.name):
                        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        if dist.is_initialized():  # nobody looks at the directory before it is clean (or refused)
            outcome: list[Any] = [None] * self.world_size
            dist.all_gather_object(outcome, refused)
            refused = outcome[0]
        if refused:
            raise CheckpointError(refused)

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0

    # --- save ----------------------------------------------------------------------------------

    def save(self, step: int, *, module: Any, optimizer: Any, train_state: dict[str, Any]) -> None:
        """Collective: every rank calls it and writes its part; rank 0 finalizes and rotates.

        `train_state` (counters, scheduler, scaler) must be the same on every rank; the RNG states of
        every rank are added here. With async saves, returns once the state is staged in memory.
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.wait()  # one write in flight at a time
        final = path_for(self.directory, step)
        tmp = final if self.remote else self.directory / f".{final.name}.tmp"  # no rename on object stores
        rng_states: list[Any] = [None] * self.world_size
        dist.all_gather_object(rng_states, rng_state())
        model_state, optimizer_state = get_state_dict(module, optimizer)
        extra = {**train_state, "step": step, "world_size": self.world_size, "parallel": self.mode,
                 "rng": rng_states}  # fmt: skip
        error: BaseException | None = None
        hashed: dict[str, dict[str, Any]] | None = None
        try:
            if self.rank == 0:
                if tmp.exists():  # the same step written again (a run resumed from an earlier checkpoint)
                    storage.remove_tree(tmp)
                if not self.remote:
                    tmp.mkdir(parents=True)
            dist.barrier()
            state = {"model": model_state, "optimizer": optimizer_state}
            if self.async_save:
                future = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self._group)
                if self.rank == 0:
                    _write_file(tmp / TRAIN_STATE, _to_bytes(extra))
                self._pending = _Write(future, tmp, final, step)
                return
            metadata = dcp.save(state, checkpoint_id=str(tmp))
            if self.rank == 0:
                _write_file(tmp / TRAIN_STATE, _to_bytes(extra))
            hashed = _hash_files(tmp, files_written_by(metadata, self.rank))  # this rank's part only
        except (Exception, CheckpointException) as caught:  # (DCP's is a BaseException)
            error = caught
        shares: list[Any] = [None] * self.world_size  # every rank's digests (None: it failed)
        dist.all_gather_object(shares, hashed)
        if self.rank == 0 and error is None and all(share is not None for share in shares):
            try:
                merged = {name: entry for share in shares for name, entry in share.items()}
                _finalize(tmp, final, step=step, world_size=self.world_size, mode=self.mode, hashed=merged)
                self._rotate()
            except (Exception, CheckpointException) as caught:
                error = caught
        self._agree(error, tmp, step)  # collective: every rank learns whether the save held

    def _agree(self, error: BaseException | None, tmp: Path, step: int) -> None:
        """Every rank ends the save the same way: complete, or failed with one clear message."""
        outcome: list[Any] = [None if error is None else _describe(error, self.directory)]
        reasons: list[Any] = [None] * self.world_size
        dist.all_gather_object(reasons, outcome[0])
        failed = next((r for r in reasons if r is not None), None)
        if failed is None:
            return
        self._fail(tmp, step, failed, error)

    @property
    def _remedy(self) -> str:
        if self.remote:
            return "check the store (its credentials, its endpoint, that it is up)"
        return "free space there (or point train.checkpoint.dir elsewhere)"

    def poll(self) -> None:
        """Async saves, every step, no collective (each rank sees its write finish at its own step): once
        this rank's write is done it hashes the files it wrote (rank 0 keeps the digests, the others write
        them into the checkpoint's DIGESTS folder); rank 0 completes the checkpoint once every other rank's
        digests are there (one listing of that folder per step until then)."""
        write = self._pending
        if write is None:
            return
        if write.hashed is None:
            if not write.future.done():
                return
            error = self._hash_own(write)
            if error is not None:
                self._pending = None
                self._fail(write.tmp, write.step, _describe(error, self.directory), error)
        if self.rank == 0 and (self.world_size == 1 or len(_digest_files(write.tmp)) >= self.world_size - 1):
            self._complete(write)

    def wait(self) -> None:
        """Async saves, collective (every rank calls it: at the next save and at the end): block until the
        write in flight is written and hashed on every rank, then rank 0 completes it."""
        if not self.async_save:
            return
        write = self._pending
        error = self._hash_own(write) if write is not None and write.hashed is None else None
        reason = None if error is None else _describe(error, self.directory)
        reasons: list[Any] = [reason]
        if dist.is_initialized():  # after this every rank's digests are in DIGESTS
            reasons = [None] * self.world_size
            dist.all_gather_object(reasons, reason, group=self._group)
        failed = next((r for r in reasons if r is not None), None)
        if write is None:  # rank 0 completed it already in poll (none failed), or there was none
            return
        self._pending = None
        if failed is not None:
            self._fail(write.tmp, write.step, failed, error)
        if self.rank == 0:
            self._complete(write)

    def _hash_own(self, write: _Write) -> BaseException | None:
        """This rank's write is done: hash the files it wrote; None, or what failed (the write or the read)."""
        try:
            hashed = _hash_files(write.tmp, files_written_by(write.future.result(), self.rank))
            if self.rank != 0:
                _write_digests(write.tmp, self.rank, hashed)
        except (Exception, CheckpointException) as error:  # (DCP's is a BaseException)
            return error
        write.hashed = hashed
        return None

    def _complete(self, write: _Write) -> None:
        """Rank 0: every rank's part is written and hashed: merge the digests into the marker, put the
        checkpoint in place, rotate."""
        assert write.hashed is not None
        self._pending = None
        try:
            hashed = {**_collect_digests(write.tmp), **write.hashed}
            _finalize(
                write.tmp, write.final, step=write.step, world_size=self.world_size, mode=self.mode,
                hashed=hashed,
            )  # fmt: skip
            self._rotate()
        except (Exception, CheckpointException) as error:
            self._fail(write.tmp, write.step, _describe(error, self.directory), error)

    def _fail(self, tmp: Path, step: int, reason: str, error: BaseException | None) -> NoReturn:
        """A save failed (synchronous or asynchronous): one message, and no half-written checkpoint left."""
        if self.rank == 0:
            _remove_quietly(tmp)
        raise CheckpointError(
            f"checkpoint at step {step}: could not write {self.directory}: {reason}; {self._remedy} and run "
            "again: training resumes from the last complete checkpoint"
        ) from error

    def _rotate(self) -> None:
        """Keep the newest `keep` complete checkpoints (marker and sizes: hashing every kept checkpoint at
        every save would read them all again; resume verifies content). One that is not complete is not
        counted, and is removed only once a newer complete one exists (until then it may be all a user
        has left)."""
        kept = 0
        for path in list_checkpoints(self.directory):
            if verify(path, content=False) is not None:
                if kept:
                    storage.remove_tree(path)
                continue
            kept += 1
            if kept > self.keep:
                storage.remove_tree(path)

    # --- resume --------------------------------------------------------------------------------

    def load(self, *, module: Any, optimizer: Any) -> Resumed | None:
        """Collective: the newest checkpoint that verifies on every rank, loaded into module and
        optimizer by every rank from its own reading of the directory. None: there is no checkpoint.
        Newer checkpoints that do not verify are skipped, each named with the reason (rank 0 says it).
        Raises CheckpointError when checkpoints exist but none can be used, or none fits the model."""
        complete, invalid = newest_valid(self.directory, content=False)
        views: list[Any] = [None] * self.world_size
        dist.all_gather_object(views, (str(complete) if complete else None, invalid))
        chosen = [v[0] for v in views]
        if len(set(chosen)) > 1:
            blind = [rank for rank, c in enumerate(chosen) if c != chosen[0]]
            raise CheckpointError(
                f"ranks disagree on the newest checkpoint in {self.directory} (rank 0: {chosen[0]}, "
                f"ranks {blind}: other): every rank must see the same checkpoint directory; on more than "
                "one node, put train.checkpoint.dir on a volume every pod mounts"
            )
        skipped = dict(views[0][1])
        path = None
        for candidate in list_checkpoints(self.directory):
            if candidate.name in skipped:
                continue
            # Every rank hashes its share of the files; all agree on the outcome.
            mine = verify(candidate, share=(self.rank, self.world_size))
            reasons: list[Any] = [None] * self.world_size
            dist.all_gather_object(reasons, mine)
            reason = next((r for r in reasons if r is not None), None)
            if reason is None:
                path = candidate
                break
            skipped[candidate.name] = reason
        if path is None:
            if skipped:
                listing = "; ".join(f"{name}: {why}" for name, why in skipped.items())
                raise CheckpointError(
                    f"no checkpoint in {self.directory} can be resumed from ({listing}); move them "
                    "away to start from step 0"
                )
            return None
        if skipped and self.rank == 0:
            for name, why in skipped.items():
                print(
                    f"warning: checkpoint {self.directory / name} skipped: {why}; kept until a newer "
                    f"checkpoint is complete",
                    file=sys.stderr,
                    flush=True,
                )
        try:
            if path.is_dir():
                state = self._load_dcp(path, module, optimizer)
            else:
                state = self._load_legacy(path, module, optimizer)
        except (Exception, CheckpointException) as error:  # (DCP's is a BaseException)
            raise CheckpointError(
                f"cannot resume from {path}: {_load_failure(error)}; a checkpoint of another model or "
                "task? point train.checkpoint.dir (or --out) elsewhere to start from step 0"
            ) from error
        return Resumed(path=path, step=int(state["step"]), state=state)

    def _load_dcp(self, path: Path, module: Any, optimizer: Any) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optimizer_state = get_state_dict(module, optimizer)
        state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=str(path))  # each rank reads what its shards need
        set_state_dict(
            module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )
        return torch.load(
            io.BytesIO((path / TRAIN_STATE).read_bytes()), map_location="cpu", weights_only=True
        )

    def _load_legacy(self, path: Path, module: Any, optimizer: Any) -> dict[str, Any]:
        """orch-checkpoint/1: one torch.save file of full states (optimizer keyed by parameter index)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        old = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        names = [name for name, _ in module.named_parameters()]  # the optimizer's order: parameters()
        optim = old["optimizer"]
        optimizer_state: dict[str, Any] = {
            "state": {names[index]: value for index, value in optim["state"].items()},
            "param_groups": [
                {**group, "params": [names[index] for index in group["params"]]}
                for group in optim["param_groups"]
            ],
        }
        set_state_dict(
            module, optimizer, model_state_dict=old["model"], optim_state_dict=optimizer_state,
            options=StateDictOptions(full_state_dict=True),
        )  # fmt: skip
        return {key: old[key] for key in ("step", "world_size", "rng", "scheduler", "scaler", "counters")}

    def restore_rng(self, state: dict[str, Any], seed: int) -> None:
        """Each rank continues its own random streams; with a new world size, fresh streams per rank."""
        if state.get("world_size") == self.world_size:
            set_rng_state(state["rng"][self.rank])
        else:
            seed_everything(seed + 7919 * state["step"], self.rank)

    def close(self) -> None:
        self.wait()
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def full_model_state(module: Any) -> dict[str, torch.Tensor]:
    """Collective: the whole model as a plain state dict of CPU tensors on rank 0 ({} elsewhere under
    FSDP). What model.pt holds: `torch.load("model.pt")` works on any machine, without orch."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {name: tensor.detach().cpu() for name, tensor in state.items() if isinstance(tensor, torch.Tensor)}


def read_model_state(path: Path) -> dict[str, torch.Tensor]:
    """The model of a checkpoint directory as a plain state dict of full tensors, read by one process
    without a process group (torch's dcp_to_torch_save: whatever world size and mode wrote it)."""
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as scratch:
        dcp_to_torch_save(str(path), str(Path(scratch) / "full.pt"))
        return torch.load(Path(scratch) / "full.pt", weights_only=True)["model"]


def _to_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _remove_quietly(path: Any) -> None:
    # the store may be what failed; the next start removes what is left
    with contextlib.suppress(Exception):
        storage.remove_tree(path)


def seed_everything(seed: int, rank: int) -> None:
    """Same model init on every rank (torch), distinct streams per rank afterwards are the caller's choice."""
    torch.manual_seed(seed + rank)
    random.seed(seed + rank)
    np.random.seed((seed + rank) % 2**32)
