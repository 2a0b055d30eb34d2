"""One optimizer step, driven directly: all-reduce count, fp16 overflow skipping, bf16 without a scaler.

Real DDP over real gloo process groups (no mocks); the fp16 overflow is a real fp16 overflow under CPU
autocast (torch 2.13 supports fp16 autocast and GradScaler on CPU).
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from orchestrator.trainer import precision
from orchestrator.trainer.step import train_step
from orchestrator.trainer.timeline import Timeline


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def make_model(seed: int = 0) -> DistributedDataParallel:
    torch.manual_seed(seed)
    return DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)))


def batches(steps: int, accumulation: int, poison: dict[int, float] | None = None, seed: int = 1):
    """(inputs, targets) micro-batches; inputs of step s are multiplied by poison[s]."""
    generator = torch.Generator().manual_seed(seed)
    for step in range(steps):
        for _ in range(accumulation):
            inputs = torch.randn(4, 4, generator=generator)
            yield inputs * (poison or {}).get(step, 1.0), torch.randn(4, 1, generator=generator)


def run_steps(model, precision_name: str, steps: int, accumulation: int, poison=None):
    """Per step: (updated, params changed, scale before, scale after)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = precision.grad_scaler(precision_name, torch.device("cpu"))
    autocast = precision.autocast(precision_name, torch.device("cpu"))
    data = batches(steps, accumulation, poison)
    rows = []
    for _ in range(steps):
        before = [p.detach().clone() for p in model.parameters()]
        scale_before = scaler.get_scale()
        result = train_step(
            model, optimizer, scaler, data, accumulation=accumulation, loss_fn=nn.functional.mse_loss,
            autocast=autocast, grad_clip=1.0, device=torch.device("cpu"), timeline=Timeline(),
        )  # fmt: skip
        changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        rows.append((result.updated, changed, scale_before, scaler.get_scale()))
    return rows


def test_fp16_overflow_skips_exactly_that_step_and_backs_off(group):
    # x 1e6 overflows fp16 (max 65504) in the first matmul: inf activations, inf/NaN gradients.
    rows = run_steps(make_model(), "fp16", steps=6, accumulation=2, poison={3: 1e6})
    assert rows == [
        (True, True, 65536.0, 65536.0),
        (True, True, 65536.0, 65536.0),
        (True, True, 65536.0, 65536.0),
        (False, False, 65536.0, 32768.0),  # skipped: weights untouched, scale halved
        (True, True, 32768.0, 32768.0),
        (True, True, 32768.0, 32768.0),
    ]


def test_bf16_runs_without_a_scaler(group):
    model = make_model()
    scaler = precision.grad_scaler("bf16", torch.device("cpu"))
    assert not scaler.is_enabled()
    with precision.autocast("bf16", torch.device("cpu"))():
        assert model(torch.randn(2, 4)).dtype == torch.bfloat16
    rows = run_steps(model, "bf16", steps=3, accumulation=2)
    assert [(updated, changed) for updated, changed, _, _ in rows] == [(True, True)] * 3


def test_nonfinite_gradient_in_fp32_does_not_update(group):
    rows = run_steps(make_model(), "fp32", steps=4, accumulation=2, poison={2: math.nan})
    assert [(updated, changed) for updated, changed, _, _ in rows] == [
        (True, True), (True, True), (False, False), (True, True),
    ]  # fmt: skip


# --- one all-reduce per optimizer step, with 2 real processes ------------------------------------------


def _count_allreduces(rank: int, store_dir: str, result_dir: str) -> None:
    """Both loops, one after the other, in one process group: one spawn of 2 processes for both tests."""
    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank, world_size=2)
    for use_no_sync in (True, False):
        model = make_model()
        calls = {"allreduce": 0}

        def counting_hook(state, bucket):
            state["allreduce"] += 1
            return default_hooks.allreduce_hook(dist.group.WORLD, bucket)

        model.register_comm_hook(calls, counting_hook)
        steps, accumulation = 3, 4
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = batches(steps, accumulation, seed=rank)
        if use_no_sync:
            for _ in range(steps):
                train_step(
                    model, optimizer, precision.grad_scaler("fp32", torch.device("cpu")), data,
                    accumulation=accumulation, loss_fn=nn.functional.mse_loss,
                    autocast=precision.autocast("fp32", torch.device("cpu")), grad_clip=None,
                    device=torch.device("cpu"), timeline=Timeline(),
                )  # fmt: skip
        else:  # control: what a loop without no_sync() does
            for inputs, targets in data:
                nn.functional.mse_loss(model(inputs), targets).backward()
        weights = [p.detach().flatten().tolist() for p in model.parameters()]
        with open(f"{result_dir}/{use_no_sync}-rank{rank}.json", "w") as file:
            json.dump({"calls": calls["allreduce"], "weights": weights}, file)
    dist.destroy_process_group()
    # Skip interpreter finalisation, as orchestrator/trainer/__main__.py does: gloo's threads being destroyed
    # then occasionally abort a finished process (SIGABRT), which would fail this test for no reason of its own.
    os._exit(0)


