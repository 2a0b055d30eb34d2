"""The baseline: a plain DDP loop as a user would write it by hand (nanoGPT style), no orch code in the loop.

It reads the same train.json as orch's trainer (task, batch sizes, optimizer, steps, clipping, precision)
and trains the same task with the same global batch and accumulation:

    torchrun --standalone --nproc-per-node 2 -m benchmarks.bare_ddp --config train.json [--sync-every-micro-step]

`--sync-every-micro-step` is the naive accumulation loop: it all-reduces after every micro-batch instead of
only after the last one (no `no_sync`), the mistake the accumulation benchmark measures.

`--fsdp` is the same loop with FSDP2 as a user would write it from torch's tutorial: `fully_shard` on each
child module with parameters and then the root, bf16/fp16 through `MixedPrecisionPolicy`, gradient sync
off for all micro-steps but the last (`set_requires_gradient_sync`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from orchestrator.trainer.tasks import build_task  # the task (model + data) only, not the loop

PRECISION = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--sync-every-micro-step", action="store_true")
    parser.add_argument("--fsdp", action="store_true")
    args = parser.parse_args()
    cfg = json.loads(Path(args.config).read_text())

    # -- process group, from torchrun's env
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")

    # -- the same task, batch split and optimizer as the config asks for
    torch.manual_seed(cfg["seed"])
    task = build_task(cfg["task"], cfg["task_args"])
    micro = cfg["micro_batch_size"] or cfg["batch_size"] // world
    accumulation = cfg["batch_size"] // (micro * world)
    model = task.model.to(device)
    if cfg.get("compile"):
        model = torch.compile(model)
    dtype = PRECISION[cfg["precision"]]
    if args.fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (world,))
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)
        for child in list(model.children()):
            if any(True for _ in child.parameters()):
                fully_shard(child, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)

        @contextlib.contextmanager
        def no_sync():
            model.set_requires_gradient_sync(False)
            yield
            model.set_requires_gradient_sync(True)
    else:
        model = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
        no_sync = model.no_sync
    opt = cfg["optimizer"]
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=opt["lr"], betas=tuple(opt["betas"]), weight_decay=opt["weight_decay"]
    )
    autocast = torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
    scaler = torch.amp.GradScaler(device.type, enabled=cfg["precision"] == "fp16")
    sampler = DistributedSampler(
        task.train_dataset, num_replicas=world, rank=rank, seed=cfg["seed"], drop_last=True
    )
    loader = DataLoader(task.train_dataset, batch_size=micro, sampler=sampler, drop_last=True)

    def batches():
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    data = batches()
    # -- the loop
    for step in range(cfg["max_steps"]):
        for micro_step in range(accumulation):
            inputs, targets = next(data)
            inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            last = micro_step == accumulation - 1
            # DDP all-reduces in backward unless inside no_sync(); the naive loop never skips it
            sync = last or args.sync_every_micro_step
            with contextlib.nullcontext() if sync else no_sync():
                with autocast:
                    loss = task.loss_fn(model(inputs), targets) / accumulation
                scaler.scale(loss).backward()
        if cfg["grad_clip"]:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0 and cfg["log_every"] and step % cfg["log_every"] == 0:
            print(f"step {step} loss {loss.item() * accumulation:.4f}", flush=True)  # .item(): a host sync
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
