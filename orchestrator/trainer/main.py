"""The training entrypoint, run once per process by torchrun (in a pod) or by `orch run` (here).

    torchrun --nproc-per-node=4 -m orchestrator.trainer --config train.json

Reads top to bottom: `main` (config -> process group, reporter, metrics, tracking, the heartbeat -> train ->
close) and `train`, four sections of a screen each: set up (`set_up`: task, data, model, optimizer, schedule,
precision, checkpoints, held by a `Trainer`) -> resume -> the loop (one optimizer step per iteration: step,
log, eval, checkpoint, stop) -> the end (`finish`: final checkpoint, evaluation, summary.json and model.pt).
The `with timeline...` lines mark the phases (timeline.py): the goodput journal counts their seconds and the
heartbeat says where a rank stopped.
A SIGTERM or first Ctrl-C ends the loop early with a checkpoint; `main` then returns 128+signal (stop.py).
The config is the `train:` section of job.yaml as JSON; the launcher's runtime facts come from the ORCH_*
environment (orchestrator/runtime_env.py, read once here) and the process's place from torchrun's (dist.py).

Over 600 lines, kept whole: this is the loop and what ties its parts together, read in one pass as nanoGPT's
train.py is; each part with state or rules of its own is a module beside it (docs/trainer.md's table).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Sized
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from orchestrator import outputs, runtime_env
from orchestrator.trainer.timeline import Timeline

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

    from orchestrator.runtime_env import RuntimeEnv
    from orchestrator.trainer.checkpoint import Checkpointer
    from orchestrator.trainer.config import OptimizerSpec, TrainSpec
    from orchestrator.trainer.data import Layout, ShardedStream
    from orchestrator.trainer.dist import Dist
    from orchestrator.trainer.heartbeat import NullHeartbeat
    from orchestrator.trainer.journal import NullJournal
    from orchestrator.trainer.metrics import Meter
    from orchestrator.trainer.objective import ObjectiveReport
    from orchestrator.trainer.parallel import MemoryMeter
    from orchestrator.trainer.report import Progress, Reporter, StepStats
    from orchestrator.trainer.schedule import Scheduler
    from orchestrator.trainer.stop import StopRequest
    from orchestrator.trainer.tasks import Task
    from orchestrator.trainer.tracking import NullTracker


class NonFiniteLoss(RuntimeError):
    """The loss or gradient became inf/NaN in fp32 or bf16 (fp16 overflows are the scaler's business)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.trainer", description=__doc__)
    parser.add_argument("--config", required=True, help="JSON file with the job's train section")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train; the process's exit code: 0, or 128+signal after a stop on SIGTERM/SIGINT (checkpoint written)."""
    timeline = Timeline()  # in phase `startup` since the process started
    started = time.perf_counter()
    # --- config: train.json and the launcher's ORCH_* environment ------------------------------------
    cfg = runtime_env.load_train_json(Path(parse_args(argv).config).read_text(encoding="utf-8"))
    runtime = runtime_env.RuntimeEnv.from_environ()
    # The CUDA allocator and cuBLAS read these once, at first use: set them before torch touches the GPU.
    if cfg.cuda_alloc_conf:
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", cfg.cuda_alloc_conf)
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (CUDA docs)

    from orchestrator.trainer import compat, dist, metrics, preflight, report, stop, tracking

    torch_version = compat.check_torch()  # one line and exit, before anything else, on a torch too old

    # --- process group, reporter, metrics -------------------------------------------------------------
    world = dist.init(timeout=timedelta(seconds=cfg.collective_timeout))
    reporter = report.Reporter(
        enabled=world.is_main, lines=runtime.log_lines, events_file=runtime.progress_file
    )
    reporter.say(f"torch {torch_version}: {world.num_nodes} node(s) x {world.local_world_size} process(es)")
    # --- pre-flight check (train.preflight): a bad or far slower rank stops the job here, named -----------
    preflight.run(cfg.preflight, world, output_dir=Path(runtime.output_dir), say=reporter.say)
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
        device=world.device, world_size=world.world_size, enabled=cfg.checkpoint.on_stop > 0,
        prune_file=runtime.prune_file, watches_store=world.is_main,
    )  # fmt: skip
    stop_request.install()
    failed = True
    # Rank 0's goodput journal; every rank's heartbeat (hang verdicts) and its stack on demand (orch stacks).
    journal, heartbeat = watch(timeline, cfg, runtime, world, meter)
    try:
        # The training body is its own function so that the model, DDP's reducer and their references to
        # the process group are gone before it is destroyed (a gloo group freed later can abort the process).
        stopped_by = train(cfg, runtime, world, reporter, meter, tracker, stop_request, started=started,
                           timeline=timeline, journal=journal)  # fmt: skip
        failed = stopped_by != 0  # a stopped run is unfinished: its MLflow run continues on resume
    finally:
        journal.end("failed")  # unless it ended already (finished, stopped)
        heartbeat.stop()
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
    timeline: Timeline,
    journal: NullJournal,
) -> int:
    """Set up, resume, run the loop, write the results. Collective: every rank calls it.
    Returns 0, or the signal that stopped the loop early (after writing a checkpoint)."""
    from orchestrator.trainer.step import train_step
    from orchestrator.trainer.stop import PRUNED

    # --- set up: task, data, model (DDP/FSDP), optimizer, schedule, precision, checkpoints -------------
    with timeline.phase("setup"):
        trainer = set_up(cfg, runtime, world, reporter, meter, tracker)

    # --- resume: the newest complete checkpoint, or step 0 ------------------------------------------
    with timeline.phase("checkpoint_load"):
        resumed_from, counters = resume(trainer)
    progress = trainer.start_progress(step=resumed_from or 0, counters=counters)
    reporter.say(trainer.describe())
    timeline.at_step(progress.step)
    journal.begin(resumed_from=resumed_from)  # a restart that resumes here keeps everything until now

    # --- the loop: one optimizer step per iteration ---------------------------------------------------
    max_steps, checkpoints = trainer.max_steps, trainer.checkpoints
    batches = trainer.batches(start_step=progress.step)
    stopping = 0
    while progress.step < max_steps:
        with timeline.step(progress.step + 1):  # data, forward, backward, optimizer marked in train_step
            step_started = time.perf_counter()
            lr = trainer.scheduler.set_lr(progress.step)
            # forward and backward over the accumulation's micro-batches under autocast, one gradient reduction
            result = train_step(
                trainer.model, trainer.optimizer, trainer.scaler, batches,
                accumulation=trainer.layout.accumulation, loss_fn=trainer.task.loss_fn, autocast=trainer.autocast,
                grad_clip=cfg.grad_clip, device=world.device, timeline=timeline,
            )  # fmt: skip
            stats = progress.record(result, lr=lr, seconds=time.perf_counter() - step_started)
            step = stats.step
            # every rank, every step, the same answer (one small all-reduce); the last step just finishes
            stopping = stop_request.agreed() if step < max_steps else 0
            if stats.skipped and not trainer.scaler.is_enabled() and cfg.nonfinite_loss == "stop":
                raise NonFiniteLoss(
                    f"loss or gradient is not finite at step {step} (grad norm {result.grad_norm}); "
                    "lower train.optimizer.lr, check the data, or set train.nonfinite_loss: skip"
                )
            if step % cfg.log_every == 0 or step == max_steps:
                stats = trainer.log_step(stats, progress)
            meter.on_step(stats)
            if stopping == PRUNED:  # `orch sweep` pruned this trial: it ends here, as a finished run does
                reporter.say(f"pruned by orch sweep at step {step}/{max_steps}")
                break

            if cfg.eval_every and step % cfg.eval_every == 0 and step < max_steps and not stopping:
                with timeline.phase("eval"):
                    results = trainer.evaluate(step)
                reporter.evaluation(step=step, results=results)
                # plateau watches the eval loss, or the training loss when the task has no eval set
                watched = results.get("loss", progress.last_loss)
                if watched is not None and trainer.scheduler.observe_loss(watched):
                    reporter.say(f"loss plateaued: learning rate x {cfg.schedule.factor}")
            checkpoints.poll()  # async saves: a finished write is put in place
            if (checkpoints.due(step) or stopping) and step < max_steps:
                with timeline.phase("checkpoint_save"):
                    trainer.save_checkpoint(step, progress)
                journal.kept(step)  # a restart that resumes from this checkpoint keeps everything until now
            if stopping:  # SIGTERM or Ctrl-C, agreed by every rank: the checkpoint above is the last thing
                checkpoints.close()  # async: the stop checkpoint is on disk and in place before the exit
                name = signal_name(stopping)
                reporter.say(
                    f"stopped by {name} at step {step}/{max_steps}: checkpoint written, resume to continue"
                )
                reporter.event("stopped", step=step, max_steps=max_steps, signal=name)
                journal.end("stopped")
                return stopping

    # --- the end: final checkpoint, evaluation, summary.json, model.pt --------------------------------
    with timeline.phase("checkpoint_save"):  # the results are saved; the evaluation is marked inside
        finish(
            trainer,
            progress,
            resumed_from=resumed_from,
            started=started,
            timeline=timeline,
            journal=journal,
            pruned=stopping == PRUNED,
        )
    return 0


