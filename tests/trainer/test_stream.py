"""Streaming datasets (data.ShardedStream): shards split over ranks and DataLoader workers, a seeded shard
order and shuffle buffer, the global batch kept, exact resume. Sample ids are recorded through the task's
loss function (tests/trainer/stream_tasks.py) and counted."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch

from orchestrator.trainer import data
from orchestrator.trainer.data import (
    DataChanged,
    Layout,
    ShardedStream,
    StreamError,
    _RankStream,
    stream_loader,
)
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
    with pytest.raises(StreamError, match=r"^shard \d yielded 16 samples, its size says 20: "):
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

    # #33: a shard added since: the next run (1 process, the cheaper launch) refuses to resume on the step-6
    # checkpoint in one line (a shard more moves every range: samples read twice, others skipped, silently)
    write_shards(shards, SHARDS + 1, PER_SHARD)
    spec["restart"] = {"policy": "never"}  # (the refusal is permanent: a restart would refuse again)
    again = orch_run(write_job(tmp_path, spec), tmp_path / "out", "--procs", "1", "--steps", "8", timeout=300)
    assert again.returncode == 2  # the rank's own code: a refusal (exit_codes.REFUSED)
    line = again.stderr.splitlines()[0]
    assert line.startswith(
        "error: rank 0 failed (exit code 2): DataChanged: the checkpoint at step 6 was written for other training "
        "data: 96 samples in 6 shards then, 112 in 7 now; resuming would read some samples of this epoch twice and "
        "skip others. Restore the data the run started with, or start a new run (another output directory or "
        "prefix) (at orchestrator/trainer/data.py:"
    ) and line.endswith(f"; its output: {tmp_path / 'out' / 'logs' / 'rank-0.log'}")
    assert again.summary["steps"] == 6  # nothing trained, nothing written
    assert sorted(p.name for p in (tmp_path / "out" / "checkpoints").iterdir())[-1] == "step-00000006"


def test_an_iterable_dataset_that_is_not_a_sharded_stream_is_one_line(tmp_path):
    spec = job("iterable", task="tests.trainer.stream_tasks:iterable_task", task_args={}, max_steps=2)
    run = orch_run(write_job(tmp_path, spec), tmp_path / "out")
    assert run.returncode == 1
    assert "Task.train_dataset is an IterableDataset: give its shards as" in run.stderr


# --- hostile and unlucky streams (#33) -------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [(0, 20, 0, 30, 0, 46), (16, 16, 16, 16, 16, 16, 0), (0, 96)])
def test_empty_shards_are_never_read_and_a_resume_at_every_step_continues_exactly(sizes):
    """Shards of size 0 anywhere in the list: every sample once per epoch, and a resume at any step of two
    epochs reads what the uninterrupted run reads."""
    stream = ids_stream(sizes=sizes)
    layout = Layout(dataset_size=96, batch_size=16, micro_batch_size=4, world_size=2, seed=6)
    assert sorted(i for r in range(2) for i in read_ids(stream, layout, r, 0, 6)) == list(range(96))
    for rank in range(2):
        whole = read_ids(stream, layout, rank, 0, 13)
        for stop in range(14):
            assert read_ids(stream, layout, rank, 0, stop) + read_ids(stream, layout, rank, stop, 13) == whole


def recounted(sizes_said, sizes_held) -> ShardedStream:
    """A stream whose shards hold `sizes_held` samples while it says `sizes_said`: shards rewritten after
    their sizes were counted (ids of shard k start at 100 k, so a sample says which shard it came from)."""

    def read(shard: str):
        k = int(shard)
        yield from (torch.tensor(100 * k + i) for i in range(sizes_held[k]))

    return ShardedStream(shards=tuple(str(k) for k in range(len(sizes_said))), sizes=tuple(sizes_said), read=read,
                         buffer_size=4)  # fmt: skip


@pytest.mark.parametrize(
    ("held", "message"),
    [
        ((16, 16, 12, 16, 16, 16), "shard 2 yielded 12 samples, its size says 16: the shard changed since its size was counted, or ShardedStream.sizes is wrong"),
        ((16, 16, 20, 16, 16, 16), "shard 2 holds more samples than its size says (16): the shard changed since its size was counted, or ShardedStream.sizes is wrong"),
    ],
)  # fmt: skip
def test_a_shard_that_holds_another_number_of_samples_than_its_size_is_an_error_naming_it(held, message):
    """#33: a shard in the middle that yields fewer (or more) samples than its size made the range that read it
    take the next shard's first samples (or leave its own last ones), which the next range reads too: samples
    trained twice or never, without a word (only a shortfall at the very end of an epoch was noticed)."""
    stream = recounted((16,) * 6, held)
    layout = Layout(dataset_size=96, batch_size=16, micro_batch_size=4, world_size=2, seed=0)
    with pytest.raises(StreamError) as caught:
        [read_ids(stream, layout, rank, 0, 6) for rank in range(2)]
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shards": ("a", "b", "a"), "sizes": (4, 4, 4)}, "ShardedStream lists shard a more than once: each shard once"),
        ({"shards": ("a", "b"), "sizes": (4,)}, "ShardedStream needs one size per shard, and at least one shard (2 shards, 1 sizes)"),
        ({"shards": ("a", "b"), "sizes": (4, 2.5)}, "ShardedStream.sizes must be ints >= 0 (each shard's number of samples)"),
        ({"shards": ("a", "b"), "sizes": (4, True)}, "ShardedStream.sizes must be ints >= 0 (each shard's number of samples)"),
        ({"shards": ("a", "b"), "sizes": (4, -1)}, "ShardedStream.sizes must be ints >= 0 (each shard's number of samples)"),
        ({"shards": ("a", ""), "sizes": (4, 4)}, "ShardedStream.shards must be non-empty strings (paths or URLs)"),
        ({"shards": ("a", "b"), "sizes": (0, 0)}, "ShardedStream: its 2 shards hold no samples (every size is 0)"),
        ({"shards": ("a",), "sizes": (4,), "buffer_size": 0}, "ShardedStream.buffer_size must be an int >= 1"),
    ],
)  # fmt: skip
def test_a_stream_that_cannot_be_read_as_it_says_is_refused_in_one_line(kwargs, message):
    """#33: a shard listed twice was read twice an epoch without a word; a float size failed deep in a worker."""
    with pytest.raises(StreamError) as caught:
        ShardedStream(read=lambda shard: iter(()), **kwargs)
    assert str(caught.value) == message


