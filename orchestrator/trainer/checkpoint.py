"""Checkpoints that survive a kill at any moment.

Rank 0 writes `step-00000120.pt` after a barrier (every rank has finished the step): first to a hidden
temporary file in the same directory, then fsync, rename over the final name (atomic on POSIX) and fsync
of the directory, so a checkpoint file is either complete or absent. Only the newest `keep` are kept.
On start rank 0 loads the newest checkpoint that loads completely (torn or foreign files are skipped)
and broadcasts it, so other nodes need not share rank 0's volume.

A checkpoint holds the unwrapped model, optimizer, LR scheduler and GradScaler states, the step (which is
also the data position, see data.py), and the RNG states of every rank (CPU, CUDA, Python, NumPy).
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist

FORMAT = "orch-checkpoint/1"
NAME = re.compile(r"^step-(\d{8})\.pt$")


def path_for(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}.pt"


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoint files (temporaries excluded), newest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if NAME.match(p.name)]
    return sorted(found, key=lambda p: int(NAME.match(p.name).group(1)), reverse=True)  # type: ignore[union-attr]


def write_atomic(path: Path, state: dict[str, Any]) -> None:
    """torch.save to a temporary file, fsync, rename into place, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_newest(directory: Path) -> tuple[dict[str, Any], Path] | tuple[None, None]:
    """The newest checkpoint that loads and is ours; (None, None) when there is none."""
    for path in list_checkpoints(directory):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # a truncated or corrupt file: fall back to the previous one
            continue
        if isinstance(state, dict) and state.get("format") == FORMAT:
            return state, path
    return None, None


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


class Checkpointer:
    """Saves every `every_steps` and at the end, keeps `keep`, resumes from the newest valid one."""

    def __init__(self, directory: Path, *, every_steps: int, keep: int, rank: int, world_size: int) -> None:
        self.directory, self.every_steps, self.keep = directory, every_steps, keep
        self.rank, self.world_size = rank, world_size
        if rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            for leftover in directory.glob(".step-*.pt.tmp"):  # from a write that was killed
                leftover.unlink()

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Collective: every rank calls it (for the barrier and its RNG state); rank 0 writes."""
        dist.barrier()
        rng_states: list[Any] = [None] * self.world_size
        dist.all_gather_object(rng_states, rng_state())
        if self.rank == 0:
            write_atomic(
                path_for(self.directory, step),
                {**state, "format": FORMAT, "step": step, "world_size": self.world_size, "rng": rng_states},
            )
            for old in list_checkpoints(self.directory)[self.keep :]:
                old.unlink()
        # Nobody leaves before the file is in place: a rank killed right after this call must find it.
        dist.barrier()

    def load(self) -> tuple[dict[str, Any] | None, str | None]:
        """Rank 0 reads the newest valid checkpoint and sends it to every rank.

        Only rank 0's storage matters: in a multi-node job the other pods need not see its volume.
        """
        found: list[Any] = [None, None]
        if self.rank == 0:
            state, path = load_newest(self.directory)
            found = [state, str(path) if path else None]
        dist.broadcast_object_list(found, src=0)
        return found[0], found[1]

    def restore_rng(self, state: dict[str, Any], seed: int) -> None:
        """Each rank continues its own random streams; with a new world size, fresh streams per rank."""
        if state.get("world_size") == self.world_size:
            set_rng_state(state["rng"][self.rank])
        else:
            seed_everything(seed + 7919 * state["step"], self.rank)


def seed_everything(seed: int, rank: int) -> None:
    """Same model init on every rank (torch), distinct streams per rank afterwards are the caller's choice."""
    torch.manual_seed(seed + rank)
    random.seed(seed + rank)
    np.random.seed((seed + rank) % 2**32)