@dataclass
class Trainer:
    """The parts of one run, built by `set_up` and used by the loop in `train` (as torchtitan's Trainer lists
    its parts; the loop itself stays in `train`, nanoGPT's way, so that it reads top to bottom)."""

    cfg: TrainSpec
    runtime: RuntimeEnv
    world: Dist
    reporter: Reporter
    meter: Meter
    tracker: NullTracker
    task: Task
    module: torch.nn.Module
    """The task's model on the device: what checkpoints save and load (under FSDP, this rank's shards)."""
    model: torch.nn.Module
    """`module` wrapped for data parallelism (DDP, FSDP) and compiled when asked: what the step runs."""
    optimizer: torch.optim.Optimizer
    fused: bool
    """Fused AdamW/Adam kernels (CUDA): one launch for all parameters."""
    scheduler: Scheduler
    scaler: torch.amp.GradScaler
    """fp16 only; disabled (it does nothing) for fp32 and bf16."""
    autocast: Callable[[], AbstractContextManager[Any]]
    memory: MemoryMeter
    layout: Layout
    """Which samples each rank reads at each step; a resume may change its order to the saved run's."""
    stream: ShardedStream | None
    """The training set when it is a stream of shards; None for a map-style dataset."""
    max_steps: int
    eval_batches: DataLoader[Any] | None
    checkpoints: Checkpointer
    kept: Any
    """Where the run's results are kept: the output directory, or the object store's location (output_url)."""
    objective: ObjectiveReport
    """`orch sweep`'s metric, written to objective.json at each value (nothing when not in a sweep)."""

    @property
    def output_dir(self) -> Path:
        return Path(self.runtime.output_dir)

    def start_progress(self, *, step: int, counters: dict[str, Any] | None) -> Progress:
        """The loop's counters from `step` on (with a checkpoint's totals when resumed)."""
        from orchestrator.trainer import report

        samples_per_rank = self.layout.micro_batch_size * self.layout.accumulation
        work = report.Workload(
            samples=samples_per_rank,
            tokens=samples_per_rank * (self.task.tokens_per_sample or 0),
            flops=self.task.flops_per_sample * samples_per_rank if self.task.flops_per_sample else None,
        )
        return report.Progress(
            step=step, max_steps=self.max_steps, batch_size=self.cfg.batch_size, work=work,
            device=self.world.device, counters=counters,
        )  # fmt: skip

    def describe(self) -> str:
        """Rank 0's line before the first step: what runs, how the batch is split, which kernels."""
        cfg, world, layout = self.cfg, self.world, self.layout
        fused = (
            f", fused {OPTIMIZER_NAMES[cfg.optimizer.name]}"
            if self.fused and cfg.optimizer.name != "sgd"
            else ""
        )
        compiled = ", torch.compile" if cfg.compile else ""
        return (
            f"training {cfg.task} for {self.max_steps} steps: world {world.world_size} x micro-batch "
            f"{layout.micro_batch_size} x accumulation {layout.accumulation} = batch {cfg.batch_size}, "
            f"{cfg.precision}, {cfg.parallel}, {world.device.type}{fused}{compiled}"
        )

    def batches(self, *, start_step: int) -> Iterator[Any]:
        """This rank's micro-batches from `start_step` to the end: a resume starts at a later step."""
        from orchestrator.trainer import data

        loader = data.stream_loader if self.stream is not None else data.train_loader
        return iter(
            loader(
                self.task.train_dataset, self.layout, rank=self.world.rank, start_step=start_step,  # type: ignore[arg-type]
                end_step=self.max_steps, num_workers=self.cfg.num_workers, pin=self.world.device.type == "cuda",
            )
        )  # fmt: skip

    def log_step(self, stats: StepStats, progress: Progress) -> StepStats:
        """A log step: the window's loss and rates to the log line, the metrics and the tracker. A collective."""
        from orchestrator.trainer import precision, tracking

        # The loss and the fp16 scale are read here only: a collective and host syncs.
        stats = progress.log(stats, loss_scale=precision.loss_scale(self.scaler))
        logged = tracking.step_metrics(stats)  # loss, lr, grad_norm, samples_per_second
        extra = tracking.hook_scalars(self.task.on_log(stats.step, dict(logged)), "on_log")
        self.reporter.step(stats, extra)
        self.objective.logged(stats.step, {**logged, **extra})
        self.meter.on_task_metrics(tracking.numeric(extra))
        self.tracker.log_metrics(stats.step, tracking.prefixed("train", {**logged, **extra}))
        return stats

    def evaluate(self, step: int) -> dict[str, Any]:
        """Evaluate; the task's own numbers (on_eval) join the results; every sink but the reporter gets them."""
        from orchestrator.trainer import tracking
        from orchestrator.trainer.evaluate import evaluate

        if self.eval_batches is None:
            return {}
        results: dict[str, Any] = evaluate(
            self.module, self.eval_batches, loss_fn=self.task.loss_fn, metrics_fn=self.task.eval_metrics,
            autocast=self.autocast, device=self.world.device,
        )  # fmt: skip
        extra = tracking.hook_scalars(self.task.on_eval(step, dict(results)), "on_eval")
        results.update(extra)
        self.objective.evaluated(step, results)
        self.meter.on_task_metrics(tracking.numeric(extra))
        self.tracker.log_metrics(step, tracking.prefixed("eval", results))
        return results

    def save_checkpoint(self, step: int, progress: Progress) -> None:
        """Model, optimizer and what a resume needs to go on as if uninterrupted. A collective."""
        from orchestrator import storage
        from orchestrator.trainer import data

        train_state = {
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "counters": progress.counters(),
            "data_order": self.layout.order,
            "data": data.record(self.layout, self.stream, self.cfg.num_workers),  # what a resume compares
            "tracking": self.tracker.state(),  # the MLflow run's key and id, from rank 0, which writes the checkpoint
        }
        self.checkpoints.save(step, module=self.module, optimizer=self.optimizer, train_state=train_state)
        tensorboard_dir = self.runtime.tracking.tensorboard_dir
        if self.world.is_main and self.runtime.output_url and tensorboard_dir:
            # TensorBoard writes locally; its events so far travel with each checkpoint
            try:
                storage.upload(self.output_dir / tensorboard_dir, self.kept / tensorboard_dir)
            except Exception as error:  # the checkpoint is kept; the run's end copies them again (or fails)
                self.reporter.say(
                    f"warning: TensorBoard's events could not be copied to {self.kept / tensorboard_dir}: "
                    f"{storage.describe(error)}; tried again at the next checkpoint and at the end"
                )