@pytest.fixture(scope="module")
def allreduce_counts(tmp_path_factory) -> dict[bool, list[dict]]:
    """use_no_sync -> each rank's hook calls and final weights (one spawn for both parameters)."""
    tmp = tmp_path_factory.mktemp("allreduce")
    store, results = tmp / "store-dir", tmp / "results"
    store.mkdir(), results.mkdir()
    mp.spawn(_count_allreduces, args=(str(store), str(results)), nprocs=2)
    return {
        flag: [json.loads((results / f"{flag}-rank{r}.json").read_text()) for r in range(2)]
        for flag in (True, False)
    }


@pytest.mark.parametrize(("use_no_sync", "expected_calls"), [(True, 3), (False, 12)])
def test_one_allreduce_per_optimizer_step(allreduce_counts, use_no_sync, expected_calls):
    ranks = allreduce_counts[use_no_sync]
    # The model is small enough for one gradient bucket: one hook call = one all-reduce.
    assert [r["calls"] for r in ranks] == [expected_calls, expected_calls]
    if use_no_sync:
        assert ranks[0]["weights"] == ranks[1]["weights"]  # the all-reduced gradient kept ranks in step


# --- host syncs and the order of DDP and compile ---------------------------------------------------------


@pytest.mark.parametrize("precision_name", ["fp16", "bf16", "fp32"])
def test_one_host_sync_per_step(group, monkeypatch, precision_name):
    """`.item()` is how a step waits for the device: exactly once per optimizer step (the gradient norm).
    Before, fp16 read the scale before and after scaler.step, and scaler.step read its inf check: 3 more."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = precision.grad_scaler(precision_name, torch.device("cpu"))
    data = batches(4, 2, poison={2: 1e6})  # step 2 overflows fp16: a skipped step syncs no more than others
    calls = []
    original_item = torch.Tensor.item

    def counting_item(self):
        calls.append(1)
        return original_item(self)

    per_step = []
    for _ in range(4):
        calls.clear()
        with monkeypatch.context() as patch:
            patch.setattr(torch.Tensor, "item", counting_item)
            train_step(model, optimizer, scaler, data, accumulation=2, loss_fn=nn.functional.mse_loss,
                       autocast=precision.autocast(precision_name, torch.device("cpu")), grad_clip=1.0,
                       device=torch.device("cpu"), timeline=Timeline())  # fmt: skip
        per_step.append(len(calls))
    assert per_step == [1, 1, 1, 1]
    if precision_name == "fp16":
        assert scaler.get_scale() == 32768.0  # the overflow still halved the scale, without a sync


@pytest.mark.parametrize("compile_", [True, False])
def test_ddp_is_wrapped_first_then_compiled(group, compile_):
    """PyTorch's documented order: torch.compile(DDP(model)), so all-reduces overlap the backward."""
    from orchestrator.trainer import parallel

    module = nn.Linear(4, 2)
    wrapped = parallel.wrap(module, mode="ddp", device=torch.device("cpu"), world_size=1, compile=compile_)
    model = wrapped.model
    ddp = model._orig_mod if compile_ else model
    assert wrapped.ddp is ddp
    assert type(ddp) is DistributedDataParallel and ddp.module is module
    assert ddp.gradient_as_bucket_view
    if compile_:
        assert type(model).__name__ == "OptimizedModule"
        with parallel.no_sync(model):  # the step's accumulation reaches DDP through the compiled wrapper
            assert not ddp.require_backward_grad_sync
