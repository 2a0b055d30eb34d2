"""`orch sweep`: run a sweep's trials (`orch sweep SWEEP`) and show them (`orch sweep status SWEEP`). Parses,
calls orchestrator.api.sweep / sweep_status, prints. Imports only click at module level."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import click

from orchestrator.commands.cluster_cmds import REQUEST_TIMEOUT_KEY, submit_cluster_options
from orchestrator.commands.common import output_option
from orchestrator.errors import UsageError

if TYPE_CHECKING:
    from orchestrator.sweep.study import TrialRow


class SweepGroup(click.Group):
    """`orch sweep SWEEP` runs the sweep; `orch sweep status SWEEP` shows it: a first argument that is not a
    subcommand is the sweep file of `run`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage("orch sweep", "SWEEP | status SWEEP [-o json]")


SWEEP_ARGUMENT = click.argument("sweep_file", metavar="SWEEP", type=click.Path(dir_okay=False))


@click.group(cls=SweepGroup)
def sweep() -> None:
    """Run many trials of one job, searched by Optuna, pruned and resumable.

    SWEEP (sweep.yaml) names the job, the objective, each parameter's range as a --set path, the
    algorithm (tpe, random, grid), max_trials, parallel, max_failed, early_stopping (median, hyperband,
    none) and optionally a database as storage. Each trial is an `orch run` of its own, in
    runs/NAME/trial-N/ beside the sweep file, or with --cluster a job on the cluster (NAME-trial-N, its
    outputs under the job's output.url); the study is runs/NAME/study.journal unless `storage:` names a
    database. Run it again after a Ctrl-C, a SIGTERM or a reboot and it continues: finished trials are not
    run again, trials cut off resume from their checkpoint, or are re-attached on the cluster (or are asked
    again). docs/sweeps.md.

    \b
    Example (sweep.yaml):
      job: job.yaml
      objective: {metric: eval/loss, goal: minimize}
      parameters:
        train.optimizer.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
        train.micro_batch_size: {type: categorical, values: [8, 16, 32]}
      max_trials: 16
      parallel: 2
      early_stopping: {name: median, min_steps: 100}

    \b
      orch sweep sweep.yaml             run it (or continue it)
      orch sweep sweep.yaml --cluster   each trial a job on the cluster kubectl points at
      orch sweep status sweep.yaml      the trials, best first, and runs/NAME/objective.png
    """


@sweep.command("run")
@SWEEP_ARGUMENT
@click.option(
    "--cluster",
    is_flag=True,
    help="Run each trial as a job on the cluster (as `orch submit` creates it, queued by Kueue when the job "
    "names a queue), labelled orch.dev/sweep=NAME and orch.dev/trial=N; the job needs output.url, where each "
    "trial keeps its outputs (OUTPUT_URL/NAME-trial-N) and the sweep reads its objective.",
)
@submit_cluster_options
def run_sweep(
    sweep_file: str, cluster: bool, kubeconfig: str | None, context: str | None, namespace: str | None
) -> None:
    """Run (or continue) the sweep SWEEP: `parallel` trials at once, each an `orch run` here, or with
    --cluster a job on the cluster.

    Exits 0 when max_trials trials have ended (complete, pruned or failed), 1 once max_failed trials failed,
    2 for a bad sweep file (before any trial starts), 130/143 after Ctrl-C/SIGTERM: local trials then stop
    with a checkpoint, cluster trials go on as jobs; `orch sweep SWEEP` (with --cluster: re-attached)
    again continues them. A second Ctrl-C stops local trials at once.

    \b
    Example:
      orch sweep sweep.yaml
      orch sweep sweep.yaml --cluster -n research
    """
    from orchestrator import api

    if not cluster and (kubeconfig or context or namespace):
        raise UsageError(
            "--kubeconfig, --context and --namespace choose the cluster of --cluster: add --cluster"
        )
    checked = api.load_sweep(sweep_file, where="cluster" if cluster else "local")
    client = None
    if cluster:
        timeout = click.get_current_context().meta.get(REQUEST_TIMEOUT_KEY)
        client = api.Client(
            kubeconfig=kubeconfig, context=context, namespace=namespace, request_timeout=timeout
        )
    where = (
        f"jobs on the cluster, outputs under {checked.job.output.url}/"
        if cluster and checked.job.output
        else ""
    )
    click.echo(
        f"orch sweep {checked.name}: {checked.spec.algorithm}, {checked.trials} trials, {checked.spec.parallel} "
        f"at once, {checked.spec.objective.goal} {checked.metric} -> {checked.folder}/"
        + (f" ({where})" if where else "")
    )
    result = api.sweep(checked, client=client, notice=click.echo)
    counts = {
        state: sum(row.state == state for row in result.rows) for state in ("complete", "pruned", "failed")
    }
    click.echo(
        f"sweep {result.name} done: {len(result.rows)} trials ("
        + ", ".join(f"{n} {state}" for state, n in counts.items() if n)
        + ")"
    )
    if result.best is not None:
        click.echo(f"best: {_row_line(result.best, checked.metric)}")
    click.echo(f"orch sweep status {sweep_file}   # every trial, and the plot")


@sweep.command("status")
@SWEEP_ARGUMENT
@output_option("table", "json")
def status(sweep_file: str, output: str) -> None:
    """Every trial of SWEEP, best first: number, state (running, complete, pruned, failed), parameters,
    objective, run dir; and the plot of the objective per trial and per parameter, written to
    runs/NAME/objective.png (needs matplotlib: the `sweep` extra).

    \b
    Example:
      orch sweep status sweep.yaml
      orch sweep status sweep.yaml -o json | jq '.trials[0]'
    """
    from orchestrator import api

    found = api.sweep_status(sweep_file)
    if output == "json":
        click.echo(json.dumps(found.to_json(), indent=2))
        return
    params = list(dict.fromkeys(path for row in found.rows for path in row.params))
    header = [
        "TRIAL",
        "STATE",
        found.metric.upper(),
        *(p.rsplit(".", 1)[-1].upper() for p in params),
        "JOB" if found.where == "cluster" else "RUN DIR",
    ]
    table = [header]
    for row in found.rows:
        state = row.state + (f" ({row.exit_class})" if row.exit_class else "")
        run = (row.run or "") if found.where == "cluster" else f"{found.folder / row.run}/" if row.run else ""
        table.append(
            [str(row.number), state, _value(row.value), *(_value(row.params.get(p)) for p in params), run]
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    click.echo(f"{sum(not row.rerun for row in found.rows)} of {found.max_trials} trials")
    if found.plot is not None:
        click.echo(f"plot: {found.plot}")
    elif found.rows:
        click.echo(
            "plot: none (no trial has a value yet, or matplotlib is missing: pip install 'orch-trainer[sweep]')"
        )


def _row_line(row: TrialRow, metric: str) -> str:
    params = " ".join(f"{path}={_value(value)}" for path, value in row.params.items())
    return f"trial {row.number}, {metric} {_value(row.value)}: {params} ({row.run})"


def _value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4g}"
    return str(value)