def set_up(
    cfg: TrainSpec, runtime: RuntimeEnv, world: Dist, reporter: Reporter, meter: Meter, tracker: NullTracker
) -> Trainer:
    """Seeds, task, data layout, model, optimizer, schedule, precision, checkpoints. Collective."""
    import torch

    from orchestrator.trainer import checkpoint, data, parallel, precision
    from orchestrator.trainer.objective import ObjectiveReport
    from orchestrator.trainer.schedule import Scheduler
    from orchestrator.trainer.tasks import build_task

    # What the run keeps (checkpoints, model.pt, summary.json, TensorBoard's events) goes to the object
    # store when there is one; a store that cannot be written to stops every rank here, in one line.
    kept = kept_location(runtime)
    checkpoint.check_stores([runtime.output_url, cfg.checkpoint.dir], rank=world.rank)
    checkpoint.seed_everything(cfg.seed, rank=0)  # identical data and initial weights on every rank
    if cfg.deterministic:  # off by default: it costs speed (about 9% on CPU, more with some CUDA kernels)
        torch.use_deterministic_algorithms(True, warn_only=True)
    if world.device.type == "cuda":  # TF32 is a GPU matter; on CPU it would change oneDNN's fp32 matmuls
        precision.set_tf32(cfg.tf32)
    task = build_task(cfg.task, cfg.task_args)
    module = task.model.to(world.device)
    layout, stream = train_layout(task, cfg, world.world_size)
    max_steps = cfg.max_steps or (cfg.epochs or 1) * layout.steps_per_epoch
    # DDP or FSDP (parallel.py); under FSDP `module`'s parameters are now this rank's shards.
    wrapped = parallel.wrap(
        module, mode=cfg.parallel, device=world.device, world_size=world.world_size,
        precision=cfg.precision, compile=cfg.compile, shard_units=task.shard_units,
        reshard_after_forward=cfg.fsdp.reshard_after_forward,
    )  # fmt: skip
    fused = world.device.type == "cuda"  # fused AdamW/Adam: one kernel launch for all parameters
    optimizer = build_optimizer(module, cfg.optimizer, fused=fused)
    memory = parallel.MemoryMeter(module, optimizer, world.device, publish=meter.set_memory)
    scheduler = Scheduler(optimizer, cfg.schedule, cfg.optimizer.lr, max_steps)
    scaler = parallel.grad_scaler(cfg.precision, world.device, cfg.parallel)
    autocast = precision.autocast(cfg.precision, world.device)
    checkpoints = checkpoint.Checkpointer(
        checkpoint_dir(kept, cfg.checkpoint.dir), every_steps=cfg.checkpoint.every_steps,
        keep=cfg.checkpoint.keep, rank=world.rank, world_size=world.world_size, mode=cfg.parallel,
        async_save=cfg.checkpoint.async_, collective_timeout=timedelta(seconds=cfg.collective_timeout),
    )  # fmt: skip
    meter.set_restart_count(world.restart_count)
    eval_batches = (
        data.eval_loader(
            task.eval_dataset,
            rank=world.rank,
            world_size=world.world_size,
            batch_size=layout.micro_batch_size,
        )
        if task.eval_dataset is not None
        else None
    )
    return Trainer(
        cfg=cfg, runtime=runtime, world=world, reporter=reporter, meter=meter, tracker=tracker, task=task,
        module=module, model=wrapped.model, optimizer=optimizer, fused=fused, scheduler=scheduler, scaler=scaler,
        autocast=autocast, memory=memory, layout=layout, stream=stream, max_steps=max_steps,
        eval_batches=eval_batches, checkpoints=checkpoints, kept=kept,
        objective=ObjectiveReport(runtime.objective, Path(runtime.output_dir), enabled=world.is_main,
                                  kept=kept if runtime.output_url else None),
    )  # fmt: skip


