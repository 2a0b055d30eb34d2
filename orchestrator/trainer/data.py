"""Which samples each process reads: the global batch is fixed, only its split changes.

Optimizer step t (counted from 0 over the whole run) uses the samples at positions [t*B, (t+1)*B) of the
permutation of epoch e = t // steps_per_epoch, a permutation seeded by (seed, e) alone: the same on every
rank and for every world size (DistributedSampler's `set_epoch` idea, made a pure function of the step).
That batch of B = accumulation x world x micro samples is cut into micro-batches; rank r reads micro-batch
m * world + r at micro-step m. DDP averages gradients over ranks and each micro-loss is divided by the
accumulation, so the gradient is the mean over the same B samples whatever the world size.

The last partial batch of an epoch (len % B samples) is dropped: padding would repeat samples and weigh
them twice. A different tail is dropped each epoch because the permutation changes.
Resuming at step t needs nothing but t: the data position is the step.

The permutation is never materialised: position i of epoch e's order is `Permutation(size, key).at(i)`,
a seeded bijection of [0, size) computed per index (a Feistel network on the next even power of two,
cycle-walking past `size`). A step costs O(B) time and memory whatever the dataset's size (10^9 samples
included: see benchmarks/data_order.py); torch.randperm(size) cost 8 bytes per sample and most of the time
of the first step. Checkpoints of earlier versions (no `data_order` in train.pt) keep their randperm order
when they resume (`ORDER_RANDPERM`), so a run in flight sees every sample of its epoch exactly once.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import numbers
import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler


@dataclass(frozen=True)
class Layout:
    """How one optimizer step's global batch is split over processes and micro-steps."""

    dataset_size: int
    batch_size: int
    micro_batch_size: int
    world_size: int
    seed: int
    order: str = "feistel/1"
    """How an epoch's order is computed: ORDER_FEISTEL (this version) or ORDER_RANDPERM (checkpoints of
    earlier versions, which resume with the order they started with)."""

    def __post_init__(self) -> None:
        if self.batch_size % (self.micro_batch_size * self.world_size):
            raise ValueError(
                f"batch_size {self.batch_size} is not divisible by micro_batch_size {self.micro_batch_size}"
                f" x world size {self.world_size}"
            )
        if self.dataset_size < self.batch_size:
            raise ValueError(
                f"the training set has {self.dataset_size} samples, fewer than one batch "
                f"(batch_size {self.batch_size}); lower train.batch_size"
            )

    @property
    def accumulation(self) -> int:
        return self.batch_size // (self.micro_batch_size * self.world_size)

    @property
    def steps_per_epoch(self) -> int:
        return self.dataset_size // self.batch_size

    def global_batch(self, step: int) -> torch.Tensor:
        """Indices of the B samples of optimizer step `step`."""
        epoch, position = divmod(step, self.steps_per_epoch)
        start = position * self.batch_size
        if self.order == ORDER_RANDPERM:
            return _randperm(self.dataset_size, self.seed, epoch)[start : start + self.batch_size]
        return _feistel_batch(self.dataset_size, epoch_key(self.seed, epoch), start, self.batch_size)

    def micro_batch(self, step: int, micro_step: int, rank: int) -> list[int]:
        """Indices read by `rank` at micro-step `micro_step` of optimizer step `step`."""
        start = (micro_step * self.world_size + rank) * self.micro_batch_size
        return self.global_batch(step)[start : start + self.micro_batch_size].tolist()


ORDER_FEISTEL = "feistel/1"
ORDER_RANDPERM = "randperm"  # orch before the Feistel order: a materialised torch.randperm per epoch

