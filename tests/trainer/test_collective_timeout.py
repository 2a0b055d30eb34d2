"""A peer that dies or hangs inside a collective fails the survivor within train.collective_timeout.

Two "nodes" on 127.0.0.1, each its own torchrun started with only the PET_* variables Trainer v2's torch plugin
sets (the v1 operator sets these too), so nothing but the process group connects the two workers: no shared
launcher notices the failure for the survivor. One worker is then SIGKILLed (it dies: its sockets close) or
SIGSTOPped (it hangs, like a node that vanished): the other is inside, or about to enter, a gradient all-reduce.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.spec.test_torchrun_launch import free_port
from tests.trainer.conftest import REPO

pytestmark = pytest.mark.slow

TIMEOUT = 15  # seconds: train.collective_timeout here (the default is 10 minutes)


def start_node(node_rank: int, config: Path, out: Path, port: int) -> subprocess.Popen:
    out.mkdir()  # the pod's emptyDir
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "TORCHELASTIC_", "PET_"))}
    env.update(
        PET_NNODES="2", PET_NPROC_PER_NODE="1", PET_NODE_RANK=str(node_rank), PET_MASTER_ADDR="127.0.0.1",
        PET_MASTER_PORT=str(port), ORCH_OUTPUT_DIR=str(out), ORCH_METRICS_PORT="0",
        ORCH_PROGRESS_FILE=str(out / "progress.jsonl"), TMPDIR=str(out),
    )  # fmt: skip
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1"]
    return subprocess.Popen(
        [*torchrun, "-m", "orchestrator.trainer", "--config", str(config)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def steps_done(progress: Path) -> int:
    if not progress.exists():
        return 0
    events = [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]
    return max((e["step"] for e in events if e["event"] == "step"), default=0)


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["peer-hangs", "peer-dies"])
def test_the_survivor_fails_within_the_collective_timeout(tmp_path, sig):
    config = tmp_path / "train.json"
    config.write_text(json.dumps({
        "task": "tests.trainer.plugin_tasks:records_pid",
        "task_args": {"samples": 4096, "eval_samples": 0, "sample_delay": 0.002},
        "batch_size": 8, "max_steps": 2000, "log_every": 1, "eval_every": 0,
        "checkpoint": {"every_steps": 0}, "collective_timeout": f"{TIMEOUT}s",
    }))  # fmt: skip
    port = free_port()
    outs = [tmp_path / f"node{n}" for n in (0, 1)]
    nodes = [start_node(n, config, outs[n], port) for n in (0, 1)]
    peer_pid = None
    try:
        wait_for(lambda: steps_done(outs[0] / "progress.jsonl") >= 3, "node 0 to train 3 steps")
        first_lines = nodes[0].stdout.readline()  # rank 0's first line: what it learned from torchrun
        assert first_lines.startswith("torch ") and "2 node(s) x 1 process(es)" in first_lines
        peer_pid = int((outs[1] / "pid-1").read_text())  # the worker of node 1 (global rank 1)
        os.kill(peer_pid, sig)
        stopped_at = time.monotonic()
        try:
            # The default timeout (10 min) would hang here far longer than this generous bound.
            nodes[0].wait(timeout=TIMEOUT + 150)
        except subprocess.TimeoutExpired:
            pytest.fail(f"node 0 still waits {TIMEOUT + 150} s after its peer got {sig.name}")
        waited = time.monotonic() - stopped_at
        stderr = nodes[0].stderr.read()
        assert nodes[0].returncode != 0, stderr
        assert steps_done(outs[0] / "progress.jsonl") < 2000  # it did not finish: the collective failed
        if sig == signal.SIGSTOP:  # nothing tells the survivor but its clock
            assert waited >= TIMEOUT * 0.9
            assert "timed out" in stderr.lower() or "timeout" in stderr.lower(), stderr[-3000:]
    finally:
        if peer_pid is not None:
            for s in (signal.SIGKILL, signal.SIGCONT):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(peer_pid, s)
        for node in nodes:
            if node.poll() is None:
                node.kill()
            node.communicate(timeout=60)
