"""FSDP2 under the trainer's step: one reduce-scatter per unit per optimizer step, clipping on sharded
gradients, sharding units, and memory measured from local shards.

Real fully_shard over real gloo process groups (2 processes); the reduce-scatter count wraps the real
collective (it still runs) the way the DDP test counts all-reduces with a communication hook.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from orchestrator.trainer import parallel, precision
from orchestrator.trainer.step import train_step
from orchestrator.trainer.timeline import Timeline
from tests.trainer.test_step import batches


def make_module(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _fsdp_worker(rank: int, store_dir: str, result_dir: str) -> None:
    """Both loops, one after the other, in one process group: one spawn of 2 processes for both tests."""
    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank, world_size=2)
    real = dist.reduce_scatter_single
    for use_no_sync in (True, False):
        calls = {"reduce_scatter": 0}

        def counting(*args, calls=calls, **kwargs):
            calls["reduce_scatter"] += 1
            return real(*args, **kwargs)

        dist.reduce_scatter_single = counting  # what FSDP2's default reduce-scatter calls
        wrapped = parallel.wrap(make_module(), mode="fsdp", device=torch.device("cpu"), world_size=2)
        model = wrapped.model
        steps, accumulation = 3, 4
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = batches(steps, accumulation, seed=rank)
        norms = []
        if use_no_sync:
            for _ in range(steps):
                result = train_step(
                    model, optimizer, precision.grad_scaler("fp32", torch.device("cpu")), data,
                    accumulation=accumulation, loss_fn=lambda out, y: nn.functional.mse_loss(out[:, :1], y),
                    autocast=precision.autocast("fp32", torch.device("cpu")), grad_clip=0.5,
                    device=torch.device("cpu"), timeline=Timeline(),
                )  # fmt: skip
                norms.append(result.grad_norm)
        else:  # control: what a loop without no_sync() does
            for inputs, targets in data:
                nn.functional.mse_loss(model(inputs)[:, :1], targets).backward()
        full = {name: p.full_tensor().flatten().tolist() for name, p in model.named_parameters()}
        local = parallel.local_bytes(model.parameters())
        with open(f"{result_dir}/{use_no_sync}-rank{rank}.json", "w") as file:
            json.dump({"calls": calls["reduce_scatter"], "full": full, "norms": norms, "local": local}, file)
    dist.destroy_process_group()
    os._exit(0)  # skip finalisation, as the trainer does (gloo's occasional SIGABRT at exit)


@pytest.fixture(scope="module")
def reduce_scatters(tmp_path_factory) -> dict[bool, list[dict]]:
    """use_no_sync -> what each rank counted and held (one spawn for both parameters)."""
    tmp = tmp_path_factory.mktemp("reduce-scatter")
    store, results = tmp / "store-dir", tmp / "results"
    store.mkdir(), results.mkdir()
    mp.spawn(_fsdp_worker, args=(str(store), str(results)), nprocs=2)
    return {
        flag: [json.loads((results / f"{flag}-rank{r}.json").read_text()) for r in range(2)]
        for flag in (True, False)
    }


@pytest.mark.parametrize(("use_no_sync", "expected_calls"), [(True, 3 * 2), (False, 12 * 2)])
def test_one_reduce_scatter_per_unit_per_optimizer_step(reduce_scatters, use_no_sync, expected_calls):
    ranks = reduce_scatters[use_no_sync]
    # Two units (the two Linear layers; the root holds no parameter of its own): one reduce-scatter
    # each per backward that syncs.
    assert [r["calls"] for r in ranks] == [expected_calls, expected_calls]
    assert ranks[0]["full"] == ranks[1]["full"]  # the reduced gradients kept the shards consistent
    # each rank holds half of the 4*8+8+8*2+2 = 58 parameters (fp32)
    assert sorted(r["local"] for r in ranks) == [29 * 4, 29 * 4]
    if use_no_sync:
        # the norm of the whole gradient: identical on every rank, and clipping (0.5) was needed
        assert ranks[0]["norms"] == ranks[1]["norms"]
        assert all(norm > 0.5 for norm in ranks[0]["norms"])


def test_default_units_are_children_with_parameters():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(4, 4)
            self.act = nn.ReLU()  # no parameters: not a unit
            self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])  # a container: each block
            self.head = nn.Linear(4, 2)

    net = Net()
    assert parallel.default_shard_units(net) == [net.embed, net.blocks[0], net.blocks[1], net.head]


def test_gpt_names_its_blocks():
    from orchestrator.trainer.tasks import build_task

    task = build_task("gpt", {"n_layer": 2, "n_embd": 16, "n_head": 2, "seq_len": 8, "samples": 4})
    assert task.shard_units == list(task.model.blocks)


def test_unknown_mode_and_foreign_units_are_refused(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="train.parallel 'zero'"):
            parallel.wrap(make_module(), mode="zero", device=torch.device("cpu"), world_size=1)
        with pytest.raises(ValueError, match="not a submodule of the task's model"):
            parallel.wrap(
                make_module(), mode="fsdp", device=torch.device("cpu"), world_size=1,
                shard_units=[nn.Linear(2, 2)],
            )  # fmt: skip
    finally:
        dist.destroy_process_group()


def test_memory_meter_reads_gradients_and_optimizer_state(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        wrapped = parallel.wrap(make_module(), mode="ddp", device=torch.device("cpu"), world_size=1)
        optimizer = torch.optim.AdamW(wrapped.module.parameters(), lr=0.1)
        published = []
        meter = parallel.MemoryMeter(
            wrapped.module, optimizer, torch.device("cpu"), publish=lambda **kw: published.append(kw)
        )
        assert meter.report()["gradient_bytes"] == 0  # nothing seen yet
        wrapped.model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        params = 58 * 4
        assert meter.report() == {
            "parameter_bytes": params,
            "gradient_bytes": params,
            "optimizer_bytes": 2 * params,  # AdamW: exp_avg and exp_avg_sq (its step counters excluded)
            "peak_allocated_bytes": None,  # CUDA only
        }
        optimizer.step()
        assert published == [meter.report()]  # once, after the first step
        meter.close()
    finally:
        dist.destroy_process_group()


def test_the_spec_fields():
    from orchestrator.trainer.config import TrainSpec

    train = TrainSpec.model_validate(
        {"parallel": "fsdp", "fsdp": {"reshard_after_forward": False}, "checkpoint": {"async": True}}
    )
    assert (train.parallel, train.fsdp.reshard_after_forward, train.checkpoint.async_) == (
        "fsdp",
        False,
        True,
    )
    dumped = train.model_dump(mode="json")  # what train.json carries to the pods
    assert dumped["checkpoint"]["async"] is True and TrainSpec.model_validate(dumped) == train
    assert TrainSpec().parallel == "ddp"
    with pytest.raises(ValueError, match="'ddp' or 'fsdp'"):
        TrainSpec.model_validate({"parallel": "zero"})