FEISTEL_ROUNDS = 6  # 4 rounds already make a pseudo-random permutation (Luby-Rackoff); 6 for margin


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a fast, well-spread 64-bit hash (uint64 arithmetic wraps in numpy)."""
    values = values ^ (values >> np.uint64(30))
    values = values * np.uint64(0xBF58476D1CE4E5B9)
    values = values ^ (values >> np.uint64(27))
    values = values * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def epoch_key(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch) & (2**64 - 1)


class Permutation:
    """A seeded bijection of [0, size), evaluated per index in O(1) memory.

    A balanced Feistel network permutes [0, 4^h) (the smallest even power of two >= size); values that
    land at or past `size` are mapped again until they fall inside (cycle walking), which keeps it a
    bijection of [0, size). The domain is < 4 x size, so a position takes under 4 rounds of walking on
    average. Not cryptographic; it only has to look shuffled and be the same on every machine.
    """

    def __init__(self, size: int, key: int) -> None:
        if size < 1:
            raise ValueError("a permutation needs at least one element")
        self.size = size
        self.half_bits = max(1, ((size - 1).bit_length() + 1) // 2)
        self.half_mask = np.uint64((1 << self.half_bits) - 1)
        spread = (key * 0x9E3779B97F4A7C15) & (2**64 - 1)  # Python ints: no overflow warning
        self.round_keys = _mix(np.arange(FEISTEL_ROUNDS, dtype=np.uint64) + np.uint64(spread))

    def _encrypt(self, values: np.ndarray) -> np.ndarray:
        bits = np.uint64(self.half_bits)
        left, right = values >> bits, values & self.half_mask
        for round_key in self.round_keys:
            left, right = right, left ^ (_mix(right ^ round_key) & self.half_mask)
        return (left << bits) | right

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The permuted values (int64) at `positions` (uint64, each < size)."""
        values = self._encrypt(positions.astype(np.uint64))
        outside = values >= np.uint64(self.size)
        while outside.any():
            values[outside] = self._encrypt(values[outside])
            outside = values >= np.uint64(self.size)
        return values.astype(np.int64)


@lru_cache(maxsize=2)  # every micro-step of a step reads the same batch
def _feistel_batch(size: int, key: int, start: int, count: int) -> torch.Tensor:
    positions = np.arange(start, start + count, dtype=np.uint64)
    return torch.from_numpy(Permutation(size, key).at(positions))


@lru_cache(maxsize=2)
def _randperm(size: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


class MicroBatchSampler(Sampler[list[int]]):
    """Yields this rank's micro-batches for steps [start_step, end_step), accumulation per step."""

    def __init__(self, layout: Layout, rank: int, start_step: int, end_step: int) -> None:
        self.layout, self.rank, self.start_step, self.end_step = layout, rank, start_step, end_step

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start_step, self.end_step):
            for micro_step in range(self.layout.accumulation):
                yield self.layout.micro_batch(step, micro_step, self.rank)

    def __len__(self) -> int:
        return (self.end_step - self.start_step) * self.layout.accumulation


def train_loader(
    dataset: Dataset,
    layout: Layout,
    *,
    rank: int,
    start_step: int,
    end_step: int,
    num_workers: int,
    pin: bool,
) -> DataLoader:
    """A DataLoader over this rank's micro-batches; resuming just starts at a later step."""
    sampler = MicroBatchSampler(layout, rank, start_step, end_step)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin,
        persistent_workers=False,
    )


def eval_loader(dataset: Dataset, *, rank: int, world_size: int, batch_size: int) -> DataLoader:
    """Rank r evaluates samples r, r + world, ...: every sample exactly once over all ranks."""
    indices = list(range(rank, len(dataset), world_size))  # type: ignore[arg-type]
    return DataLoader(torch.utils.data.Subset(dataset, indices), batch_size=batch_size)


