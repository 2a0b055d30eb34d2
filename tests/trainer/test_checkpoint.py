"""Distributed checkpoints: atomic directories, verification, rotation, a kill during a save, a full disk,
legacy single-file checkpoints, async saves, RNG states.

A real gloo process group of one (the multi-rank and resharding cases run through `orch run` in
test_fsdp.py); the full disk is a real tmpfs of a few kilobytes (needs mount rights: skipped otherwise).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from orchestrator import storage
from orchestrator.trainer import checkpoint, parallel
from orchestrator.trainer.checkpoint import files as checkpoint_files

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def group(tmp_path_factory):
    store = tmp_path_factory.mktemp("store") / "store"  # not in tmp_path, whose listing the tests check
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def trained(seed: int = 0, mode: str = "ddp", width: int = 8):
    """A wrapped model and an AdamW that has taken one step (so it has state)."""
    torch.manual_seed(seed)
    module = nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 2))
    wrapped = parallel.wrap(module, mode=mode, device=torch.device("cpu"), world_size=1)
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1)
    wrapped.model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return module, optimizer


def checkpointer(directory: Path, keep: int = 2, **kwargs) -> checkpoint.Checkpointer:
    return checkpoint.Checkpointer(directory, every_steps=10, keep=keep, rank=0, world_size=1, **kwargs)


TRAIN_STATE = {"scheduler": {"plateau": {}}, "scaler": {}, "counters": {"skipped_steps": 0, "last_loss": 1.5}}


def full_state(module) -> dict:
    return {k: v.clone() for k, v in checkpoint.full_model_state(module).items()}


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_save_then_load_restores_model_optimizer_and_state(tmp_path, group, mode):
    module, optimizer = trained(0, mode)
    saver = checkpointer(tmp_path, mode=mode)
    saver.save(10, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    path = checkpoint.path_for(tmp_path, 10)
    assert sorted(p.name for p in path.iterdir()) == [
        ".metadata", "__0_0.distcp", checkpoint.MARKER, checkpoint.TRAIN_STATE,
    ]  # fmt: skip
    marker = json.loads((path / checkpoint.MARKER).read_text())
    assert (marker["format"], marker["step"], marker["world_size"], marker["parallel"]) == (
        checkpoint.FORMAT, 10, 1, mode,
    )  # fmt: skip
    other, other_optimizer = trained(1, mode)  # different weights and optimizer state
    resumed = checkpointer(tmp_path).load(module=other, optimizer=other_optimizer)
    assert resumed is not None and resumed.step == 10 and resumed.path == path
    assert resumed.state["counters"] == TRAIN_STATE["counters"] and resumed.state["parallel"] == mode
    expected, got = full_state(module), full_state(other)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    a, b = get_optimizer_state_dict(module, optimizer), get_optimizer_state_dict(other, other_optimizer)
    for fqn, state in a["state"].items():
        for key, value in state.items():
            assert torch.equal(_local(value), _local(b["state"][fqn][key])), (fqn, key)


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def test_a_junk_newest_checkpoint_is_neither_loaded_nor_counted(tmp_path, group):
    module, optimizer = trained()
    saver = checkpointer(tmp_path, keep=1)
    saver.save(10, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    # Newer than the valid one: a directory without a marker, a marker that lists a file cut short,
    # and a legacy file that is not ours.
    (tmp_path / "step-00000030").mkdir()
    shutil.copytree(checkpoint.path_for(tmp_path, 10), checkpoint.path_for(tmp_path, 40))
    marker_40 = checkpoint.path_for(tmp_path, 40) / checkpoint.MARKER
    marker_40.write_text(marker_40.read_text().replace('"step": 10', '"step": 40'))
    with open(checkpoint.path_for(tmp_path, 40) / "__0_0.distcp", "r+b") as file:
        file.truncate(10)
    torch.save({"not": "ours"}, tmp_path / "step-00000050.pt")
    assert checkpoint.newest_valid(tmp_path) == (
        checkpoint.path_for(tmp_path, 10),
        {
            "step-00000050.pt": "not an orch checkpoint (orch-checkpoint/1)",
            "step-00000040": "__0_0.distcp has 10 bytes, "
            f"{(checkpoint.path_for(tmp_path, 10) / '__0_0.distcp').stat().st_size} were written",
            "step-00000030": "no orch-checkpoint.json (an incomplete write)",
        },
    )
    # keep: 1 and a save at step 20: step 10 goes (20 is the one kept), the junk stays where it is.
    saver.save(20, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000020", "step-00000030", "step-00000040", "step-00000050.pt",
    ]  # fmt: skip
    resumed = checkpointer(tmp_path).load(module=module, optimizer=optimizer)
    assert resumed.step == 20


def test_only_invalid_checkpoints_is_an_error_not_a_fresh_start(tmp_path, group):
    module, optimizer = trained()
    (tmp_path / "step-00000030").mkdir()
    (tmp_path / "step-00000010.pt").write_bytes(b"junk")
    with pytest.raises(checkpoint.CheckpointError) as caught:
        checkpointer(tmp_path).load(module=module, optimizer=optimizer)
    assert str(caught.value) == (
        f"no checkpoint in {tmp_path} can be resumed from (step-00000030: no orch-checkpoint.json "
        "(an incomplete write); step-00000010.pt: does not load (RuntimeError)); move them away to "
        "start from step 0"
    )


def test_no_checkpoint_directory_means_a_fresh_start(tmp_path, group):
    module, optimizer = trained()
    assert checkpointer(tmp_path / "missing").load(module=module, optimizer=optimizer) is None


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_a_legacy_single_file_checkpoint_still_resumes(tmp_path, group, mode):
    module, optimizer = trained(0)
    legacy = {
        "format": checkpoint.LEGACY_FORMAT,
        "step": 30,
        "world_size": 1,
        "rng": [checkpoint.rng_state()],
        "model": module.state_dict(),
        "optimizer": optimizer.state_dict(),
        **TRAIN_STATE,
    }  # fmt: skip  (what the previous version wrote)
    checkpoint.write_atomic(checkpoint.legacy_path_for(tmp_path, 30), legacy)
    other, other_optimizer = trained(1, mode)
    resumed = checkpointer(tmp_path).load(module=other, optimizer=other_optimizer)
    assert resumed.step == 30 and resumed.path == checkpoint.legacy_path_for(tmp_path, 30)
    for name, tensor in full_state(other).items():
        assert torch.equal(tensor, legacy["model"][name]), name
    # the optimizer continues from the saved moments: its state matches the file's, by parameter
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    state = get_optimizer_state_dict(other, other_optimizer, options=StateDictOptions(full_state_dict=True))
    names = [n for n, _ in module.named_parameters()]
    for index, saved in legacy["optimizer"]["state"].items():
        assert torch.equal(state["state"][names[index]]["exp_avg"], saved["exp_avg"])


def test_async_save_lands_complete(tmp_path, group):
    module, optimizer = trained()
    saver = checkpointer(tmp_path, async_save=True)
    saver.save(10, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    saver.close()  # waits for the write and puts it in place
    assert checkpoint.verify(checkpoint.path_for(tmp_path, 10)) is None
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_async_save_group_is_bounded_by_the_collective_timeout(tmp_path, group):
    """The async write's own group waits as long as train.collective_timeout says, not torch's 30 minutes
    (torch's new_group gives a group without a timeout `_get_default_timeout(backend)`, whatever the default
    group's is: torch/distributed/distributed_c10d.py, _new_group_with_tag). The timeout is read from the
    gloo backend's options, the value its collectives wait with (no public accessor in torch 2.13)."""
    saver = checkpointer(tmp_path, async_save=True, collective_timeout=timedelta(seconds=7))
    gloo = saver._group._get_backend(torch.device("cpu"))
    assert gloo.options._timeout == timedelta(seconds=7)
    saver.close()


KILL_SCRIPT = """
import sys, torch, torch.distributed as dist
sys.path.insert(0, {repo!r})
from pathlib import Path
from torch import nn
from orchestrator.trainer import checkpoint
d = Path({directory!r})
dist.init_process_group("gloo", init_method="file://" + {store!r}, rank=0, world_size=1)
saver = checkpoint.Checkpointer(d, every_steps=10, keep=5, rank=0, world_size=1)
small = nn.Linear(4, 4)
state = {{"scheduler": {{}}, "scaler": {{}}, "counters": {{}}}}
saver.save(10, module=small, optimizer=torch.optim.SGD(small.parameters(), lr=0.1), train_state=state)
print("first done", flush=True)
big = nn.Linear(4000, 20000)  # 320 MB: the write takes a while
saver.save(20, module=big, optimizer=torch.optim.SGD(big.parameters(), lr=0.1), train_state=state)
print("second done", flush=True)
"""


def test_a_kill_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    directory = tmp_path / "checkpoints"
    script = KILL_SCRIPT.format(repo=REPO_ROOT, directory=str(directory), store=str(tmp_path / "store"))
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "first done"
    tmp_dir = directory / ".step-00000020.tmp"
    deadline = time.monotonic() + 120
    while not (tmp_dir.is_dir() and any(p.stat().st_size > 0 for p in tmp_dir.iterdir())):
        assert time.monotonic() < deadline and process.poll() is None, "the write never started"
        time.sleep(0.001)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not checkpoint.path_for(directory, 20).exists(), "the write finished before the kill"
    assert checkpoint.newest_valid(directory) == (checkpoint.path_for(directory, 10), {})
    # The next run cleans the leftover up and resumes from step 10.
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store2", rank=0, world_size=1)
    try:
        small = nn.Linear(4, 4)
        resumed = checkpointer(directory).load(
            module=small, optimizer=torch.optim.SGD(small.parameters(), lr=0.1)
        )
        assert resumed.step == 10 and not tmp_dir.exists()
    finally:
        dist.destroy_process_group()


def test_a_full_disk_fails_the_save_clearly_and_leaves_no_tmp(tiny_disk, group):
    module, optimizer = trained()
    saver = checkpointer(tiny_disk / "checkpoints")
    saver.save(10, module=module, optimizer=optimizer, train_state=TRAIN_STATE)  # small: fits
    big, big_optimizer = trained(width=16384)  # ~ 450 KiB of parameters alone
    with pytest.raises(checkpoint.CheckpointError) as caught:
        saver.save(20, module=big, optimizer=big_optimizer, train_state=TRAIN_STATE)
    assert str(caught.value) == (
        f"checkpoint at step 20: could not write {tiny_disk / 'checkpoints'}: no space left on device; "
        "free space there (or point train.checkpoint.dir elsewhere) and run again: training resumes from "
        "the last complete checkpoint"
    )
    assert sorted(p.name for p in (tiny_disk / "checkpoints").iterdir()) == ["step-00000010"]
    assert checkpoint.verify(checkpoint.path_for(tiny_disk / "checkpoints", 10)) is None


def test_model_pt_holds_plain_cpu_tensors(tmp_path, group):
    module, _ = trained(mode="fsdp")
    checkpoint.write_atomic(tmp_path / "model.pt", checkpoint.full_model_state(module))
    loaded = torch.load(tmp_path / "model.pt", weights_only=True)
    assert {k: (type(v), v.device.type) for k, v in loaded.items()} == {
        k: (torch.Tensor, "cpu") for k in ("0.weight", "0.bias", "2.weight", "2.bias")
    }
    plain = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    plain.load_state_dict(loaded)  # loads into the task's plain model, no orch needed


def test_a_checkpoint_reads_back_as_a_plain_state_dict_in_one_process(tmp_path, group):
    module, optimizer = trained(mode="fsdp")
    checkpointer(tmp_path, mode="fsdp").save(10, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    plain = checkpoint.read_model_state(checkpoint.path_for(tmp_path, 10))  # what docs/trainer.md shows
    expected = full_state(module)
    assert plain.keys() == expected.keys()
    assert all(torch.equal(plain[k], expected[k]) for k in expected)


def test_rng_states_round_trip_through_a_checkpoint(tmp_path):
    import random

    import numpy as np

    checkpoint.write_atomic(tmp_path / "x.pt", {"rng": [checkpoint.rng_state()]})
    expected = (torch.rand(3), random.random(), np.random.rand())
    saved = torch.load(tmp_path / "x.pt", weights_only=True)["rng"][0]
    torch.rand(5), random.random(), np.random.rand()  # move every stream on
    checkpoint.set_rng_state(saved)
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(expected[0], again[0]) and expected[1:] == again[1:]


def _load_from_different_directories(rank: int, store: str, shared: str, alone: str, results: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    module = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    state = {"scheduler": {}, "scaler": {}, "counters": {}}
    kwargs = {"every_steps": 10, "keep": 2, "rank": rank, "world_size": 2}
    checkpoint.Checkpointer(Path(shared), **kwargs).save(
        10, module=module, optimizer=optimizer, train_state=state
    )
    # rank 1 looks elsewhere, as a pod would whose checkpoint directory is its own emptyDir
    directory = Path(shared if rank == 0 else alone)
    try:
        checkpoint.Checkpointer(directory, **kwargs).load(module=module, optimizer=optimizer)
        outcome = "loaded"
    except checkpoint.CheckpointError as error:
        outcome = str(error)
    Path(results, f"rank{rank}.txt").write_text(outcome)
    dist.destroy_process_group()
    os._exit(0)


def test_ranks_that_see_different_checkpoints_stop_with_a_message(tmp_path):
    import torch.multiprocessing as mp

    paths = [tmp_path / name for name in ("shared", "alone", "results")]
    paths[2].mkdir()
    mp.spawn(_load_from_different_directories, args=(str(tmp_path / "store"), *map(str, paths)), nprocs=2)
    outcomes = [(paths[2] / f"rank{r}.txt").read_text() for r in range(2)]
    tail = (
        f"(rank 0: {paths[0] / 'step-00000010'}, ranks [1]: other): every rank must see the same checkpoint "
        "directory; on more than one node, put train.checkpoint.dir on a volume every pod mounts"
    )
    # the same decision on both ranks (each names the directory it looked in): nobody trains on alone
    assert outcomes == [
        f"ranks disagree on the newest checkpoint in {paths[0]} {tail}",
        f"ranks disagree on the newest checkpoint in {paths[1]} {tail}",
    ]


# --- content verification, hand-edited markers, a checkpoint of another model (#25, class 7) ---------------


def _zero_at_same_size(path: Path) -> None:
    size = path.stat().st_size
    path.write_bytes(b"\0" * size)


def test_a_newest_shard_zeroed_at_the_same_size_is_skipped_by_name(tmp_path, group, capsys):
    module, optimizer = trained()
    saver = checkpointer(tmp_path, keep=3)
    saver.save(10, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    saver.save(20, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    marker = json.loads((checkpoint.path_for(tmp_path, 20) / checkpoint.MARKER).read_text())
    assert set(marker["files"]["__0_0.distcp"]) == {"size", "sha256"}
    _zero_at_same_size(checkpoint.path_for(tmp_path, 20) / "__0_0.distcp")
    resumed = checkpointer(tmp_path).load(module=module, optimizer=optimizer)
    assert resumed.step == 10
    assert capsys.readouterr().err == (
        f"warning: checkpoint {checkpoint.path_for(tmp_path, 20)} skipped: __0_0.distcp does not have the "
        "content that was written (its sha256 differs); kept until a newer checkpoint is complete\n"
    )
    assert checkpoint.path_for(tmp_path, 20).exists()  # kept: it may be all a user has
    # training goes on from 10 and writes step 20 again: the skipped one is replaced once the new is complete
    saver.save(20, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    assert checkpoint.verify(checkpoint.path_for(tmp_path, 20)) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000010", "step-00000020"]


def _save_recording_what_each_rank_hashes(
    rank: int, store: str, directory: str, results: str, async_save: bool
) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    hashed: list[str] = []
    real = checkpoint_files.file_digest

    def recording(stream):  # the one place checkpoint content is hashed: a local file or an fsspec file
        hashed.append(str(getattr(stream, "path", None) or stream.name).rsplit("/", 1)[-1])
        return real(stream)

    checkpoint_files.file_digest = recording  # where the checkpoint's files are hashed
    torch.manual_seed(0)  # the same model on both ranks; DCP spreads the replicated tensors over them
    module = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1)
    module(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    where = storage.location(directory)  # a local directory or an s3:// URL (test_object_store.py)
    saver = checkpoint.Checkpointer(
        where, every_steps=10, keep=2, rank=rank, world_size=2, async_save=async_save
    )
    saver.save(10, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    deadline = time.monotonic() + 120
    while async_save and not (checkpoint.path_for(where, 10) / checkpoint.MARKER).exists():
        saver.poll()  # as the training loop does every step: rank 0 completes it once rank 1 has hashed
        assert time.monotonic() < deadline, "the async checkpoint was never put in place by poll()"
        time.sleep(0.01)
    saver.close()
    Path(results, f"rank{rank}.json").write_text(json.dumps(hashed))
    dist.destroy_process_group()
    os._exit(0)


def each_rank_hashes_only_what_it_wrote(directory: str, tmp_path: Path, *, async_save: bool) -> None:
    """A 2-rank save into `directory`: each rank hashed its own files only, the marker holds them all."""
    import torch.multiprocessing as mp

    results = tmp_path / "results"
    results.mkdir()
    args = (str(tmp_path / "store"), directory, str(results), async_save)
    mp.spawn(_save_recording_what_each_rank_hashes, args=args, nprocs=2)
    hashed = [json.loads((results / f"rank{r}.json").read_text()) for r in range(2)]
    final = checkpoint.path_for(storage.location(directory), 10)
    written = set(json.loads((final / checkpoint.MARKER).read_text())["files"])
    assert sorted(p.name for p in final.iterdir()) == sorted({*written, checkpoint.MARKER})  # no digests
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "train.pt"} <= written
    assert sorted(hashed[1]) == sorted(name for name in written if name.startswith("__1_"))
    assert sorted(hashed[0]) == sorted(name for name in written if not name.startswith("__1_"))
    assert checkpoint.verify(final) is None
    _zero_at_same_size(final / "__1_0.distcp")  # rank 1's digest in the marker is the real one
    assert checkpoint.verify(final) == (
        "__1_0.distcp does not have the content that was written (its sha256 differs)"
    )


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_each_rank_hashes_only_the_files_it_wrote_and_rank_0_merges(tmp_path, async_save):
    """At scale rank 0 must not re-read the whole checkpoint at every save: each rank hashes its own part."""
    each_rank_hashes_only_what_it_wrote(str(tmp_path / "checkpoints"), tmp_path, async_save=async_save)


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda m: m.pop("files"), "orch-checkpoint.json lists no files"),
        (lambda m: m.update(files={}), "orch-checkpoint.json lists no files"),
        (lambda m: m.update(files=["__0_0.distcp"]), "orch-checkpoint.json lists no files"),
        (lambda m: m["files"].update({"__0_0.distcp": "12"}), "malformed entry for '__0_0.distcp'"),
        (lambda m: m["files"].update({"__0_0.distcp": {"size": "12"}}), "malformed entry for '__0_0.distcp'"),
        (lambda m: m["files"].pop(".metadata"), "does not list .metadata"),
        (lambda m: m.update(step="ten"), "names step 'ten'"),
        (lambda m: m["files"].update({"../x": {"size": 1, "sha256": "0"}}), "not a file of the checkpoint"),
    ],
)
def test_a_hand_edited_marker_is_not_complete_and_says_why(tmp_path, group, edit, reason):
    module, optimizer = trained()
    checkpointer(tmp_path).save(10, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    marker_file = checkpoint.path_for(tmp_path, 10) / checkpoint.MARKER
    marker = json.loads(marker_file.read_text())
    edit(marker)
    marker_file.write_text(json.dumps(marker))
    assert reason in checkpoint.verify(checkpoint.path_for(tmp_path, 10))
    with pytest.raises(checkpoint.CheckpointError, match="can be resumed from"):
        checkpointer(tmp_path).load(module=module, optimizer=optimizer)


def test_a_marker_of_an_earlier_version_with_sizes_only_still_resumes(tmp_path, group):
    module, optimizer = trained()
    checkpointer(tmp_path).save(10, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    marker_file = checkpoint.path_for(tmp_path, 10) / checkpoint.MARKER
    marker = json.loads(marker_file.read_text())
    marker["files"] = {name: entry["size"] for name, entry in marker["files"].items()}
    marker_file.write_text(json.dumps(marker))
    assert checkpointer(tmp_path).load(module=module, optimizer=optimizer).step == 10


def test_a_checkpoint_of_another_model_is_one_real_line(tmp_path, group):
    """DCP's CheckpointException is a BaseException: it used to pass the launcher's capture unrecorded."""
    module, optimizer = trained(width=8)
    checkpointer(tmp_path).save(10, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    other, other_optimizer = trained(width=16)
    with pytest.raises(checkpoint.CheckpointError) as caught:
        checkpointer(tmp_path).load(module=other, optimizer=other_optimizer)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"cannot resume from {checkpoint.path_for(tmp_path, 10)}: ")
    assert "on rank 0: " in message and "size" in message.lower(), message


# --- one run per checkpoint directory (#25, class 10) ---------------------------------------------------

HOLD_LOCK = """
import sys, time
sys.path.insert(0, {repo!r})
from pathlib import Path
from orchestrator.trainer import checkpoint
lock = checkpoint.lock_directory(Path({directory!r}))
print("held", flush=True)
time.sleep(600)
"""


def test_a_checkpoint_directory_held_by_another_process_is_refused_naming_it(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK.format(repo=REPO_ROOT, directory=str(tmp_path))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(checkpoint.CheckpointError) as caught:
            checkpoint.lock_directory(tmp_path, wait_seconds=0)
        assert str(caught.value).startswith(f"checkpoint directory {tmp_path} is in use by another run (")
        assert f"pid {holder.pid}" in str(caught.value)
    finally:
        holder.kill()
        holder.wait()
    checkpoint.lock_directory(tmp_path, wait_seconds=0).close()  # the lock died with its process
