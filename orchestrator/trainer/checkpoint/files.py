"""What a checkpoint is on disk (or in an object store): its names, its completion marker and digests, how
one is verified, and the writes that make it appear whole.

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
versions hold sizes only: those files are checked by size). A checkpoint written again at the same step
replaces the old one only once it is complete itself (`finalize`).

An async save's ranks leave the digests of what each wrote in `.orch-digests/RANK.json` inside the
checkpoint (`write_digests`); rank 0 merges them (`collect_digests`) and removes the folder before it writes
the marker.

On an object store (`output.url`, `orch run --out s3://...`, a `checkpoint.dir` URL) there is no rename:
every rank writes its part straight into `step-00000120/` and rank 0 writes the marker last, once every
rank's objects are there, so the marker's presence (and its listing) is what makes a checkpoint complete. A
prefix without a marker is a write that was killed, removed at the next start as a `.tmp` is on disk. The
directory is a `pathlib.Path` or a `upath.UPath` (orchestrator/storage.py): the same code reads both.

Single-file checkpoints of earlier versions (`step-00000120.pt`, format orch-checkpoint/1) still resume:
`verify` accepts them, and the Checkpointer loads them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from orchestrator import storage


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or no checkpoint could be resumed from; the message says why."""


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
        path.write_bytes(to_bytes(state))
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


def write_file(path: Path, data: bytes) -> None:
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


def hash_files(directory: Path, names: list[str]) -> dict[str, dict[str, Any]]:
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


def write_digests(tmp: Path, rank: int, hashed: dict[str, dict[str, Any]]) -> None:
    """Async saves, ranks other than 0: the digests of what this rank wrote, for rank 0 to merge. Appears
    whole (renamed into place; one PUT on an object store): rank 0 counts the files to know it has all."""
    data = json.dumps(hashed).encode()
    folder = tmp / DIGESTS
    if storage.is_remote(tmp):
        (folder / f"{rank}.json").write_bytes(data)
        return
    folder.mkdir(exist_ok=True)
    part = folder / f".{rank}.json.part"
    write_file(part, data)
    os.rename(part, folder / f"{rank}.json")


def digest_files(tmp: Path) -> list[str]:
    return [name for name in _names_in(tmp / DIGESTS) if DIGEST_FILE.match(name)]


def collect_digests(tmp: Path) -> dict[str, dict[str, Any]]:
    """Rank 0: the other ranks' digests, read in parallel (an object store answers each GET in tens of
    milliseconds; hundreds of ranks would add up); their folder is removed, the marker does not list it."""
    from concurrent.futures import ThreadPoolExecutor

    folder = tmp / DIGESTS
    names = digest_files(tmp)
    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=16) as pool:
        parts = list(pool.map(lambda name: json.loads((folder / name).read_bytes()), names))
    storage.remove_tree(folder)
    return {name: entry for part in parts for name, entry in part.items()}


def finalize(
    tmp: Path, final: Path, *, step: int, world_size: int, mode: str, hashed: dict[str, dict[str, Any]]
) -> None:
    """Rank 0, once every rank's files are written and each rank has hashed its own (`hashed`, merged):
    list the directory, hash what no rank claimed (an empty file), write the marker, rename into place (on
    an object store `tmp` is `final` and the marker, written last, is what completes it)."""
    present = _plain_files(tmp)
    entries = {**hash_files(tmp, [name for name in present if name not in hashed]), **hashed}
    files = {name: entries[name] for name in sorted(entries)}
    marker = {"format": FORMAT, "step": step, "world_size": world_size, "parallel": mode, "files": files}
    write_file(tmp / MARKER, (json.dumps(marker, indent=1) + "\n").encode())
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


def describe_failure(error: BaseException, directory: Path) -> str:
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


def read_model_state(path: Path) -> dict[str, torch.Tensor]:
    """The model of a checkpoint directory as a plain state dict of full tensors, read by one process
    without a process group (torch's dcp_to_torch_save: whatever world size and mode wrote it)."""
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as scratch:
        dcp_to_torch_save(str(path), str(Path(scratch) / "full.pt"))
        return torch.load(Path(scratch) / "full.pt", weights_only=True)["model"]


def to_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def remove_quietly(path: Any) -> None:
    # the store may be what failed; the next start removes what is left
    with contextlib.suppress(Exception):
        storage.remove_tree(path)