# --- streaming datasets ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardedStream:
    """A training set read as a stream of shards (tar/jsonl/parquet files, on disk or in an object store).

    `shards` names them, `sizes` gives each one's number of samples (what MosaicML Streaming's index and
    litdata's chunks record; count them when the shards are written), and `read(shard)` yields its samples
    in order, each `(inputs, targets)`. Set it as `Task.train_dataset`; orch decides who reads what.

    Epoch e: the shards in a seeded order (seed, e), concatenated, cut to the epoch's steps x batch_size
    samples (the rest, at most one batch, is dropped, a different tail each epoch), split into one
    contiguous range per rank and, inside it, per DataLoader worker; each worker's samples pass through a
    seeded shuffle buffer of `buffer_size` samples. Every sample is read once per epoch, by one worker.
    The data position is the step again: resuming at step t, each worker reads its range from the start and
    drops what it had delivered before t (the shuffle replays exactly), so the same world size and
    num_workers continue exactly where the run stopped.
    """

    shards: tuple[str, ...]
    sizes: tuple[int, ...]
    read: Any  # Callable[[str], Iterable[sample]]
    buffer_size: int = 1000

    def __post_init__(self) -> None:
        if len(self.shards) != len(self.sizes) or not self.shards:
            raise StreamError(
                f"ShardedStream needs one size per shard, and at least one shard "
                f"({len(self.shards)} shards, {len(self.sizes)} sizes)"
            )
        if not all(isinstance(shard, str) and shard for shard in self.shards):
            raise StreamError("ShardedStream.shards must be non-empty strings (paths or URLs)")
        twice = sorted({shard for shard in self.shards if self.shards.count(shard) > 1})
        if twice:  # its samples would be read twice an epoch
            raise StreamError(f"ShardedStream lists shard {twice[0]} more than once: each shard once")
        if not all(isinstance(size, numbers.Integral) and not isinstance(size, bool) and size >= 0
                   for size in self.sizes):  # (numpy's integers are Integral; a bool or a float is no count)  # fmt: skip
            raise StreamError("ShardedStream.sizes must be ints >= 0 (each shard's number of samples)")
        if type(self.buffer_size) is not int or self.buffer_size < 1:
            raise StreamError("ShardedStream.buffer_size must be an int >= 1")
        if not sum(self.sizes):
            raise StreamError(
                f"ShardedStream: its {len(self.shards)} shards hold no samples (every size is 0)"
            )

    def __len__(self) -> int:
        return sum(self.sizes)

    def fingerprint(self) -> str:
        """The sha256 of the shards' names and sizes, in order: what a checkpoint records, so that a resume
        notices shards added, removed, renamed or recounted. (A shard rewritten under the same name with as
        many samples is not seen: write new shards under new names.)"""
        listing = json.dumps(
            [list(self.shards), [int(n) for n in self.sizes]], separators=(",", ":")
        ).encode()
        return hashlib.sha256(listing).hexdigest()


class DataError(ValueError):
    """The training data is not what the run was told or started with; the message says which part (one
    line: the trainer prints it as `error: ...` and exits 2, as for a bad store: a retry will not fix it)."""

    def __init__(self, message: str) -> None:
        # Raised in a DataLoader worker, the exception is made again in the trainer from its traceback's text
        # (torch's ExceptionWrapper.reraise: "Caught X in DataLoader worker process 0 ... Original Traceback");
        # the line that matters is its last, after the class name.
        if message.startswith("Caught ") and "Original Traceback" in message:
            message = message.rstrip().splitlines()[-1].partition(": ")[2]
        super().__init__(message)


class StreamError(DataError):
    """A ShardedStream's shards do not read as its shards and sizes say (or it cannot describe them)."""


class DataChanged(DataError):
    """A resume found another training set than its checkpoint's (another size, other shards)."""


def _shard_order(stream: ShardedStream, seed: int, epoch: int) -> list[int]:
    return (
        Permutation(len(stream.shards), epoch_key(seed, epoch) ^ 0x5EED)
        .at(np.arange(len(stream.shards), dtype=np.uint64))
        .tolist()
    )


