"""`orch run`: train the job on this machine. Parses, calls orchestrator.api.run_local, prints the result."""

from __future__ import annotations

import shlex
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.commands.common import job_options, load_job
from orchestrator.errors import OrchError

if TYPE_CHECKING:
    from orchestrator.local import LocalPlan


@click.command()
@job_options
@click.option(
    "--procs", type=click.IntRange(min=1), help="Processes to start (default: nodes x procs_per_node)."
)
@click.option(
    "--steps", type=click.IntRange(min=1), help="Optimizer steps (overrides train.max_steps/epochs)."
)
@click.option(
    "--out",
    "output_dir",
    type=click.Path(file_okay=False),
    help="Output directory, or an object store (s3://bucket/prefix) for checkpoints, model and summary.",
)
def run(
    job_file: str, overrides: tuple[str, ...], procs: int | None, steps: int | None, output_dir: str | None
) -> None:
    """Run JOB on this machine: torch's elastic launcher, gloo on CPU or one process per local GPU.

    The batch is global: with --procs the accumulation is recomputed so each optimizer step still sees
    train.batch_size samples. Writes summary.json, model.pt, checkpoints and every rank's output
    (logs/rank-N.log) to --out (default runs/NAME-TIMESTAMP/, a new one per run); rerunning with the same
    --out resumes from the last checkpoint, and a directory another live run holds is refused.
    The first Ctrl-C (or SIGTERM) lets every rank finish its step and write a checkpoint
    (train.checkpoint.on_stop), then prints the command that resumes and exits 128 + the signal (130, 143);
    a second Ctrl-C stops at once.
    --out s3://bucket/prefix (or gs://, az://) keeps checkpoints, model.pt, summary.json and TensorBoard's
    events in the object store (credentials and AWS_ENDPOINT_URL from the environment or the job's env);
    the logs stay in runs/NAME-TIMESTAMP/.
    With `restart.policy: job` a failing rank restarts every rank, up to restart.max_restarts times, unless
    it refused its input (exit 2: a restart would refuse again). Exit 74: the training finished but its
    results (model.pt, summary.json, TensorBoard's events) could not all be written where asked; run the
    same command again to write them (it resumes from the final checkpoint).
    Metrics are served on 127.0.0.1 (another port when the job's is taken; ORCH_METRICS_ADDR to change).

    \b
    Example:
      orch run examples/digits.yaml
      orch run examples/gpt.yaml --procs 1 --steps 20 --out runs/gpt-smoke
      orch run job.yaml --set train.precision=bf16 --set train.optimizer.lr=1e-3
    """
    from orchestrator import api, local, outputs

    spec = load_job(job_file, overrides, where="local")
    resume_with: list[str | None] = []  # the --out a rerun needs, once the output dir is claimed

    def started(plan: LocalPlan, claimed_dir: Path) -> None:
        resume_with.append(resume_out(output_dir, plan.output_url, claimed_dir))
        what = (
            f"{plan.train.task}, batch {plan.train.batch_size} = {plan.world_size} procs x micro-batch "
            f"{plan.train.micro_batch(plan.world_size)} x accumulation {plan.accumulation}, "
            f"{plan.train.precision}, {plan.train.parallel}"
            if plan.train
            else " ".join(plan.command or [])
        )
        kept = f" (checkpoints, model, summary: {plan.output_url}/)" if plan.output_url else ""
        click.echo(f"orch run {spec.name}: {what} -> {claimed_dir}/{kept}")
        if spec.tracking.tensorboard:
            click.echo(f"tensorboard --logdir {claimed_dir / outputs.TENSORBOARD}")

    try:
        try:
            result = api.run_local(spec, procs=procs, steps=steps, output_dir=output_dir,
                                   progress_bar=sys.stdout.isatty(), notice=started,
                                   warn=lambda message: click.echo(f"warning: {message}", err=True))  # fmt: skip
        finally:
            _ignore_stop_signals()
    except (local.RunInterrupted, KeyboardInterrupt) as caught:
        _ignore_stop_signals()
        # A Ctrl-C in the moment between the launcher giving Python's handler back and the line above
        # arrives as a KeyboardInterrupt on top of the run's own result: that result is what happened.
        stopped = caught.__context__ if isinstance(caught, KeyboardInterrupt) else caught
        if isinstance(stopped, OrchError) and not isinstance(stopped, local.RunInterrupted):
            raise stopped from None  # the run's failure line
        if not isinstance(stopped, local.RunInterrupted):
            raise  # a Ctrl-C before the launch: click's "Aborted." (exit 130)
        if stopped.stopped_at is None or not resume_with:
            raise stopped from None
        again = resume_command(job_file, overrides, procs, steps, resume_with[0])
        raise local.RunInterrupted(
            f"{stopped}; resume: {again}", stopped_at=stopped.stopped_at, signum=stopped.signum
        ) from None
    if result.summary is not None:
        click.echo(format_summary(result.summary))
        if result.links:
            click.echo(format_links(result.links))


