"""Checkpoint files: atomic writes, a kill during a write, corrupt files skipped, keep-last-K, RNG."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import torch

from orchestrator.trainer import checkpoint

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def state(step: int, size: int = 4) -> dict:
    return {"format": checkpoint.FORMAT, "step": step, "model": {"w": torch.full((size,), float(step))}}


def test_newest_valid_checkpoint_wins_and_torn_files_are_skipped(tmp_path):
    for step in (10, 20):
        checkpoint.write_atomic(checkpoint.path_for(tmp_path, step), state(step))
    # A newer file cut short (as a disk-full or a non-atomic writer would leave it) and a foreign one.
    good = checkpoint.path_for(tmp_path, 20).read_bytes()
    checkpoint.path_for(tmp_path, 30).write_bytes(good[: len(good) // 2])
    torch.save({"not": "ours"}, checkpoint.path_for(tmp_path, 40))
    loaded, path = checkpoint.load_newest(tmp_path)
    assert path == checkpoint.path_for(tmp_path, 20) and loaded["step"] == 20
    assert torch.equal(loaded["model"]["w"], torch.full((4,), 20.0))


def test_no_checkpoint_directory_means_a_fresh_start(tmp_path):
    assert checkpoint.load_newest(tmp_path / "missing") == (None, None)


def test_a_kill_during_a_write_leaves_the_previous_checkpoint_loadable(tmp_path):
    # A real process writes step 10, then starts a large step-20 write; we SIGKILL it mid-write.
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {REPO_ROOT!r})
        from pathlib import Path
        from orchestrator.trainer import checkpoint
        d = Path({str(tmp_path)!r})
        checkpoint.write_atomic(checkpoint.path_for(d, 10), {{"format": checkpoint.FORMAT, "step": 10}})
        print("first done", flush=True)
        big = [torch.randn(4_000_000) for _ in range(20)]  # 320 MB: the write takes a while
        checkpoint.write_atomic(checkpoint.path_for(d, 20), {{"format": checkpoint.FORMAT, "step": 20, "t": big}})
        print("second done", flush=True)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "first done"
    tmp_file = tmp_path / ".step-00000020.pt.tmp"
    deadline = time.monotonic() + 60
    while not (tmp_file.exists() and tmp_file.stat().st_size > 0):
        assert time.monotonic() < deadline and process.poll() is None, "the write never started"
        time.sleep(0.001)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not checkpoint.path_for(tmp_path, 20).exists(), "the write finished before the kill"
    assert tmp_file.exists()
    loaded, path = checkpoint.load_newest(tmp_path)
    assert loaded["step"] == 10 and path == checkpoint.path_for(tmp_path, 10)


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
