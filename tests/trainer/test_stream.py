"""Streaming datasets (data.ShardedStream): shards split over ranks and DataLoader workers, a seeded shard
order and shuffle buffer, the global batch kept, exact resume. Sample ids are recorded through the task's
loss function (tests/trainer/stream_tasks.py) and counted."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch

from orchestrator.trainer.data import Layout, ShardedStream, _RankStream, stream_loader
from tests.trainer.conftest import job, orch_run, write_job
from tests.trainer.stream_tasks import write_shards

SHARDS, PER_SHARD = 6, 16  # 96 samples


def ids_stream(sizes=(16,) * 6, buffer_size=8) -> ShardedStream:
    """Shards of plain ids: shard k holds k*16 .. k*16+15 (no files needed for the layout tests)."""
    starts = [sum(sizes[:k]) for k in range(len(sizes))]

    def read(shard: str):
        k = int(shard)
        for i in range(sizes[k]):
            yield torch.tensor(starts[k] + i)

    return ShardedStream(shards=tuple(str(k) for k in range(len(sizes))), sizes=tuple(sizes), read=read,
                         buffer_size=buffer_size)  # fmt: skip


def read_ids(stream, layout, rank, start, end, workers=1) -> list[int]:
    """What one rank reads for steps [start, end), as the loader hands it out (logical workers in turn)."""
    if workers == 1:
        return [int(i) for batch in _RankStream(stream, layout, rank, start, end, 0) for i in batch]
    loader = stream_loader(stream, layout, rank=rank, start_step=start, end_step=end, num_workers=workers,
                           pin=False)  # fmt: skip
    return [int(i) for batch in loader for i in batch]


@pytest.mark.parametrize(("world", "micro"), [(1, 16), (2, 4), (4, 2)])
def test_every_sample_is_read_once_per_epoch_and_epochs_differ(world, micro):
    stream = ids_stream()
    layout = Layout(dataset_size=len(stream), batch_size=16, micro_batch_size=micro, world_size=world, seed=3)
    assert layout.steps_per_epoch == 6
    epochs = [
        sorted(i for rank in range(world) for i in read_ids(stream, layout, rank, 6 * e, 6 * (e + 1)))
        for e in range(2)
    ]
    assert epochs[0] == epochs[1] == list(range(96))
    first = [read_ids(stream, layout, 0, 6 * e, 6 * (e + 1)) for e in range(2)]
    assert first[0] != first[1]  # a new shard order and buffer shuffle each epoch


def test_the_dropped_tail_is_at_most_one_batch_and_changes_each_epoch():
    stream = ids_stream(sizes=(16, 16, 16, 16, 16, 20))  # 100 samples, batch 16: 4 dropped per epoch
    layout = Layout(dataset_size=len(stream), batch_size=16, micro_batch_size=4, world_size=2, seed=0)
    seen = [collections.Counter(i for r in range(2) for i in read_ids(stream, layout, r, 6 * e, 6 * e + 6))
            for e in range(3)]  # fmt: skip
    assert all(len(s) == 96 and max(s.values()) == 1 for s in seen)
    assert len({frozenset(set(range(100)) - set(s)) for s in seen}) > 1


@pytest.mark.parametrize("stop", [1, 4, 7, 9])
def test_resuming_at_a_step_continues_exactly(stop):
    stream = ids_stream()
    layout = Layout(dataset_size=len(stream), batch_size=16, micro_batch_size=4, world_size=2, seed=1)
    for rank in range(2):
        whole = read_ids(stream, layout, rank, 0, 12)
        assert read_ids(stream, layout, rank, 0, stop) + read_ids(stream, layout, rank, stop, 12) == whole


@pytest.mark.launch  # DataLoader worker processes
def test_dataloader_workers_split_the_rank_and_resume_exactly():
    stream = ids_stream()
    layout = Layout(dataset_size=len(stream), batch_size=16, micro_batch_size=2, world_size=2, seed=2)
    whole = [read_ids(stream, layout, rank, 0, 6, workers=3) for rank in range(2)]
    assert sorted(whole[0] + whole[1]) == list(range(96))
    for rank in range(2):  # a loader started at step 1 (worker 0 gets batch 4 first) reads the same samples
        resumed = read_ids(stream, layout, rank, 0, 1, workers=3) + read_ids(
            stream, layout, rank, 1, 6, workers=3
        )
        assert resumed == whole[rank]


def test_another_world_size_mid_epoch_reads_no_sample_more_than_twice_and_the_next_epoch_exactly():
    stream = ids_stream()
    two = Layout(dataset_size=96, batch_size=16, micro_batch_size=4, world_size=2, seed=4)
    one = Layout(dataset_size=96, batch_size=16, micro_batch_size=8, world_size=1, seed=4)
    before = [i for r in range(2) for i in read_ids(stream, two, r, 0, 3)]
    after = read_ids(stream, one, 0, 3, 6)
    counts = collections.Counter(before + after)
    assert sum(counts.values()) == 96 and max(counts.values()) <= 2
    assert sorted(read_ids(stream, one, 0, 6, 12)) == list(range(96))


def test_a_stream_shorter_than_its_sizes_say_is_a_clear_error():
    stream = ids_stream()
    short = ShardedStream(shards=stream.shards, sizes=(20,) * 6, read=stream.read)
    layout = Layout(dataset_size=len(short), batch_size=16, micro_batch_size=16, world_size=1, seed=0)
    with pytest.raises(ValueError, match="fewer samples than their sizes say"):
        read_ids(short, layout, 0, 0, 7)


def records(directory: Path) -> dict[str, list[list[int]]]:
    return {p.name: [[int(i) for i in line.split()] for line in p.read_text().splitlines()]
            for p in sorted(directory.glob("rank-*.txt"))}  # fmt: skip


def test_a_killed_streaming_run_resumes_and_sees_every_sample_of_the_epoch_once(tmp_path):
    """2 ranks x accumulation 2 on 6 tar shards; the first attempt dies in step 5 (after the step-4
    checkpoint), restart.policy job restarts both ranks, which resume from step 4. The samples the kept
    steps trained on (attempt 1's steps 1-4, attempt 2's steps 5-6) are the epoch's 96, each once."""
    shards, record = tmp_path / "shards", tmp_path / "record"
    write_shards(shards, SHARDS, PER_SHARD)
    record.mkdir()
    spec = job("stream", procs=2, task="tests.trainer.stream_tasks:make_task",
               task_args={"directory": str(shards), "record": str(record), "per_shard": PER_SHARD,
                          "crash_at": 5 * 2 + 1},
               batch_size=16, micro_batch_size=4, max_steps=6, checkpoint={"every_steps": 2, "keep": 5},
               num_workers=2)  # fmt: skip
    spec["restart"] = {"policy": "job", "max_restarts": 1}
    run = orch_run(write_job(tmp_path, spec), tmp_path / "out", timeout=400)
    assert run.returncode == 0, run.stderr
    assert "resumed from" in run.stdout and run.summary["resumed_from_step"] == 4
    assert (record / "crashed").exists()
    kept: list[int] = []
    for rank in (0, 1):
        attempts = [lines for name, lines in records(record).items() if name.startswith(f"rank-{rank}-")]
        assert len(attempts) == 2
        first, second = sorted(attempts, key=len, reverse=True)  # the first attempt ran 5 steps' calls
        kept += [i for line in first[: 4 * 2] for i in line]  # steps 1-4: in the step-4 checkpoint
        kept += [i for line in second for i in line]  # steps 5-6, after the resume
    assert sorted(kept) == list(range(SHARDS * PER_SHARD))


def test_an_iterable_dataset_that_is_not_a_sharded_stream_is_one_line(tmp_path):
    spec = job("iterable", task="tests.trainer.stream_tasks:iterable_task", task_args={}, max_steps=2)
    run = orch_run(write_job(tmp_path, spec), tmp_path / "out")
    assert run.returncode == 1
    assert "Task.train_dataset is an IterableDataset: give its shards as" in run.stderr