def _read_range(stream: ShardedStream, order: list[int], start: int, count: int) -> Iterator[Any]:
    """Samples [start, start + count) of the epoch's concatenation of shards (in `order`).

    A shard is read for `size` samples at most, and one that yields fewer than the range needs, or more
    than its size where the range goes on past it, is an error naming it: taking the next shard's samples
    (or leaving some out) would shift every later range, so that other ranks and workers read the same
    samples twice and skip others, without a word."""
    offset = 0
    for index in order:
        size = stream.sizes[index]
        if count <= 0:
            return
        if offset + size <= start:
            offset += size
            continue
        skip = max(0, start - offset)
        wanted = min(size, skip + count)  # this range's last position in the shard, + 1
        shard = stream.shards[index]
        samples = iter(_reading(stream, shard))
        position = 0
        for position, sample in enumerate(itertools.islice(samples, wanted), start=1):
            if position > skip:  # a stream cannot seek: read past the part before this range
                yield sample
        if position < wanted:
            raise StreamError(
                f"shard {shard} yielded {position} samples, its size says {size}: the shard changed since "
                "its size was counted, or ShardedStream.sizes is wrong"
            )
        if wanted == size and count > size - skip and next(samples, _END) is not _END:
            raise StreamError(
                f"shard {shard} holds more samples than its size says ({size}): the shard changed since its "
                "size was counted, or ShardedStream.sizes is wrong"
            )
        count -= wanted - skip
        offset += size


_END = object()


def _reading(stream: ShardedStream, shard: str) -> Iterator[Any]:
    """`stream.read(shard)`, its failures (a shard gone, a store that does not answer) one line naming it."""
    try:
        yield from stream.read(shard)
    except DataError:
        raise
    except Exception as error:
        from orchestrator.storage import scrubbed

        reason = scrubbed(" ".join(str(error).split())[:300]) or type(error).__name__
        raise StreamError(f"shard {shard} could not be read: {type(error).__name__}: {reason}") from error


