"""The Checkpointer: saves every `every_steps` and at the end (synchronously or in the background), keeps
the newest `keep`, and resumes from the newest checkpoint that verifies.

Resume takes the newest checkpoint that verifies (the ranks share the hashing) and names each newer one it
skips, and why; rotation keeps the newest `keep` complete checkpoints, and removes one that is not complete
only once a newer complete one exists (until then it may be all a user has left).

Who hashes what at a save: each rank hashes the files it wrote itself (DCP names them `__{rank}_N.distcp`;
rank 0 also `.metadata` and train.pt), so each reads back about checkpoint / world size bytes, and rank 0
only merges the digests: a synchronous save gathers them (one all_gather_object); an async save is not
collective until the next save, so a rank whose write is done (seen at `poll`) puts its digests in the
checkpoint's digests folder, and rank 0 completes the checkpoint once every rank's file is there (a listing
of that folder per step).

On resume every rank reads its own part from the shared directory (DCP reshards: a checkpoint written by
4 ranks loads on 2, under DDP and FSDP alike); nothing is broadcast from rank 0. All ranks must therefore
see the same checkpoint directory: any local directory on one node, a shared volume across nodes. A
single-file checkpoint of an earlier version is read by every rank (memory-mapped), each taking its part of
the full state.

Loading a checkpoint outside orch: see docs/trainer.md ("Loading a checkpoint outside orch").
"""

from __future__ import annotations

