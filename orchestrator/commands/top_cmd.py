"""`orch top NAME`: a live per-rank / per-GPU table from Prometheus or from a local run's exporter; `orch stacks
NAME`: every live rank's Python stack, for a job that is slow rather than dead."""

from __future__ import annotations

import click

from orchestrator.commands.cluster_cmds import REQUEST_TIMEOUT_KEY, cluster_options
from orchestrator.commands.common import DURATION, checked_job_name, checked_namespace, output_option


@click.command()
@click.argument("name", callback=checked_job_name)
@click.option(
    "--prometheus",
    "prometheus",
    metavar="URL",
    help="Prometheus base URL. Default: $ORCH_PROMETHEUS_URL, else prometheus_url in ~/.config/orch/config.yaml.",
)
@click.option(
    "-n",
    "--namespace",
    default=None,
    callback=checked_namespace,
    help="Only series with this namespace label.",
)
@click.option(
    "--local", "local", is_flag=True, help="Read a run on this machine from its exporter (127.0.0.1)."
)
@click.option(
    "--port",
    type=int,
    default=None,
    help="Exporter port for --local. Default: the live `orch run` of NAME's, $ORCH_METRICS_PORT, or 9400.",
)
@click.option(
    "--exporter",
    "exporters",
    multiple=True,
    metavar="URL",
    help="Read these exporter /metrics URLs directly (one per node). Repeatable.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option("--once", is_flag=True, help="Print one table and exit (for scripts).")
@click.option("--all", "every", is_flag=True, help="One row per rank even past 16 ranks (else the summary).")
@click.option("--worst", type=click.IntRange(min=1), default=5, show_default=True,
              help="How many of the slowest and longest-stopped ranks the summary names.")  # fmt: skip
@output_option("table", "json")
def top(
    name: str,
    prometheus: str | None,
    namespace: str | None,
    local: bool,
    port: int | None,
    exporters: tuple[str, ...],
    interval: float,
    once: bool,
    every: bool,
    worst: int,
    output: str,
) -> None:
    """Show utilisation, memory, power, samples/s and loss of job NAME, per rank and GPU.

    Up to 16 ranks, one row each; past that, the job's summary (throughput, MFU, memory, step), the spread
    over the ranks (min/median/max of time to the gradient reduction, step time, GPU utilisation and memory)
    and the worst ranks with their pod and host; --all for every row. From Prometheus, the summary is computed
    by PromQL. Reads Prometheus' HTTP API (for a job on the cluster; port-forward Prometheus first), or with
    --local / --exporter the /metrics endpoint of a run on this machine. `-o json` prints one snapshot of all
    of it and exits.

    \b
    Example:
      kubectl -n monitoring port-forward svc/kube-prometheus-stack-prometheus 9090 &
      orch top digits-ddp --prometheus http://127.0.0.1:9090
      orch top digits-ddp --local --once
      orch top digits-ddp --exporter http://10.0.0.5:9400/metrics -o json
    """
    import json

    from orchestrator import api
    from orchestrator.commands import tables
    from orchestrator.top import TABLE_RANKS, Snapshot, TopError

    metrics = api.top(name, prometheus=prometheus, namespace=namespace, exporters=exporters, local=local,
                      port=port, worst=worst)  # fmt: skip
    if output == "json":
        click.echo(json.dumps(metrics.snapshot(interval=min(interval, 1.0)).to_dict(), indent=2))
        return

    def view(snapshot: Snapshot) -> str:
        if not snapshot.rows:
            return f"no metrics for job {name!r} yet"
        if every or snapshot.summary is None or snapshot.ranks <= TABLE_RANKS:
            return tables.format_top(snapshot.rows)
        return tables.format_summary(snapshot.summary)

    try:
        for snapshot in metrics.follow(interval, summary=False):
            if once and not snapshot.rows:  # nothing of this job there: not a success (#24)
                raise TopError(f"no metrics of job {name} at {metrics.source}")
            if once:
                click.echo(view(snapshot))
                return
            click.clear()
            click.echo(f"orch top {name}  ({metrics.source}, every {interval:g}s, Ctrl-C to quit)\n")
            click.echo(view(snapshot))
    except KeyboardInterrupt:
        return


@click.command()
@click.argument("name", callback=checked_job_name)
@cluster_options
@click.option("--local", "local", is_flag=True, help="The live `orch run` of NAME on this machine.")
@click.option("--timeout", type=DURATION, default=30, show_default=True,
              help="How long to wait for a cluster job's ranks to answer, e.g. 1m.")  # fmt: skip
@output_option("text", "json")
def stacks(
    name: str,
    kubeconfig: str | None,
    context: str | None,
    namespace: str | None,
    local: bool,
    timeout: int,
    output: str,
) -> None:
    """Print the Python stack (every thread) of each live rank of job NAME: where a slow or stuck job is.

    A cluster job (the default) is asked through its object store, output.url, with this shell's
    credentials for it (AWS_*, as orch status reads it): orch writes a request there, every rank looks for
    one every 10 s ($ORCH_STACKS_POLL_SECONDS in the job's env) and answers with its stack and where its loop
    is (step, phase); orch prints them by rank, then removes the request and the answers. A rank that does
    not answer within --timeout is named with its last heartbeat's step and phase: it is stopped, dead, or
    no thread of it can run (the hung one). A job without output.url: the `kubectl exec` command of each
    running pod on stdout instead (pods/exec, which orch's Role leaves out), exit 1.

    --local: the live `orch run` of NAME on this machine, read with py-spy where installed (from outside,
    native frames too), else each rank's own faulthandler on SIGUSR1 (into OUT/stacks/rank-N.txt).

    \b
    Examples:
      orch stacks digits-ddp              # a cluster job
      orch stacks digits-ddp -o json      # the same as data: rank, pid, host, how, text, step, phase, ...
      orch stacks digits-ddp --local      # an `orch run` on this machine
    """
    import dataclasses
    import json

    from orchestrator import api

    if local:
        found = api.local_stacks(name)
    else:
        request_timeout = click.get_current_context().meta.get(REQUEST_TIMEOUT_KEY)
        client = api.Client(kubeconfig=kubeconfig, context=context, namespace=namespace,
                            request_timeout=request_timeout)  # fmt: skip
        try:
            found = client.stacks(name, timeout=timeout)
        except api.StacksByExec as error:  # on stdout, to copy; the error line on stderr says why
            for command in error.commands:
                click.echo(command)
            raise
    if output == "json":
        click.echo(json.dumps([dataclasses.asdict(stack) for stack in found], indent=2))
        return
    for stack in found:
        click.echo(stack.block())
