"""torch across the supported range: the floor, TF32 set-up, the gradient norm, where a process sits.

No GPU here: the TF32 setters are called directly (the trainer calls them on GPUs only) and read back through
torch's own getters; an old torch is played by a fake `torch.backends` module without the 2.9+ flags.
"""

from __future__ import annotations

import re
import types

import pytest
import tomllib
import torch
from torch import nn

from orchestrator.trainer import compat, dist, precision, step
from tests.trainer.conftest import REPO


def test_the_declared_floor_is_the_checked_one():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    torch_req = next(
        r for r in pyproject["project"]["optional-dependencies"]["train"] if r.startswith("torch")
    )
    declared = re.fullmatch(r"torch>=(\d+)\.(\d+)", torch_req)
    assert declared and tuple(map(int, declared.groups())) == compat.MIN_TORCH


@pytest.mark.parametrize(
    ("version", "ok"),
    [("2.13.0+cpu", True), ("2.4.0", True), ("2.6.0a0+ecf3bae40a.nv25.01", True), ("2.3.1+cu121", False),
     ("1.13.1", False)],
)  # fmt: skip
def test_torch_floor(version, ok):
    if ok:
        assert compat.check_torch(version) == version
    else:
        with pytest.raises(
            compat.TorchTooOld, match=r"^torch .* is older than orch's trainer supports \(torch >= 2\.4\); "
        ):
            compat.check_torch(version)


def test_tf32_flags_read_back_consistently(tf32_state):
    precision.set_tf32(True)
    on = precision.tf32_flags()
    precision.set_tf32(False)
    off = precision.tf32_flags()
    assert {k: on[k] for k in ("float32_matmul_precision", "cuda.matmul.allow_tf32", "cudnn.allow_tf32")} == {
        "float32_matmul_precision": "high", "cuda.matmul.allow_tf32": True, "cudnn.allow_tf32": True,
    }  # fmt: skip
    assert {k: off[k] for k in ("float32_matmul_precision", "cuda.matmul.allow_tf32", "cudnn.allow_tf32")} == {
        "float32_matmul_precision": "highest", "cuda.matmul.allow_tf32": False, "cudnn.allow_tf32": False,
    }  # fmt: skip
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9: the new flags agree
        assert (on["cuda.matmul.fp32_precision"], off["cuda.matmul.fp32_precision"]) == ("tf32", "ieee")
        assert on["cudnn.conv.fp32_precision"] == "tf32"


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch < 2.9")
def test_the_new_api_alone_poisons_legacy_reads(tf32_state):
    """Why set_tf32 uses the legacy setters: what the trainer did before breaks Inductor's reads."""
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        precision.tf32_flags()
    precision.set_tf32(True)  # the legacy setter makes both agree again
    assert precision.tf32_flags()["cuda.matmul.allow_tf32"] is True


def test_tf32_on_a_torch_without_the_new_flags(monkeypatch, tf32_state):
    """torch 2.4-2.8: no `fp32_precision` anywhere; nothing may touch it."""
    old_matmul = types.SimpleNamespace(allow_tf32=False, allow_fp16_reduced_precision_reduction=True)
    old_cudnn = types.SimpleNamespace(allow_tf32=True, enabled=True)
    monkeypatch.setattr(torch.backends.cuda, "matmul", old_matmul)
    monkeypatch.setattr(torch.backends, "cudnn", old_cudnn)
    precision.set_tf32(True)
    flags = precision.tf32_flags()
    assert old_cudnn.allow_tf32 is True and flags["float32_matmul_precision"] == "high"
    assert not any("fp32_precision" in key for key in flags)


def test_total_norm_without_get_total_norm(monkeypatch):
    """torch < 2.6 has no torch.nn.utils.get_total_norm: the fallback gives the same number."""
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    model(torch.randn(4, 5)).square().sum().backward()
    parameters = list(model.parameters())
    new = step.total_norm(parameters)
    monkeypatch.delattr(torch.nn.utils, "get_total_norm")
    old = step.total_norm(parameters)
    torch.testing.assert_close(old, new)
    expected = torch.cat([p.grad.flatten() for p in parameters]).norm()
    torch.testing.assert_close(old, expected)


# --- where a process sits: torchrun's variables, from the v1 operator's env or Trainer v2's -----------------

# What torchrun gives the worker with local rank 1 on node 1 of 2 nodes x 2 processes (static rendezvous).
TORCHRUN_WORKER = {"TORCHELASTIC_RUN_ID": "none", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                   "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2",
                   "TORCHELASTIC_RESTART_COUNT": "0"}  # fmt: skip
V1_POD = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "PET_MASTER_ADDR": "job-master-0",
          "PET_MASTER_PORT": "23456", "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2"}  # fmt: skip
V2_POD = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1",
          "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29500"}  # fmt: skip


@pytest.mark.parametrize("pod", [V1_POD, V2_POD], ids=["pytorchjob", "trainjob"])
def test_a_torchrun_worker_sits_where_torchrun_says(pod):
    # torchrun rewrites RANK/WORLD_SIZE (the v1 operator's are the pod's) and adds the rest.
    assert dist.placement({**pod, "RANK": "1", "WORLD_SIZE": "2", **TORCHRUN_WORKER}) == dist.Placement(
        rank=3, world_size=4, local_rank=1, local_world_size=2, node_rank=1, num_nodes=2, restart_count=0
    )


@pytest.mark.parametrize(
    "pod",
    [{**V1_POD, "RANK": "1", "WORLD_SIZE": "4"}, V2_POD, {"PET_NNODES": "1:3"}, {"PET_NPROC_PER_NODE": "8"}],
    ids=["pytorchjob", "trainjob", "elastic", "one-node-many-procs"],
)
def test_a_multi_process_job_without_torchrun_is_refused(pod):
    with pytest.raises(
        RuntimeError, match=r"not started by torchrun \(.*\); run `torchrun \.\.\. -m orchestrator\.trainer`"
    ):
        dist.placement(pod)


def test_a_single_process_without_torchrun_is_a_group_of_one():
    assert dist.placement({"PET_NNODES": "1", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "0"}) == (
        dist.Placement(
            rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, num_nodes=1, restart_count=0
        )  # fmt: skip
    )


def test_fsdp_on_a_torch_without_fully_shard_is_one_line():
    from orchestrator.trainer import parallel

    compat.require("train.parallel: fsdp", parallel.FSDP_MIN_TORCH, installed="2.6.0+cu124")  # fine
    with pytest.raises(
        compat.TorchTooOld, match=r"^train.parallel: fsdp needs torch >= 2\.6; this is torch 2\.5\.1"
    ):
        compat.require("train.parallel: fsdp", parallel.FSDP_MIN_TORCH, installed="2.5.1")


def test_plain_and_compiled_modules_are_not_sharded():
    """DDP (compiled or not) is not FSDP."""
    from orchestrator.trainer import parallel

    assert not parallel.is_sharded(nn.Linear(2, 2))
    assert not parallel.is_sharded(torch.compile(nn.Linear(2, 2)))
