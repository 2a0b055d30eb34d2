"""The same training as `benchmarks.bare_ddp`, written the way HF Accelerate's docs show it.

    torchrun --standalone --nproc-per-node 2 -m benchmarks.accelerate_loop --config train.json

Accelerate reads torchrun's env, wraps the model in DDP, shards the DataLoader, skips the all-reduce on
non-final micro-steps (`accumulate`), divides the loss by the accumulation and steps the optimizer only
when gradients are synchronised.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from orchestrator.trainer.tasks import build_task

MIXED_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    cfg = json.loads(Path(parser.parse_args().config).read_text())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    micro = cfg["micro_batch_size"] or cfg["batch_size"] // world
    accumulation = cfg["batch_size"] // (micro * world)

    accelerator = Accelerator(
        gradient_accumulation_steps=accumulation,
        mixed_precision=MIXED_PRECISION[cfg["precision"]],
        cpu=not torch.cuda.is_available(),
    )
    torch.manual_seed(cfg["seed"])
    task = build_task(cfg["task"], cfg["task_args"])
    opt = cfg["optimizer"]
    optimizer = torch.optim.AdamW(
        task.model.parameters(), lr=opt["lr"], betas=tuple(opt["betas"]), weight_decay=opt["weight_decay"]
    )
    loader = DataLoader(task.train_dataset, batch_size=micro, shuffle=True, drop_last=True)
    model, optimizer, loader = accelerator.prepare(task.model, optimizer, loader)

    step = 0
    while step < cfg["max_steps"]:  # one pass per epoch; the prepared loader reshuffles each pass
        for inputs, targets in loader:
            with accelerator.accumulate(model):
                loss = task.loss_fn(model(inputs), targets)
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg["grad_clip"]:
                    accelerator.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if accelerator.sync_gradients:
                if accelerator.is_main_process and cfg["log_every"] and step % cfg["log_every"] == 0:
                    print(f"step {step} loss {loss.item():.4f}", flush=True)
                step += 1
                if step >= cfg["max_steps"]:
                    break
    accelerator.end_training()


if __name__ == "__main__":
    main()
