"""`orch top NAME`: a live per-rank / per-GPU table from Prometheus or from a local run's exporter."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from orchestrator.commands.common import checked_job_name, checked_namespace, output_option

if TYPE_CHECKING:
    from orchestrator.top import Row, Summary


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
    import time

    from orchestrator import top as top_lib
    from orchestrator.errors import UsageError

    urls = list(exporters) + ([top_lib.local_exporter_url(port, job=name)] if local else [])
    base = None
    if urls:
        if prometheus:
            raise UsageError("use either --prometheus or --local/--exporter, not both")
    else:
        base = top_lib.prometheus_url(prometheus)
        if base is None:
            raise UsageError(
                "no Prometheus URL: pass --prometheus URL, set ORCH_PROMETHEUS_URL or prometheus_url in "
                f"{top_lib.config_path()}; or --local for a run on this machine"
            )

    previous = None

    def snapshot() -> tuple[list[Row], Summary | None]:
        nonlocal previous
        if base is not None:
            rows = top_lib.from_prometheus(base, name, namespace=namespace)
            big = output == "json" or len([r for r in rows if r.rank is not None]) > top_lib.TABLE_RANKS
            summary = (
                top_lib.summary_from_prometheus(base, name, namespace=namespace, worst=worst) if big else None
            )
            return rows, summary
        rows, previous = top_lib.from_exporters(urls, name, previous=previous, interval=min(interval, 1.0))
        return rows, top_lib.summary_from_rows(name, rows, worst=worst)

    def view(rows: list[Row], summary: Summary | None) -> str:
        if not rows:
            return f"no metrics for job {name!r} yet"
        ranks = len([r for r in rows if r.rank is not None])
        if every or summary is None or ranks <= top_lib.TABLE_RANKS:
            return top_lib.format_table(rows)
        return top_lib.format_summary(summary)

    if output == "json":
        rows, summary = snapshot()
        click.echo(json.dumps({"job": name, "summary": top_lib.summary_json(summary) if summary else None,
                               "rows": top_lib.rows_json(rows)}, indent=2))  # fmt: skip
        return
    try:
        while True:
            rows, summary = snapshot()
            if once and not rows:  # nothing of this job there: not a success (#24)
                raise top_lib.TopError(f"no metrics of job {name} at {base or ', '.join(urls)}")
            table = view(rows, summary)
            if once:
                click.echo(table)
                return
            click.clear()
            click.echo(f"orch top {name}  ({base or ', '.join(urls)}, every {interval:g}s, Ctrl-C to quit)\n")
            click.echo(table)
            time.sleep(interval)
    except KeyboardInterrupt:
        return
