"""The training entrypoint, run once per process by torchrun (in a pod) or by `orch run` (here).

    torchrun --nproc-per-node=4 -m orchestrator.trainer --config train.json

Reads top to bottom: config -> process group -> task, model, optimizer, schedule, precision, metrics,
checkpoints -> resume -> loop -> final checkpoint, evaluation, summary.json and model.pt -> close.
The config is the `train:` section of job.yaml as JSON; runtime facts come from the environment
(ORCH_OUTPUT_DIR, ORCH_JOB_NAME, ORCH_METRICS_PORT, ... and torchrun's RANK/WORLD_SIZE/LOCAL_RANK).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Sized
from pathlib import Path
from typing import Any, cast

from orchestrator.spec import TrainSpec


class NonFiniteLoss(RuntimeError):
    """The loss or gradient became inf/NaN in fp32 or bf16 (fp16 overflows are the scaler's business)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.trainer", description=__doc__)
    parser.add_argument("--config", required=True, help="JSON file with the job's train section")
    return parser.parse_args(argv)


def load_config(path: str) -> TrainSpec:
    return TrainSpec.model_validate(json.loads(Path(path).read_text()))


def main(argv: list[str] | None = None) -> None:
    started = time.perf_counter()
    # --- config ---------------------------------------------------------------------------------------
    cfg = load_config(parse_args(argv).config)
    output_dir = Path(os.environ.get("ORCH_OUTPUT_DIR") or ".")
    job_name = os.environ.get("ORCH_JOB_NAME", "local")
    # The CUDA allocator reads this once, at its first allocation: set it before torch touches the GPU.
    if cfg.cuda_alloc_conf:
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", cfg.cuda_alloc_conf)

    from orchestrator.trainer import dist, metrics, report

    # --- process group --------------------------------------------------------------------------------
    world = dist.init()
    reporter = report.Reporter(
        enabled=world.is_main,
        lines=os.environ.get("ORCH_LOG_LINES", "1") != "0",
        events_file=os.environ.get("ORCH_PROGRESS_FILE"),
    )
    port = int(os.environ.get("ORCH_METRICS_PORT") or 0)
    meter = metrics.build_metrics(
        enabled=port > 0,
        job=job_name,
        rank=world.rank,
        local_rank=world.local_rank,
        node_rank=world.node_rank,
        local_world_size=world.local_world_size,
        port=port,
        device=str(world.device),
    )
    try:
        # The training body is its own function so that the model, DDP's reducer and their references to
        # the process group are gone before it is destroyed (a gloo group freed later can abort the process).
        train(cfg, world, reporter, meter, output_dir=output_dir, job_name=job_name, started=started)
    finally:
        reporter.close()
        meter.close()
        dist.close()


def train(cfg: TrainSpec, world: Any, reporter: Any, meter: Any, *, output_dir: Path, job_name: str,
          started: float) -> None:  # fmt: skip
    """Build everything, resume, run the loop, write the results. Collective: every rank calls it."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from orchestrator.trainer import checkpoint, data, precision, report
    from orchestrator.trainer.evaluate import evaluate
    from orchestrator.trainer.schedule import Scheduler
    from orchestrator.trainer.step import train_step
    from orchestrator.trainer.tasks import build_task

    # --- task, model, optimizer, schedule, precision ----------------------------------------------
    checkpoint.seed_everything(cfg.seed, rank=0)  # identical data and initial weights on every rank
    if world.device.type == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)
    precision.set_tf32(cfg.tf32)
    task = build_task(cfg.task, cfg.task_args)
    module = task.model.to(world.device)
    micro = cfg.micro_batch(world.world_size)
    layout = data.Layout(
        len(cast(Sized, task.train_dataset)), cfg.batch_size, micro, world.world_size, cfg.seed
    )
    max_steps = cfg.max_steps or (cfg.epochs or 1) * layout.steps_per_epoch
    compiled = torch.compile(module) if cfg.compile else module  # compile first, then wrap (nanoGPT)
    model = DistributedDataParallel(
        compiled, device_ids=[world.device.index] if world.device.type == "cuda" else None
    )
    optimizer = build_optimizer(module, cfg.optimizer, fused=world.device.type == "cuda")
    scheduler = Scheduler(optimizer, cfg.schedule, cfg.optimizer.lr, max_steps)
    scaler = precision.grad_scaler(cfg.precision, world.device)
    autocast = precision.autocast(cfg.precision, world.device)
    checkpoints = checkpoint.Checkpointer(
        checkpoint_dir(output_dir, cfg.checkpoint.dir),
        every_steps=cfg.checkpoint.every_steps,
        keep=cfg.checkpoint.keep,
        rank=world.rank,
        world_size=world.world_size,
    )
    meter.set_restart_count(world.restart_count)

    # --- resume -----------------------------------------------------------------------------------
    step = 0
    counters: dict[str, Any] = {"skipped_steps": 0, "last_loss": None}
    state, state_path = checkpoints.load()
    if state is not None:
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        counters = state["counters"]
        step = state["step"]
        checkpoints.restore_rng(state, cfg.seed)
        reporter.say(f"resumed from {state_path} at step {step}")
    else:
        checkpoint.seed_everything(cfg.seed, world.rank)  # distinct dropout streams per rank
    resumed_from = step if state is not None else None
    del state

    def snapshot() -> dict[str, Any]:
        return {
            "model": module.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "counters": counters,
        }

    eval_batches = (
        data.eval_loader(task.eval_dataset, rank=world.rank, world_size=world.world_size, batch_size=micro)
        if task.eval_dataset is not None
        else None
    )

    def run_eval() -> dict[str, float]:
        if eval_batches is None:
            return {}
        return evaluate(
            module, eval_batches, loss_fn=task.loss_fn, metrics_fn=task.eval_metrics,
            autocast=autocast, device=world.device,
        )  # fmt: skip

    reporter.say(
        f"training {cfg.task} for {max_steps} steps: world {world.world_size} x micro-batch {micro} x "
        f"accumulation {layout.accumulation} = batch {cfg.batch_size}, {cfg.precision}, {world.device.type}"
    )

    # --- loop -------------------------------------------------------------------------------------
    batches = iter(
        data.train_loader(
            task.train_dataset, layout, rank=world.rank, start_step=step, end_step=max_steps,
            num_workers=cfg.num_workers, pin=world.device.type == "cuda",
        )
    )  # fmt: skip
    samples_per_rank = micro * layout.accumulation
    tokens_per_rank = samples_per_rank * (task.tokens_per_sample or 0)
    flops_per_rank = task.flops_per_sample * samples_per_rank if task.flops_per_sample else None
    # The loss is summed on the device and read only on log steps (reading it is a host sync).
    window_loss, window_updates = torch.zeros((), device=world.device), 0
    window_steps, window_seconds, train_seconds, first_step = 0, 0.0, 0.0, step
    while step < max_steps:
        step_started = time.perf_counter()
        lr = scheduler.set_lr(step)
        result = train_step(
            model, optimizer, scaler, batches, accumulation=layout.accumulation, loss_fn=task.loss_fn,
            autocast=autocast, grad_clip=cfg.grad_clip, device=world.device,
        )  # fmt: skip
        step += 1
        if not result.updated:
            if not scaler.is_enabled() and cfg.nonfinite_loss == "stop":
                raise NonFiniteLoss(
                    f"loss or gradient is not finite at step {step} (grad norm {result.grad_norm}); "
                    "lower train.optimizer.lr, check the data, or set train.nonfinite_loss: skip"
                )
            counters["skipped_steps"] += 1
        else:
            window_loss += result.loss
            window_updates += 1
        step_seconds = time.perf_counter() - step_started
        train_seconds += step_seconds
        window_steps, window_seconds = window_steps + 1, window_seconds + step_seconds

        log_now = step % cfg.log_every == 0 or step == max_steps
        loss_value = None
        if log_now:
            loss_value = mean_over_ranks(window_loss, window_updates)
            counters["last_loss"] = loss_value
            rate = window_steps / window_seconds if window_seconds > 0 else 0.0  # steps per second
            reporter.step(
                step=step, max_steps=max_steps, loss=loss_value, lr=lr, grad_norm=result.grad_norm,
                samples_per_second=rate * cfg.batch_size,
                eta_seconds=(max_steps - step) / rate if rate else 0.0,
                skipped=counters["skipped_steps"],
            )  # fmt: skip
            window_loss.zero_()
            window_updates, window_steps, window_seconds = 0, 0, 0.0
        meter.on_step(
            step=step, samples=samples_per_rank, tokens=tokens_per_rank, loss=loss_value, lr=lr,
            grad_norm=result.grad_norm, step_seconds=step_seconds,
            data_wait_seconds=result.data_wait_seconds,
            loss_scale=result.loss_scale, skipped=not result.updated, flops=flops_per_rank,
        )  # fmt: skip

        if cfg.eval_every and step % cfg.eval_every == 0 and step < max_steps:
            results = run_eval()
            reporter.evaluation(step=step, results=results)
            # plateau watches the eval loss, or the training loss when the task has no eval set
            watched = results.get("loss", counters["last_loss"])
            if watched is not None and scheduler.observe_loss(watched):
                reporter.say(f"loss plateaued: learning rate x {cfg.schedule.factor}")
        if checkpoints.due(step) and step < max_steps:
            checkpoints.save(step, snapshot())

    # --- the end: final checkpoint, evaluation, summary, model ------------------------------------
    if resumed_from != max_steps:
        checkpoints.save(step, snapshot())
    results = run_eval()
    if results:
        reporter.evaluation(step=step, results=results)
    samples_done = (step - first_step) * cfg.batch_size
    summary = {
        "job": job_name,
        "task": cfg.task,
        "steps": step,
        "samples": step * cfg.batch_size,
        "final_loss": counters["last_loss"],
        "eval": results,
        "samples_per_second": samples_done / train_seconds if train_seconds else None,
        "tokens_per_second": (
            samples_done * task.tokens_per_sample / train_seconds
            if task.tokens_per_sample and train_seconds
            else None
        ),
        "wall_seconds": time.perf_counter() - started,
        "train_seconds": train_seconds,
        "world_size": world.world_size,
        "batch_size": cfg.batch_size,
        "micro_batch_size": micro,
        "accumulation": layout.accumulation,
        "precision": cfg.precision,
        "device": world.device.type,
        "skipped_steps": counters["skipped_steps"],
        "loss_scale": scaler.get_scale() if scaler.is_enabled() else None,
        "resumed_from_step": resumed_from,
        "restarts": world.restart_count,
    }
    if world.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.write_atomic(output_dir / "model.pt", module.state_dict())
        report.write_json(output_dir / "summary.json", summary)
        reporter.event("done", **summary)
        accuracy = results.get("accuracy")
        reporter.say(
            f"done: {step} steps, final loss {fmt(counters['last_loss'])}"
            + (f", eval accuracy {accuracy:.4f}" if accuracy is not None else "")
            + (f", eval loss {results['loss']:.4f}" if "loss" in results else "")
            + f" -> {output_dir / 'summary.json'}"
        )
    # Leave together: no rank tears down its connections while rank 0 is still writing files.
    torch.distributed.barrier()


def build_optimizer(module: Any, cfg: Any, *, fused: bool) -> Any:
    import torch

    params = module.parameters()
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    optimizer_class = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam
    # fused kernels on CUDA: one launch for all parameters instead of a loop of small ones
    return optimizer_class(
        params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, fused=fused or None
    )


def checkpoint_dir(output_dir: Path, configured: str | None) -> Path:
    if configured is None:
        return output_dir / "checkpoints"
    return output_dir / configured  # an absolute `configured` replaces output_dir (pathlib's `/`)


def mean_over_ranks(window_loss: Any, steps: int) -> float:
    """Mean training loss of the window over all ranks. A collective and a host sync: log steps only."""
    import torch
    import torch.distributed as torch_dist

    totals = torch.stack([window_loss.float(), torch.tensor(float(steps), device=window_loss.device)])
    torch_dist.all_reduce(totals)  # SUM: gloo has no AVG
    loss_sum, step_count = totals.tolist()
    return loss_sum / step_count if step_count else math.nan


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
