"""A task that streams tar shards (WebDataset's layout: one `KEY.json` member per sample) and records, through
its loss function, the id of every sample it trains on: what the streaming tests count.

Each sample's target carries its id (`targets[:, 0]`) beside its class (`targets[:, 1]`), so the loss sees
which samples the trainer gave it. Records go to `record/rank-R-PID.txt`, one line per loss call (one
micro-batch). `crash_at`: the first attempt raises at that loss call (a file in `record` says it happened),
so `restart.policy: job` restarts every rank from the last checkpoint, as after a kill.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import torch
from torch import nn

from orchestrator.trainer.data import ShardedStream
from orchestrator.trainer.tasks import Task

FEATURES = 8


def write_shards(directory: Path, shards: int, per_shard: int) -> None:
    """shard-NNNN.tar, each with `per_shard` samples; sample ids run 0 .. shards x per_shard - 1."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    for shard in range(shards):
        with tarfile.open(directory / f"shard-{shard:04d}.tar", "w") as tar:
            for index in range(per_shard):
                sample_id = shard * per_shard + index
                x = torch.randn(FEATURES, generator=generator)
                body = json.dumps({"x": x.tolist(), "y": int(x.sum() > 0)}).encode()
                member = tarfile.TarInfo(f"{sample_id:06d}.json")
                member.size = len(body)
                tar.addfile(member, io.BytesIO(body))


def read_shard(path: str):
    """Samples of one tar shard in order, read as a stream (`r|`: no seeking, as from an object store)."""
    with tarfile.open(path, "r|") as tar:
        for member in tar:
            body = json.loads(tar.extractfile(member).read())  # type: ignore[union-attr]
            sample_id = int(member.name.split(".")[0])
            yield torch.tensor(body["x"]), torch.tensor([sample_id, body["y"]])


def make_task(directory: str, record: str, per_shard: int, buffer_size: int = 8, crash_at: int = -1) -> Task:
    shards = sorted(str(p) for p in Path(directory).glob("shard-*.tar"))
    calls = [0]
    rank = os.environ.get("RANK", "0")
    crashed = Path(record) / "crashed"

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if calls[0] == crash_at and not crashed.exists():
            crashed.touch()
            raise RuntimeError("a crash on purpose (the streaming resume test)")
        calls[0] += 1
        with open(Path(record) / f"rank-{rank}-{os.getpid()}.txt", "a") as out:
            out.write(" ".join(str(int(i)) for i in targets[:, 0]) + "\n")
        return nn.functional.cross_entropy(outputs, targets[:, 1])

    return Task(
        model=nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 2)),
        train_dataset=ShardedStream(  # type: ignore[arg-type]
            shards=tuple(shards), sizes=(per_shard,) * len(shards), read=read_shard, buffer_size=buffer_size
        ),
        loss_fn=loss_fn,
    )


def iterable_task() -> Task:
    """A plain IterableDataset as the training set: what orch cannot split or resume, so it refuses it."""

    class Numbers(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):
            return iter((torch.randn(FEATURES), torch.tensor([0, 0])) for _ in range(100))

    return Task(model=nn.Linear(FEATURES, 2), train_dataset=Numbers(), loss_fn=nn.functional.cross_entropy)