def test_numpy_sizes_are_counts_and_give_the_same_fingerprint():
    import numpy as np

    stream = ids_stream()
    as_numpy = ShardedStream(shards=stream.shards, sizes=tuple(np.array(stream.sizes)), read=stream.read)
    assert as_numpy.fingerprint() == stream.fingerprint()


def test_a_shard_that_cannot_be_read_is_one_line_naming_it():
    """A shard deleted since the listing: the reader's own error, in one line, with the shard's name."""

    def read(shard: str):
        if shard == "3":
            raise FileNotFoundError(2, "No such file or directory", "/data/shard-3.tar")
        yield from (torch.tensor(i) for i in range(16))

    stream = ShardedStream(shards=tuple("012345"), sizes=(16,) * 6, read=read)
    layout = Layout(dataset_size=96, batch_size=16, micro_batch_size=16, world_size=1, seed=0)
    with pytest.raises(StreamError) as caught:
        read_ids(stream, layout, 0, 0, 6)
    assert str(caught.value) == (
        "shard 3 could not be read: FileNotFoundError: [Errno 2] No such file or directory: '/data/shard-3.tar'"
    )


@pytest.mark.launch  # DataLoader worker processes
def test_an_error_in_a_dataloader_worker_stays_one_line():
    """torch makes a worker's exception again in the trainer from its traceback's text ("Caught StreamError in
    DataLoader worker process 1 ... Original Traceback ..."): the trainer's `error:` line keeps the last line."""
    stream = recounted((16,) * 6, (16, 16, 12, 16, 16, 16))
    layout = Layout(dataset_size=96, batch_size=16, micro_batch_size=2, world_size=1, seed=0)
    with pytest.raises(StreamError) as caught:
        read_ids(stream, layout, 0, 0, 6, workers=2)
    assert str(caught.value) == (
        "shard 2 yielded 12 samples, its size says 16: the shard changed since its size was counted, or "
        "ShardedStream.sizes is wrong"
    )


STREAM_RECORD = {"samples": 96, "batch_size": 16, "seed": 0, "world_size": 2, "num_workers": 2, "shards": 6,
                 "fingerprint": ids_stream().fingerprint(), "buffer_size": 8}  # fmt: skip
OTHER_DATA = (
    "the checkpoint at step 4 was written for other training data: {}; resuming would read some samples of this "
    "epoch twice and skip others. Restore the data the run started with, or start a new run (another output "
    "directory or prefix)"
)