def train_layout(task: Task, cfg: TrainSpec, world_size: int) -> tuple[Layout, ShardedStream | None]:
    """How each step's global batch is split over ranks and micro-steps; the training set's stream, if any."""
    import torch

    from orchestrator.trainer import data

    stream = task.train_dataset if isinstance(task.train_dataset, data.ShardedStream) else None
    if stream is None and isinstance(task.train_dataset, torch.utils.data.IterableDataset):
        raise TypeError(
            "Task.train_dataset is an IterableDataset: give its shards as "
            "orchestrator.trainer.data.ShardedStream(shards, sizes, read) so that orch can split, shuffle and "
            "resume it exactly (docs/tasks.md, Streaming datasets)"
        )
    micro = cfg.micro_batch(world_size)
    layout = data.Layout(len(cast(Sized, task.train_dataset)), cfg.batch_size, micro, world_size, cfg.seed)
    return layout, stream


def resume(trainer: Trainer) -> tuple[int | None, dict[str, Any] | None]:
    """Every rank loads its part of the newest complete checkpoint: model, optimizer, schedule, scaler, RNG,
    sample order. Returns the step resumed from and the saved counters; (None, None) on a fresh start."""
    from orchestrator.trainer import checkpoint, data
    from orchestrator.trainer.schedule import lr_at

    cfg, world, reporter = trainer.cfg, trainer.world, trainer.reporter
    resumed = trainer.checkpoints.load(module=trainer.module, optimizer=trainer.optimizer)
    if resumed is None:
        checkpoint.seed_everything(cfg.seed, world.rank)  # distinct dropout streams per rank
        trainer.tracker.start(saved={}, step=0)
        return None, None
    # Another training set is refused (data.DataChanged: one line, exit 2); another split or order, said.
    saved_data = resumed.state.get("data") or {  # checkpoints before the data record: the split alone
        "world_size": resumed.state.get("world_size"), "num_workers": resumed.state.get("num_workers"),
    }  # fmt: skip
    now = data.record(trainer.layout, trainer.stream, cfg.num_workers)
    data_note = data.resume_check(saved_data, now, step=resumed.step)
    stretched = trainer.scheduler.load_state_dict(resumed.state["scheduler"])
    trainer.scaler.load_state_dict(resumed.state["scaler"])
    step = resumed.step
    trainer.checkpoints.restore_rng(resumed.state, cfg.seed)
    reporter.say(f"resumed from {resumed.path} at step {step}")
    # The sample order the run started with goes on (checkpoints before orch's Feistel order had none).
    order = resumed.state.get("data_order", data.ORDER_RANDPERM)
    trainer.layout = dataclasses.replace(trainer.layout, order=order)
    if order != data.ORDER_FEISTEL:
        reporter.say(f"this run keeps the sample order of the version that started it ({order})")
    if data_note:
        reporter.say(data_note)
    if stretched:
        old_lr = lr_at(step, cfg.schedule, cfg.optimizer.lr, resumed.state["scheduler"]["max_steps"])
        new_lr = lr_at(step, cfg.schedule, cfg.optimizer.lr, trainer.max_steps)
        reporter.say(f"note: {stretched}; learning rate at step {step}: {old_lr:.3g} -> {new_lr:.3g}")
    # A resumed job continues its MLflow run; TensorBoard drops what the last attempt wrote after `step`.
    trainer.tracker.start(saved=resumed.state.get("tracking") or {}, step=step)
    return step, resumed.state["counters"]


