"""The CUDA path for real: TF32 with torch.compile, bf16 autocast, fp16 with fused AdamW and the GradScaler,
one host sync per step. `pytest -m gpu` (make gpu-check) runs these; without CUDA they skip.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from orchestrator.trainer import precision
from orchestrator.trainer.step import train_step
from orchestrator.trainer.timeline import Timeline

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = torch.device("cuda", 0)


@pytest.fixture
def nccl_group(tmp_path):
    torch.cuda.set_device(CUDA)
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_tf32_then_compile_reads_every_flag(tf32_state):
    precision.set_tf32(True)
    compiled = torch.compile(lambda a, b: (a @ b).relu())
    a = torch.randn(256, 256, device=CUDA)
    out = compiled(a, a)  # Inductor reads the legacy TF32 flags while compiling
    torch.testing.assert_close(out, (a @ a).relu(), rtol=1e-2, atol=1e-1)
    assert precision.tf32_flags()["cuda.matmul.allow_tf32"] is True


def test_bf16_autocast_on_cuda():
    model = nn.Linear(8, 8).to(CUDA)
    with precision.autocast("bf16", CUDA)():
        assert model(torch.randn(2, 8, device=CUDA)).dtype == torch.bfloat16
    assert not precision.grad_scaler("bf16", CUDA).is_enabled()


def _model() -> DistributedDataParallel:
    torch.manual_seed(0)
    return DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).to(CUDA),
                                   device_ids=[0])  # fmt: skip


def _batches(steps: int, accumulation: int, poison: dict[int, float]):
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        for _ in range(accumulation):
            yield (
                torch.randn(4, 4, generator=generator) * poison.get(step, 1.0),
                torch.randn(4, 1, generator=generator),
            )


def test_fp16_fused_adamw_skips_an_overflow_and_backs_off(nccl_group):
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scaler = precision.grad_scaler("fp16", CUDA)
    data = _batches(4, 2, poison={2: 1e6})  # x 1e6 overflows fp16
    rows = []
    for _ in range(4):
        before = [p.detach().clone() for p in model.parameters()]
        result = train_step(model, optimizer, scaler, data, accumulation=2, loss_fn=nn.functional.mse_loss,
                            autocast=precision.autocast("fp16", CUDA), grad_clip=1.0, device=CUDA, timeline=Timeline())  # fmt: skip
        changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        rows.append((result.updated, changed, scaler.get_scale()))
    assert rows == [
        (True, True, 65536.0),
        (True, True, 65536.0),
        (False, False, 32768.0),
        (True, True, 32768.0),
    ]


def test_one_host_sync_per_step_on_cuda(nccl_group):
    """torch's sync debug mode warns at every synchronising call: one per optimizer step (the norm)."""
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scaler = precision.grad_scaler("fp16", CUDA)
    data = _batches(4, 2, poison={})
    step = lambda: train_step(model, optimizer, scaler, data, accumulation=2, loss_fn=nn.functional.mse_loss,  # noqa: E731
                              autocast=precision.autocast("fp16", CUDA), grad_clip=1.0, device=CUDA, timeline=Timeline())  # fmt: skip
    step()  # the first step builds DDP's buckets and the optimizer state
    counts = []
    for _ in range(3):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts.append(sum("synchroniz" in str(w.message) for w in caught))
    assert counts == [1, 1, 1]