@pytest.mark.parametrize(
    ("now", "step", "refused"),
    [
        (ids_stream(sizes=(16,) * 7), 4, "96 samples in 6 shards then, 112 in 7 now"),  # a shard added
        (ids_stream(sizes=(16, 16, 16, 16, 16, 8, 8)), 4, "96 samples in 6 shards then, 96 in 7 now"),
        (ids_stream(sizes=(16, 16, 16, 16, 8, 24)), 4, "6 shards of 96 samples as then, but their names or sizes differ"),
        (ids_stream(sizes=(16,) * 7), 6, "96 samples in 6 shards then, 112 in 7 now"),  # at an epoch's start too
    ],
)  # fmt: skip
def test_a_resume_on_other_shards_is_refused_in_one_line(now, step, refused):
    """#33: the checkpoint records the shards' names and sizes (a sha256) and their count; a resume on other
    shards would map its step to other samples: some of the epoch read twice, some never, silently."""
    layout = Layout(dataset_size=len(now), batch_size=16, micro_batch_size=4, world_size=2, seed=0)
    with pytest.raises(DataChanged) as caught:
        data.resume_check(STREAM_RECORD, data.record(layout, now, num_workers=2), step=step)
    assert str(caught.value) == OTHER_DATA.format(refused).replace("step 4", f"step {step}")


def test_a_resume_on_a_map_style_set_of_another_size_is_refused():
    saved = {**STREAM_RECORD, "samples": 256}
    saved = {k: v for k, v in saved.items() if k not in ("shards", "fingerprint", "buffer_size")}
    layout = Layout(dataset_size=300, batch_size=16, micro_batch_size=4, world_size=2, seed=0)
    with pytest.raises(DataChanged) as caught:
        data.resume_check(saved, data.record(layout, None, num_workers=2), step=4)
    assert str(caught.value) == OTHER_DATA.format("256 samples then, 300 now")


@pytest.mark.parametrize(
    ("change", "step", "warning"),
    [
        ({"world_size": 1, "micro": 8}, 4, "world_size 2, now world_size 1"),
        ({"num_workers": 3}, 4, "num_workers 2, now num_workers 3"),
        ({"buffer_size": 4}, 3, "buffer_size 8, now buffer_size 4"),  # the shuffle would not replay
        ({"seed": 1}, 5, "seed 0, now seed 1"),
        (
            {"world_size": 1, "micro": 8},
            6,
            None,
        ),  # at an epoch's start: the next epoch reads each sample once
        ({}, 4, None),
    ],
)
def test_another_split_or_order_mid_epoch_is_said_and_at_an_epoch_start_needs_no_word(change, step, warning):
    stream = ids_stream(buffer_size=change.get("buffer_size", 8))
    layout = Layout(dataset_size=96, batch_size=16, micro_batch_size=change.get("micro", 4),
                    world_size=change.get("world_size", 2), seed=change.get("seed", 0))  # fmt: skip
    note = data.resume_check(
        STREAM_RECORD, data.record(layout, stream, change.get("num_workers", 2)), step=step
    )
    assert note == (
        None
        if warning is None
        else f"warning: the checkpoint at step {step} was written with {warning}: until the "
        "next epoch some samples may be read twice and others not at all (docs/tasks.md, Streaming datasets)"
    )


def test_a_checkpoint_before_the_data_record_is_compared_on_its_split_only():
    """train.pt of earlier versions: world_size and num_workers at its top level, nothing about the shards."""
    layout = Layout(dataset_size=112, batch_size=16, micro_batch_size=4, world_size=2, seed=0)
    now = data.record(layout, ids_stream(sizes=(16,) * 7), num_workers=2)
    assert data.resume_check({"world_size": 2, "num_workers": 2}, now, step=3) is None
    assert data.resume_check({"world_size": 4, "num_workers": 2}, now, step=3) == (
        "warning: the checkpoint at step 3 was written with world_size 4, now world_size 2: until the next epoch "
        "some samples may be read twice and others not at all (docs/tasks.md, Streaming datasets)"
    )


def test_a_reader_error_names_the_shard_without_the_stores_secrets(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMIsecret")

    def read(shard: str):
        raise OSError(f"GET https://u:hunter22@store/{shard}?X failed, signed with wJalrXUtnFEMIsecret")
        yield

    stream = ShardedStream(shards=("a",), sizes=(16,), read=read)
    layout = Layout(dataset_size=16, batch_size=16, micro_batch_size=16, world_size=1, seed=0)
    with pytest.raises(StreamError) as caught:
        read_ids(stream, layout, 0, 0, 1)
    assert (
        str(caught.value)
        == "shard a could not be read: OSError: GET https://u:***@store/a?X failed, signed with ***"
    )
