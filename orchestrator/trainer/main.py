"""The training entrypoint, run once per process by torchrun (in a pod) or by `orch run` (here).

    torchrun --nproc-per-node=4 -m orchestrator.trainer --config train.json

Reads top to bottom: config -> process group -> task, model, optimizer, schedule, precision, metrics,
checkpoints -> resume -> loop -> final checkpoint, evaluation, summary.json and model.pt -> close.
A SIGTERM or first Ctrl-C ends the loop early with a checkpoint; `main` then returns 128+signal (stop.py).
The config is the `train:` section of job.yaml as JSON; the launcher's runtime facts come from the ORCH_*
environment (orchestrator/runtime_env.py, read once here) and the process's place from torchrun's (dist.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Sized
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from orchestrator import runtime_env

if TYPE_CHECKING:
    import torch

    from orchestrator.runtime_env import RuntimeEnv
    from orchestrator.spec import OptimizerSpec, TrainSpec
    from orchestrator.trainer.dist import Dist
    from orchestrator.trainer.metrics import Meter
    from orchestrator.trainer.report import Reporter
    from orchestrator.trainer.stop import StopRequest
    from orchestrator.trainer.tracking import NullTracker


class NonFiniteLoss(RuntimeError):
    """The loss or gradient became inf/NaN in fp32 or bf16 (fp16 overflows are the scaler's business)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.trainer", description=__doc__)
    parser.add_argument("--config", required=True, help="JSON file with the job's train section")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train; the process's exit code: 0, or 128+signal after a stop on SIGTERM/SIGINT (checkpoint written)."""
    started = time.perf_counter()
    # --- config: train.json and the launcher's ORCH_* environment ------------------------------------
    cfg = runtime_env.load_train_json(Path(parse_args(argv).config).read_text(encoding="utf-8"))
    runtime = runtime_env.RuntimeEnv.from_environ()
    # The CUDA allocator and cuBLAS read these once, at first use: set them before torch touches the GPU.
    if cfg.cuda_alloc_conf:
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", cfg.cuda_alloc_conf)
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (CUDA docs)

    from orchestrator.trainer import compat, dist, metrics, report, stop, tracking

    torch_version = compat.check_torch()  # one line and exit, before anything else, on a torch too old

    # --- process group, reporter, metrics -------------------------------------------------------------
    world = dist.init(timeout=timedelta(seconds=cfg.collective_timeout))
    reporter = report.Reporter(
        enabled=world.is_main, lines=runtime.log_lines, events_file=runtime.progress_file
    )
    reporter.say(f"torch {torch_version}: {world.num_nodes} node(s) x {world.local_world_size} process(es)")
    meter = metrics.build_metrics(
        runtime,
        rank=world.rank,
        local_rank=world.local_rank,
        node_rank=world.node_rank,
        device=str(world.device),
        collective_timeout_seconds=cfg.collective_timeout,
    )
    # MLflow / TensorBoard on rank 0 (job.yaml's `tracking:`); a tracker that does nothing anywhere else.
    tracker = tracking.build(
        runtime.tracking,
        enabled=world.is_main,
        job_name=runtime.job_name,
        output_dir=Path(runtime.output_dir),
    )
    tracker.log_params(tracking.job_params(cfg.model_dump(mode="json"), world, runtime.tracking))
    # SIGTERM (preemption, drain, delete) or the first Ctrl-C: the loop finishes its step, checkpoints and
    # returns; the handlers are installed for the whole run so a signal during setup is not lost.
    stop_request = stop.StopRequest(
        device=world.device, world_size=world.world_size, enabled=cfg.checkpoint.on_stop > 0
    )
    stop_request.install()
    failed = True
    try:
        # The training body is its own function so that the model, DDP's reducer and their references to
        # the process group are gone before it is destroyed (a gloo group freed later can abort the process).
        stopped_by = train(cfg, runtime, world, reporter, meter, tracker, stop_request, started=started)
        failed = stopped_by != 0  # a stopped run is unfinished: its MLflow run continues on resume
    finally:
        stop_request.restore()  # what is left (closing, tracking's deadline) a signal may cut short
        tracking.finish(tracker, Path(runtime.output_dir), failed=failed)  # what was not sent is said here
        reporter.close()
        meter.close()
        dist.close()
    return stop.exit_code(stopped_by) if stopped_by else 0


def train(
    cfg: TrainSpec,
    runtime: RuntimeEnv,
    world: Dist,
    reporter: Reporter,
    meter: Meter,
    tracker: NullTracker,
    stop_request: StopRequest,
    *,
    started: float,
) -> int:
    """Build everything, resume, run the loop, write the results. Collective: every rank calls it.
    Returns 0, or the signal that stopped the loop early (after writing a checkpoint)."""
    import torch

    from orchestrator import storage
    from orchestrator.trainer import checkpoint, data, parallel, precision, report, tracking
    from orchestrator.trainer.evaluate import evaluate
    from orchestrator.trainer.schedule import Scheduler, lr_at
    from orchestrator.trainer.step import train_step
    from orchestrator.trainer.tasks import build_task

    # --- task, model, optimizer, schedule, precision ----------------------------------------------
    output_dir = Path(runtime.output_dir)
    # What the run keeps (checkpoints, model.pt, summary.json, TensorBoard's events) goes to the object
    # store when there is one; a store that cannot be written to stops every rank here, in one line.
    kept = storage.location(runtime.output_url) if runtime.output_url else output_dir
    checkpoint.check_stores([runtime.output_url, cfg.checkpoint.dir], rank=world.rank)
    checkpoint.seed_everything(cfg.seed, rank=0)  # identical data and initial weights on every rank
    if cfg.deterministic:  # off by default: it costs speed (about 9% on CPU, more with some CUDA kernels)
        torch.use_deterministic_algorithms(True, warn_only=True)
    if world.device.type == "cuda":  # TF32 is a GPU matter; on CPU it would change oneDNN's fp32 matmuls
        precision.set_tf32(cfg.tf32)
    task = build_task(cfg.task, cfg.task_args)
    module = task.model.to(world.device)
    micro = cfg.micro_batch(world.world_size)
    stream = task.train_dataset if isinstance(task.train_dataset, data.ShardedStream) else None
    if stream is None and isinstance(task.train_dataset, torch.utils.data.IterableDataset):
        raise TypeError(
            "Task.train_dataset is an IterableDataset: give its shards as "
            "orchestrator.trainer.data.ShardedStream(shards, sizes, read) so that orch can split, shuffle and "
            "resume it exactly (docs/tasks.md, Streaming datasets)"
        )
    layout = data.Layout(
        len(cast(Sized, task.train_dataset)), cfg.batch_size, micro, world.world_size, cfg.seed
    )
    max_steps = cfg.max_steps or (cfg.epochs or 1) * layout.steps_per_epoch
    # DDP or FSDP (parallel.py); under FSDP `module`'s parameters are now this rank's shards.
    wrapped = parallel.wrap(
        module, mode=cfg.parallel, device=world.device, world_size=world.world_size,
        precision=cfg.precision, compile=cfg.compile, shard_units=task.shard_units,
        reshard_after_forward=cfg.fsdp.reshard_after_forward,
    )  # fmt: skip
    model = wrapped.model
    fused = world.device.type == "cuda"  # fused AdamW/Adam: one kernel launch for all parameters
    optimizer = build_optimizer(module, cfg.optimizer, fused=fused)
    memory = parallel.MemoryMeter(module, optimizer, world.device, publish=meter.set_memory)
    scheduler = Scheduler(optimizer, cfg.schedule, cfg.optimizer.lr, max_steps)
    scaler = parallel.grad_scaler(cfg.precision, world.device, cfg.parallel)
    autocast = precision.autocast(cfg.precision, world.device)
    checkpoints = checkpoint.Checkpointer(
        checkpoint_dir(kept, cfg.checkpoint.dir),
        every_steps=cfg.checkpoint.every_steps,
        keep=cfg.checkpoint.keep,
        rank=world.rank,
        world_size=world.world_size,
        mode=cfg.parallel,
        async_save=cfg.checkpoint.async_,
    )
    meter.set_restart_count(world.restart_count)

    # --- resume -----------------------------------------------------------------------------------
    step, counters, resumed_from = 0, None, None
    # Every rank reads its own part of the newest complete checkpoint (model and optimizer loaded here).
    resumed = checkpoints.load(module=module, optimizer=optimizer)
    if resumed is not None:
        stretched = scheduler.load_state_dict(resumed.state["scheduler"])
        scaler.load_state_dict(resumed.state["scaler"])
        counters = resumed.state["counters"]
        step = resumed_from = resumed.step
        checkpoints.restore_rng(resumed.state, cfg.seed)
        reporter.say(f"resumed from {resumed.path} at step {step}")
        # The sample order the run started with goes on (checkpoints before orch's Feistel order had none).
        layout = dataclasses.replace(layout, order=resumed.state.get("data_order", data.ORDER_RANDPERM))
        if layout.order != data.ORDER_FEISTEL:
            reporter.say(f"this run keeps the sample order of the version that started it ({layout.order})")
        saved_split = (resumed.state.get("world_size"), resumed.state.get("num_workers"))
        if stream is not None and saved_split != (world.world_size, cfg.num_workers):
            reporter.say(
                f"warning: the stream was split for world size {saved_split[0]} x {saved_split[1]} workers, "
                f"now {world.world_size} x {cfg.num_workers}: until the next epoch some samples may be read "
                "twice and others not at all (docs/tasks.md, Streaming datasets)"
            )
        if stretched:
            old_lr = lr_at(step, cfg.schedule, cfg.optimizer.lr, resumed.state["scheduler"]["max_steps"])
            new_lr = lr_at(step, cfg.schedule, cfg.optimizer.lr, max_steps)
            reporter.say(f"note: {stretched}; learning rate at step {step}: {old_lr:.3g} -> {new_lr:.3g}")
    else:
        checkpoint.seed_everything(cfg.seed, world.rank)  # distinct dropout streams per rank
    # A resumed job continues its MLflow run; TensorBoard drops what the last attempt wrote after `step`.
    tracker.start(saved=(resumed.state.get("tracking") or {}) if resumed is not None else {}, step=step)
    del resumed
    samples_per_rank = micro * layout.accumulation
    work = report.Workload(
        samples=samples_per_rank,
        tokens=samples_per_rank * (task.tokens_per_sample or 0),
        flops=task.flops_per_sample * samples_per_rank if task.flops_per_sample else None,
    )
    progress = report.Progress(
        step=step, max_steps=max_steps, batch_size=cfg.batch_size, work=work, device=world.device,
        counters=counters,
    )  # fmt: skip

    def save_checkpoint() -> None:
        train_state = {
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "counters": progress.counters(),
            "data_order": layout.order,
            "num_workers": cfg.num_workers,  # a stream's split depends on it (data.ShardedStream)
            "tracking": tracker.state(),  # the MLflow run's key and id, from rank 0, which writes the checkpoint
        }
        checkpoints.save(step, module=module, optimizer=optimizer, train_state=train_state)
        if world.is_main and kept is not output_dir and runtime.tracking.tensorboard_dir:
            # TensorBoard writes locally; its events so far travel with each checkpoint
            storage.upload(
                output_dir / runtime.tracking.tensorboard_dir, kept / runtime.tracking.tensorboard_dir
            )

    eval_batches = (
        data.eval_loader(task.eval_dataset, rank=world.rank, world_size=world.world_size, batch_size=micro)
        if task.eval_dataset is not None
        else None
    )

    def run_eval(step: int) -> dict[str, Any]:
        """Evaluate; the task's own numbers (on_eval) join the results; every sink but the reporter gets them."""
        if eval_batches is None:
            return {}
        results: dict[str, Any] = evaluate(
            module, eval_batches, loss_fn=task.loss_fn, metrics_fn=task.eval_metrics,
            autocast=autocast, device=world.device,
        )  # fmt: skip
        extra = tracking.hook_scalars(task.on_eval(step, dict(results)), "on_eval")
        results.update(extra)
        meter.on_task_metrics(tracking.numeric(extra))
        tracker.log_metrics(step, tracking.prefixed("eval", results))
        return results

    reporter.say(
        f"training {cfg.task} for {max_steps} steps: world {world.world_size} x micro-batch {micro} x "
        f"accumulation {layout.accumulation} = batch {cfg.batch_size}, {cfg.precision}, {cfg.parallel}, "
        f"{world.device.type}"
        + (f", fused {OPTIMIZER_NAMES[cfg.optimizer.name]}" if fused and cfg.optimizer.name != "sgd" else "")
        + (", torch.compile" if cfg.compile else "")
    )

    # --- loop -------------------------------------------------------------------------------------
    loader = data.stream_loader if stream is not None else data.train_loader
    batches = iter(
        loader(
            task.train_dataset, layout, rank=world.rank, start_step=step, end_step=max_steps,  # type: ignore[arg-type]
            num_workers=cfg.num_workers, pin=world.device.type == "cuda",
        )
    )  # fmt: skip
    while step < max_steps:
        step_started = time.perf_counter()
        lr = scheduler.set_lr(step)
        result = train_step(
            model, optimizer, scaler, batches, accumulation=layout.accumulation, loss_fn=task.loss_fn,
            autocast=autocast, grad_clip=cfg.grad_clip, device=world.device,
        )  # fmt: skip
        stats = progress.record(result, lr=lr, seconds=time.perf_counter() - step_started)
        step = stats.step
        # every rank, every step, the same answer (one small all-reduce); the last step just finishes
        stopping = stop_request.agreed() if step < max_steps else 0
        if stats.skipped and not scaler.is_enabled() and cfg.nonfinite_loss == "stop":
            raise NonFiniteLoss(
                f"loss or gradient is not finite at step {step} (grad norm {result.grad_norm}); "
                "lower train.optimizer.lr, check the data, or set train.nonfinite_loss: skip"
            )
        if step % cfg.log_every == 0 or step == max_steps:
            # The loss and the fp16 scale are read here only: a collective and host syncs.
            stats = progress.log(stats, loss_scale=precision.loss_scale(scaler))
            logged = tracking.step_metrics(stats)  # loss, lr, grad_norm, samples_per_second
            extra = tracking.hook_scalars(task.on_log(step, dict(logged)), "on_log")
            reporter.step(stats, extra)
            meter.on_task_metrics(tracking.numeric(extra))
            tracker.log_metrics(step, tracking.prefixed("train", {**logged, **extra}))
        meter.on_step(stats)

        if cfg.eval_every and step % cfg.eval_every == 0 and step < max_steps and not stopping:
            results = run_eval(step)
            reporter.evaluation(step=step, results=results)
            # plateau watches the eval loss, or the training loss when the task has no eval set
            watched = results.get("loss", progress.last_loss)
            if watched is not None and scheduler.observe_loss(watched):
                reporter.say(f"loss plateaued: learning rate x {cfg.schedule.factor}")
        checkpoints.poll()  # async saves: a finished write is put in place
        if (checkpoints.due(step) or stopping) and step < max_steps:
            save_checkpoint()
        if stopping:
            checkpoints.close()  # async: the stop checkpoint is on disk and in place before the exit
            name = signal_name(stopping)
            reporter.say(
                f"stopped by {name} at step {step}/{max_steps}: checkpoint written, resume to continue"
            )
            reporter.event("stopped", step=step, max_steps=max_steps, signal=name)
            return stopping

    # --- the end: final checkpoint, evaluation, summary, model ------------------------------------
    if resumed_from != max_steps and runtime.final_save:
        save_checkpoint()
    checkpoints.close()  # async: the last write is on disk and in place
    results = run_eval(step)
    if results:
        reporter.evaluation(step=step, results=results)
    summary = report.summary(
        job=runtime.job_name, train=cfg, progress=progress, world_size=world.world_size,
        nodes=world.num_nodes, micro_batch_size=micro, accumulation=layout.accumulation, device=world.device.type,
        tokens_per_sample=task.tokens_per_sample, results=results, loss_scale=precision.loss_scale(scaler),
        resumed_from=resumed_from, restarts=world.restart_count, wall_seconds=time.perf_counter() - started,
    )  # fmt: skip
    summary["parallel"] = cfg.parallel
    summary["memory"] = memory_over_ranks(memory.report())
    # collective under FSDP: gathered to rank 0 (benchmark runs write no model: ORCH_FINAL_SAVE=0)
    final_model = checkpoint.full_model_state(module) if runtime.final_save else None
    if world.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        if final_model is not None:
            checkpoint.write_atomic(output_dir / "model.pt", final_model)
        report.write_json(output_dir / "summary.json", summary)
        if kept is not output_dir:  # the local copies stay: `orch run` reads summary.json, MLflow the model
            tensorboard = [runtime.tracking.tensorboard_dir] if runtime.tracking.tensorboard_dir else []
            for name in ["model.pt", "summary.json", *tensorboard]:
                storage.upload(output_dir / name, kept / name)
        model_file = [output_dir / "model.pt"] if runtime.tracking.mlflow_log_model else []
        tracker.log_artifacts([output_dir / "summary.json", *model_file])
        reporter.done(summary, summary_file=output_dir / "summary.json")
    # Leave together: no rank tears down its connections while rank 0 is still writing files.
    torch.distributed.barrier()
    return 0


def signal_name(number: int) -> str:
    import signal

    return signal.Signals(number).name


OPTIMIZER_NAMES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}


def build_optimizer(module: torch.nn.Module, cfg: OptimizerSpec, *, fused: bool) -> torch.optim.Optimizer:
    import torch

    params = module.parameters()
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    optimizer_class = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam
    # fused kernels on CUDA: one launch for all parameters instead of a loop of small ones
    return optimizer_class(
        params,
        lr=cfg.lr,
        betas=(cfg.betas[0], cfg.betas[1]),
        weight_decay=cfg.weight_decay,
        fused=fused or None,
    )


def memory_over_ranks(mine: dict[str, int | None]) -> dict[str, int | None]:
    """Per-rank memory (bytes of parameters, gradients, optimizer state as held; CUDA peak), the largest
    over the ranks: the rank that decides whether the job fits. A collective."""
    import torch.distributed as torch_dist

    reports: list[Any] = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(reports, mine)
    return {key: max((r[key] for r in reports if r[key] is not None), default=None) for key in mine}


def checkpoint_dir(output_dir: Any, configured: str | None) -> Any:
    from orchestrator import storage

    if configured is None:
        return output_dir / "checkpoints"
    if storage.is_url(configured):
        return storage.location(configured)
    return output_dir / configured  # an absolute `configured` replaces output_dir (pathlib's `/`)
