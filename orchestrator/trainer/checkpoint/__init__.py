"""Distributed checkpoints (torch.distributed.checkpoint) that survive a kill at any moment: a checkpoint is
complete (its sha256 marker written last, after every rank's files) or it is ignored, resume takes the newest
that verifies, and one run at a time writes a directory.

- files.py: what a checkpoint is on disk or in an object store (names, the marker and its digests, `verify`),
  and the writes that make one appear whole (`finalize`, `write_atomic`);
- lock.py: the lock that keeps a second run out of a checkpoint directory;
- checkpointer.py: the Checkpointer (synchronous and async saves, rotation, resume) and the random states it
  saves, the model as model.pt holds it.

Callers use the names below.
"""

from orchestrator.trainer.checkpoint.checkpointer import (
    Checkpointer,
    Resumed,
    check_stores,
    full_model_state,
    rng_state,
    seed_everything,
    set_rng_state,
)
from orchestrator.trainer.checkpoint.files import (
    FORMAT,
    LEGACY_FORMAT,
    MARKER,
    TRAIN_STATE,
    CheckpointError,
    file_digest,
    legacy_path_for,
    list_checkpoints,
    newest_valid,
    path_for,
    read_model_state,
    verify,
    write_atomic,
)
from orchestrator.trainer.checkpoint.lock import lock_directory

__all__ = [
    "FORMAT",
    "LEGACY_FORMAT",
    "MARKER",
    "TRAIN_STATE",
    "CheckpointError",
    "Checkpointer",
    "Resumed",
    "check_stores",
    "file_digest",
    "full_model_state",
    "legacy_path_for",
    "list_checkpoints",
    "lock_directory",
    "newest_valid",
    "path_for",
    "read_model_state",
    "rng_state",
    "seed_everything",
    "set_rng_state",
    "verify",
    "write_atomic",
]