def _ignore_stop_signals() -> None:
    """The run is over, stopped or not: what is left is its last line. A Ctrl-C or SIGTERM now has nothing to
    stop and would only cut that line short or turn it into a traceback (#33)."""
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)


def resume_out(out: str | None, output_url: str | None, claimed_dir: Path) -> str | None:
    """The --out that resumes a run: where its checkpoints are. `--out s3://...` must be given again (without
    it a rerun starts over); `output.url` in the job file needs none (the job file names the store, and each
    run makes a new local folder for its logs); a local run, its folder."""
    if output_url is None:
        return str(claimed_dir)
    return out


def resume_command(
    job_file: str, overrides: tuple[str, ...], procs: int | None, steps: int | None, out: str | None
) -> str:
    """The `orch run` line that continues this run from its checkpoint: same job, settings and --out."""
    argv = ["orch", "run", job_file]
    for override in overrides:
        argv += ["--set", override]
    if procs is not None:
        argv += ["--procs", str(procs)]
    if steps is not None:
        argv += ["--steps", str(steps)]
    return shlex.join([*argv, *(["--out", out] if out is not None else [])])


def format_links(links: dict[str, str]) -> str:
    """Where the run is recorded, on one line: the MLflow run's page, TensorBoard's command."""
    parts = [f"mlflow {links['mlflow']}"] if "mlflow" in links else []
    if "tensorboard" in links:
        parts.append(f"tensorboard --logdir {links['tensorboard']}")
    return "tracking: " + ", ".join(parts)


def format_summary(summary: dict[str, Any]) -> str:
    """The run's result on one line: eval metrics first (the number people look for)."""
    evaluation: dict[str, Any] = summary["eval"] if isinstance(summary.get("eval"), dict) else {}
    ordered = sorted(evaluation.items(), key=lambda item: item[0] == "loss")  # the task's metrics, then loss
    parts = [f"eval {name} {_value(value)}" for name, value in ordered]
    if isinstance(summary.get("final_loss"), (int, float)):
        parts.append(f"train loss {summary['final_loss']:.4f}")
    parts.append(f"{summary.get('steps')} steps")
    if _number(rate := summary.get("samples_per_second")):
        parts.append(f"{rate:,.0f} samples/s")
    if _number(tokens := summary.get("tokens_per_second")):
        parts.append(f"{tokens:,.0f} tokens/s")
    if summary.get("skipped_steps"):
        parts.append(f"{summary['skipped_steps']} skipped steps")
    if _number(wall := summary.get("wall_seconds")):
        parts.append(f"{wall:.1f} s")
    if isinstance(summary.get("goodput"), dict):
        from orchestrator import goodput

        parts.append(goodput.line(summary["goodput"]))
    return "result: " + ", ".join(parts)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value != 0


def _value(value: Any) -> str:
    """An eval result: a number with 4 decimals; what else a task's on_eval returned (a string), as text."""
    return f"{value:.4f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