def finish(
    trainer: Trainer,
    progress: Progress,
    *,
    resumed_from: int | None,
    started: float,
    timeline: Timeline,
    journal: NullJournal,
    pruned: bool = False,
) -> None:
    """Final checkpoint, evaluation, summary.json and model.pt (rank 0), then every rank leaves together.
    A pruned trial (`orch sweep`) keeps its checkpoint and summary, and skips the evaluation and model.pt."""
    import torch

    from orchestrator.trainer import checkpoint, precision, report
    from orchestrator.trainer.results import ResultsNotKept

    cfg, runtime, world = trainer.cfg, trainer.runtime, trainer.world
    step = progress.step
    if resumed_from != trainer.max_steps and runtime.final_save:
        trainer.save_checkpoint(step, progress)
    trainer.checkpoints.close()  # async: the last write is on disk and in place
    with timeline.phase("eval"):
        results = {} if pruned else trainer.evaluate(step)
    if results:
        trainer.reporter.evaluation(step=step, results=results)
    trainer.objective.finish(step, pruned=pruned)
    summary = report.summary(
        job=runtime.job_name, train=cfg, world=world, layout=trainer.layout, progress=progress,
        tokens_per_sample=trainer.task.tokens_per_sample, results=results,
        loss_scale=precision.loss_scale(trainer.scaler), resumed_from=resumed_from,
        wall_seconds=time.perf_counter() - started,
    )  # fmt: skip
    summary["parallel"] = cfg.parallel
    summary["memory"] = memory_over_ranks(trainer.memory.report())
    if pruned:
        summary["pruned"] = True
    # collective under FSDP: gathered to rank 0 (benchmark runs write no model: ORCH_FINAL_SAVE=0)
    final_model = checkpoint.full_model_state(trainer.module) if runtime.final_save and not pruned else None
    # Leave together, every rank knowing whether rank 0 kept the results (no rank tears down its connections
    # while rank 0 is still writing files): a failure to keep them ends every rank with its line.
    not_kept: list[str | None] = [None]
    if world.is_main:
        try:
            write_results(trainer, summary, final_model, journal)
        except ResultsNotKept as error:
            not_kept = [str(error)]
    torch.distributed.broadcast_object_list(not_kept, src=0)
    if not_kept[0] is not None:
        raise ResultsNotKept(not_kept[0])