import io
import random
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
from orchestrator.trainer.checkpoint import files, lock


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
        self._lease: storage.Lease | None = None
        refused: str | None = None
        if rank == 0 and self.remote:
            try:
                self._lease = lock.lease_prefix(directory)  # before anything under it is touched
            except files.CheckpointError as error:
                refused = str(error)
            else:
                for leftover in files.list_checkpoints(directory):  # writes that were killed: no marker
                    if leftover.is_dir() and not (leftover / files.MARKER).exists():
                        storage.remove_tree(leftover)
        elif rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            try:
                self._lock = lock.lock_directory(directory)  # before anything in it is touched
            except files.CheckpointError as error:
                refused = str(error)
            else:
                for leftover in directory.iterdir():  # from writes that were killed
                    if files.TMP.match(leftover.name):
                        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        if dist.is_initialized():  # nobody looks at the directory before it is clean (or refused)
            outcome: list[Any] = [None] * self.world_size
            dist.all_gather_object(outcome, refused)
            refused = outcome[0]
        if refused:
            raise files.CheckpointError(refused)

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
        final = files.path_for(self.directory, step)
        tmp = final if self.remote else self.directory / f".{final.name}.tmp"  # no rename on object stores
        # (with rank 0's word on its lease: a run presumed dead and taken over writes nothing more)
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, (rng_state(), self._lease_lost()))
        if gathered[0][1]:
            raise files.CheckpointError(f"checkpoint at step {step} not written: {gathered[0][1]}")
        rng_states = [state for state, _ in gathered]
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
                    files.write_file(tmp / files.TRAIN_STATE, files.to_bytes(extra))
                self._pending = _Write(future, tmp, final, step)
                return
            metadata = dcp.save(state, checkpoint_id=str(tmp))
            if self.rank == 0:
                files.write_file(tmp / files.TRAIN_STATE, files.to_bytes(extra))
            hashed = files.hash_files(
                tmp, files.files_written_by(metadata, self.rank)
            )  # this rank's part only
        except (Exception, CheckpointException) as caught:  # (DCP's is a BaseException)
            error = caught
        shares: list[Any] = [None] * self.world_size  # every rank's digests (None: it failed)
        dist.all_gather_object(shares, hashed)
        if self.rank == 0 and error is None and all(share is not None for share in shares):
            try:
                merged = {name: entry for share in shares for name, entry in share.items()}
                files.finalize(
                    tmp, final, step=step, world_size=self.world_size, mode=self.mode, hashed=merged
                )
                self._rotate()
            except (Exception, CheckpointException) as caught:
                error = caught
        self._agree(error, tmp, step)  # collective: every rank learns whether the save held

    def _agree(self, error: BaseException | None, tmp: Path, step: int) -> None:
        """Every rank ends the save the same way: complete, or failed with one clear message."""
        outcome: list[Any] = [None if error is None else files.describe_failure(error, self.directory)]
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
                self._fail(write.tmp, write.step, files.describe_failure(error, self.directory), error)
        if self.rank == 0 and (
            self.world_size == 1 or len(files.digest_files(write.tmp)) >= self.world_size - 1
        ):
            self._complete(write)

    def wait(self) -> None:
        """Async saves, collective (every rank calls it: at the next save and at the end): block until the
        write in flight is written and hashed on every rank, then rank 0 completes it."""
        if not self.async_save:
            return
        write = self._pending
        error = self._hash_own(write) if write is not None and write.hashed is None else None
        reason = None if error is None else files.describe_failure(error, self.directory)
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
            hashed = files.hash_files(write.tmp, files.files_written_by(write.future.result(), self.rank))
            if self.rank != 0:
                files.write_digests(write.tmp, self.rank, hashed)
        except (Exception, CheckpointException) as error:  # (DCP's is a BaseException)
            return error
        write.hashed = hashed
        return None

    def _complete(self, write: _Write) -> None:
        """Rank 0: every rank's part is written and hashed: merge the digests into the marker, put the
        checkpoint in place, rotate."""
        assert write.hashed is not None
        self._pending = None
        if lost := self._lease_lost():  # not completed: the prefix is another run's now
            raise files.CheckpointError(f"checkpoint at step {write.step} not completed: {lost}")
        try:
            hashed = {**files.collect_digests(write.tmp), **write.hashed}
            files.finalize(
                write.tmp, write.final, step=write.step, world_size=self.world_size, mode=self.mode,
                hashed=hashed,
            )  # fmt: skip
            self._rotate()
        except (Exception, CheckpointException) as error:
            self._fail(write.tmp, write.step, files.describe_failure(error, self.directory), error)

    def _fail(self, tmp: Path, step: int, reason: str, error: BaseException | None) -> NoReturn:
        """A save failed (synchronous or asynchronous): one message, and no half-written checkpoint left."""
        if self.rank == 0:
            files.remove_quietly(tmp)
        raise files.CheckpointError(
            f"checkpoint at step {step}: could not write {self.directory}: {reason}; {self._remedy} and run "
            "again: training resumes from the last complete checkpoint"
        ) from error

    def _rotate(self) -> None:
        """Keep the newest `keep` complete checkpoints (marker and sizes: hashing every kept checkpoint at
        every save would read them all again; resume verifies content). One that is not complete is not
        counted, and is removed only once a newer complete one exists (until then it may be all a user
        has left)."""
        kept = 0
        for path in files.list_checkpoints(self.directory):
            if files.verify(path, content=False) is not None:
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
        complete, invalid = files.newest_valid(self.directory, content=False)
        views: list[Any] = [None] * self.world_size
        dist.all_gather_object(views, (str(complete) if complete else None, invalid))
        chosen = [v[0] for v in views]
        if len(set(chosen)) > 1:
            blind = [rank for rank, c in enumerate(chosen) if c != chosen[0]]
            raise files.CheckpointError(
                f"ranks disagree on the newest checkpoint in {self.directory} (rank 0: {chosen[0]}, "
                f"ranks {blind}: other): every rank must see the same checkpoint directory; on more than "
                "one node, put train.checkpoint.dir on a volume every pod mounts"
            )
        skipped = dict(views[0][1])
        path = None
        for candidate in files.list_checkpoints(self.directory):
            if candidate.name in skipped:
                continue
            # Every rank hashes its share of the files; all agree on the outcome.
            mine = files.verify(candidate, share=(self.rank, self.world_size))
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
                raise files.CheckpointError(
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
            raise files.CheckpointError(
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
            io.BytesIO((path / files.TRAIN_STATE).read_bytes()), map_location="cpu", weights_only=True
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

    def _lease_lost(self) -> str | None:
        return self._lease.lost if self._lease is not None else None

    def close(self) -> None:
        self.wait()
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None


def full_model_state(module: Any) -> dict[str, torch.Tensor]:
    """Collective: the whole model as a plain state dict of CPU tensors on rank 0 ({} elsewhere under
    FSDP). What model.pt holds: `torch.load("model.pt")` works on any machine, without orch."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {name: tensor.detach().cpu() for name, tensor in state.items() if isinstance(tensor, torch.Tensor)}


def seed_everything(seed: int, rank: int) -> None:
    """Same model init on every rank (torch), distinct streams per rank afterwards are the caller's choice."""
    torch.manual_seed(seed + rank)
    random.seed(seed + rank)
    np.random.seed((seed + rank) % 2**32)