def _shuffled(samples: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """A bounded shuffle buffer (WebDataset's and tf.data's): memory of `size` samples, seeded."""
    buffer: list[Any] = []
    for sample in samples:
        if len(buffer) < size:
            buffer.append(sample)
            continue
        slot = rng.randrange(size)
        buffer[slot], sample = sample, buffer[slot]
        yield sample
    rng.shuffle(buffer)
    yield from buffer


class _RankStream(torch.utils.data.IterableDataset):
    """This rank's micro-batches of steps [start_step, end_step), already batched: each DataLoader worker
    yields whole micro-batches, and the loader takes them round-robin (worker 0, 1, ...)."""

    def __init__(self, stream: ShardedStream, layout: Layout, rank: int, start_step: int, end_step: int,
                 workers: int) -> None:  # fmt: skip
        self.stream, self.layout, self.rank = stream, layout, rank
        self.start_step, self.end_step, self.workers = start_step, end_step, max(1, workers)

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        physical = info.id if info is not None else 0
        layout, micro, workers = self.layout, self.layout.micro_batch_size, self.workers
        per_epoch = layout.steps_per_epoch * layout.accumulation  # this rank's micro-batches per epoch
        first, last = self.start_step * layout.accumulation, self.end_step * layout.accumulation
        # The loader hands its j-th batch to worker j % workers; batch `first + j` of the run belongs to
        # logical worker (first + j) % workers, so a resumed loader reads the same ranges as the first one.
        logical = (physical + first) % workers
        for epoch in range(first // per_epoch, (last - 1) // per_epoch + 1 if last > first else 0):
            begin = epoch * per_epoch
            mine = [b for b in range(begin, begin + per_epoch) if b % workers == logical]
            counts = [
                sum(1 for b in range(begin, begin + per_epoch) if b % workers == w) for w in range(workers)
            ]
            rank_start = self.rank * per_epoch * micro
            chunk_start = rank_start + sum(counts[:logical]) * micro
            rng = random.Random(epoch_key(layout.seed, epoch) * 1_000_003 + self.rank * 1009 + logical)
            samples = _shuffled(
                _read_range(self.stream, _shard_order(self.stream, layout.seed, epoch), chunk_start,
                            counts[logical] * micro),
                self.stream.buffer_size, rng,
            )  # fmt: skip
            for batch in mine:
                items = list(itertools.islice(samples, micro))
                if len(items) < micro:
                    raise StreamError(
                        f"the stream's shards yielded fewer samples than their sizes say (epoch {epoch}); "
                        "check ShardedStream.sizes"
                    )
                if first <= batch < last:
                    yield torch.utils.data.default_collate(items)


def stream_loader(
    stream: ShardedStream, layout: Layout, *, rank: int, start_step: int, end_step: int, num_workers: int,
    pin: bool,
) -> DataLoader:  # fmt: skip
    """A DataLoader over this rank's micro-batches of a ShardedStream; resuming starts at a later step."""
    return DataLoader(
        _RankStream(stream, layout, rank, start_step, end_step, num_workers),
        batch_size=None,  # the workers batch
        num_workers=num_workers,
        pin_memory=pin,
    )


# --- what a resume compares ---------------------------------------------------------------------------------

SPLIT = ("world_size", "num_workers", "buffer_size")  # how a stream is cut over ranks, workers, the shuffle
ORDER = ("batch_size", "seed")  # the step -> samples mapping of either kind of training set


def record(layout: Layout, stream: ShardedStream | None, num_workers: int) -> dict[str, Any]:
    """What the run's sample order depends on, for its checkpoints (train.pt's `data`): `resume_check`
    compares it with the resumed run's."""
    saved: dict[str, Any] = {
        "samples": layout.dataset_size, "batch_size": layout.batch_size, "seed": layout.seed,
        "world_size": layout.world_size, "num_workers": num_workers,
    }  # fmt: skip
    if stream is not None:
        saved |= {
            "shards": len(stream.shards),
            "fingerprint": stream.fingerprint(),
            "buffer_size": stream.buffer_size,
        }
    return saved


def resume_check(saved: dict[str, Any], now: dict[str, Any], *, step: int) -> str | None:
    """Raises DataChanged when the training set is not the checkpoint's (another number of samples; for a
    stream, shards added, removed, renamed or recounted): resuming would read some samples of the epoch twice
    and skip others, and the run would go on as if it had not. Returns a warning when only the split or the
    order changed in the middle of an epoch (another world size, num_workers, buffer, batch size or seed): that
    epoch may read some samples twice and others not at all, the next ones read each once. A checkpoint that
    predates a field (its `saved` lacks it) is not compared on it."""

    def changed(key: str) -> bool:
        return saved.get(key) is not None and saved[key] != now.get(key)

    if changed("samples") or changed("fingerprint") or changed("shards"):
        if "fingerprint" not in now or "fingerprint" not in saved:
            told = f"{saved.get('samples')} samples then, {now['samples']} now"
        elif (saved.get("samples"), saved.get("shards")) == (now["samples"], now["shards"]):
            told = (
                f"{now['shards']} shards of {now['samples']} samples as then, but their names or sizes differ"
            )
        else:
            told = f"{saved.get('samples')} samples in {saved.get('shards')} shards then, {now['samples']} in {now['shards']} now"
        raise DataChanged(
            f"the checkpoint at step {step} was written for other training data: {told}; resuming would read "
            "some samples of this epoch twice and skip others. Restore the data the run started with, or start "
            "a new run (another output directory or prefix)"
        )
    keys = (*SPLIT, *ORDER) if "fingerprint" in now else ORDER
    moved = [key for key in keys if changed(key)]
    old_epoch = saved.get("samples", now["samples"]) // saved.get("batch_size", now["batch_size"])
    new_epoch = now["samples"] // now["batch_size"]
    if not moved or (step % old_epoch == 0 and step % new_epoch == 0):
        return None  # at an epoch's start: the next epoch reads each sample once in the new order
    was = ", ".join(f"{key} {saved[key]}" for key in moved)
    is_now = ", ".join(f"{key} {now[key]}" for key in moved)
    return (
        f"warning: the checkpoint at step {step} was written with {was}, now {is_now}: until the next epoch some "
        "samples may be read twice and others not at all (docs/tasks.md, Streaming datasets)"
    )