def write_results(
    trainer: Trainer,
    summary: dict[str, Any],
    final_model: dict[str, torch.Tensor] | None,
    journal: NullJournal,
) -> None:
    """Rank 0: model.pt and summary.json in the output directory and the store (results.py: summary.json
    last, ResultsNotKept when one cannot be written), the tracker's artifacts, the done line."""
    from orchestrator.trainer import results, tracking

    output_dir, tracking_env = trainer.output_dir, trainer.runtime.tracking
    journal.end("finished")  # the job's goodput until now: the results are kept
    goodput = journal.account()
    summary["goodput"] = goodput.to_dict() if goodput is not None else None
    if goodput is not None:  # MLflow / TensorBoard: summary.json's goodput/ratio and badput/CAUSE seconds
        shown = summary["goodput"]
        trainer.tracker.log_metrics(summary["steps"], {
            **tracking.prefixed("goodput", {"ratio": shown["ratio"], "seconds": shown["goodput_seconds"]}),
            **tracking.prefixed("badput", shown["badput_seconds"]),
        })  # fmt: skip
    # the local copies stay: `orch run` reads summary.json, MLflow the model
    results.keep(output_dir, summary, model=final_model, tensorboard=tracking_env.tensorboard_dir,
                 store=trainer.kept if trainer.runtime.output_url else None)  # fmt: skip
    model_file = (
        [output_dir / outputs.MODEL] if tracking_env.mlflow_log_model and final_model is not None else []
    )
    trainer.tracker.log_artifacts([output_dir / outputs.SUMMARY, *model_file])
    trainer.reporter.done(summary, summary_file=output_dir / outputs.SUMMARY)


def watch(
    timeline: Timeline, cfg: TrainSpec, runtime: RuntimeEnv, world: Dist, meter: Meter
) -> tuple[NullJournal, NullHeartbeat]:
    """Rank 0's goodput journal (OUT/goodput/ and the store's copy); every rank's heartbeat thread, started
    (it also writes the journal every few seconds, and with output.url answers a cluster `orch stacks` from a
    thread of its own); every rank's stack on SIGUSR1 (orch stacks --local)."""
    from orchestrator.trainer import heartbeat, journal

    if not runtime.heartbeat:  # ORCH_HEARTBEAT=0 (benchmarks): the loop's marks only
        return journal.NullJournal(), heartbeat.NullHeartbeat()
    output_dir = Path(runtime.output_dir)
    kept = kept_location(runtime)
    records = journal.build(timeline, enabled=world.is_main, output_dir=output_dir, kept=kept,
                            job_started=runtime.job_started)  # fmt: skip
    beat = heartbeat.Heartbeat(
        timeline, rank=world.rank, world_size=world.world_size, store_prefix=world.store_prefix,
        collective_timeout=cfg.collective_timeout, output_dir=output_dir, kept=kept, journal=records,
        meter=meter, stacks_url=runtime.output_url,
    )  # fmt: skip
    beat.start()
    heartbeat.register_stacks(output_dir, world.rank)
    return records, beat


def kept_location(runtime: RuntimeEnv) -> Any:
    """Where the run keeps its results: the output directory, or the object store's location (output_url)."""
    from orchestrator import storage

    return storage.location(runtime.output_url) if runtime.output_url else Path(runtime.output_dir)


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
        return output_dir / outputs.CHECKPOINTS
    if storage.is_url(configured):
        return storage.location(configured)
    return output_dir / configured  # an absolute `configured` replaces output_dir (pathlib's `/`)
