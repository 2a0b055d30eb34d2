"""`orch submit|status|list|logs|wait|delete`: run a job on the cluster kubectl points at, and follow it.

Each command parses its flags (`--kubeconfig`, `--context`, `-n` and `--request-timeout` make the
`orchestrator.api.Client`), loads the job file where it takes one, makes one call of that Client and prints
what it returns (`status` and `list`: a table of commands/tables.py, or the same model as `-o json`); progress
and warnings come back through the call's callbacks and go to stderr. At module level only click, the stdlib and
the API registry (`--api`'s choices) are imported; the Client, and through it `orchestrator.cluster` and
`kubernetes`, inside the commands.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from orchestrator.apis import registry
from orchestrator.commands.common import (
    DURATION,
    build_tool_option,
    checked_job_name,
    checked_namespace,
    job_options,
    load_job,
    output_option,
    warn_missing_code,
)
from orchestrator.errors import UsageError

if TYPE_CHECKING:
    from orchestrator import api
    from orchestrator.cluster import Job

F = TypeVar("F", bound=Callable[..., Any])

EXIT_TIMEOUT = 124  # like timeout(1)
# Replicas are an int32 (as orchestrator.cluster.logs.MAX_RANK, not imported here: that module is heavy).
MAX_RANK = 2**31 - 2
# Each open log stream holds a thread and one of the 128 pooled connections (cluster.connection
# CONNECTION_POOL), beside the watches: more would open connections the pool then closes with a warning each.
MAX_LOG_REQUESTS = 100


REQUEST_TIMEOUT_KEY = "orch.request_timeout"


def _remember_request_timeout(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    from orchestrator.job.durations import parse_duration

    if value is None or value.strip() == "0":
        ctx.meta[REQUEST_TIMEOUT_KEY] = None if value is None else 0
        return
    try:
        ctx.meta[REQUEST_TIMEOUT_KEY] = parse_duration(value.strip())
    except ValueError as e:
        raise click.BadParameter(f"{e}; or 0 for no limit", ctx, param) from None


def cluster_options(fn: F) -> F:
    """`--kubeconfig`, `--context`, `-n/--namespace`: which cluster and namespace, as with kubectl (commands
    that take a job name: there is no job file to take a namespace from)."""
    return _cluster_options(fn, "Namespace. Default: the context's namespace, else `default`.")


def submit_cluster_options(fn: F) -> F:
    """`cluster_options` for `submit`, whose job file may name the namespace."""
    return _cluster_options(
        fn, "Namespace. Default: the job file's namespace, else the context's, else `default`."
    )


def _cluster_options(fn: F, namespace_help: str) -> F:
    # --request-timeout: how long orch waits for the API server (kept in the context, read by `_connect`)
    fn = click.option(
        "--request-timeout",
        metavar="DURATION",
        expose_value=False,
        callback=_remember_request_timeout,
        help="Give up when the API server has not answered for this long, retries included, e.g. 30s or 2m; "
        "0: never. Default: $ORCH_REQUEST_TIMEOUT, else 60s.",
    )(fn)
    fn = click.option("-n", "--namespace", callback=checked_namespace, help=namespace_help)(fn)
    fn = click.option("--context", help="Kubeconfig context to use (default: its current-context).")(fn)
    return click.option(
        "--kubeconfig",
        type=click.Path(dir_okay=False),
        help="Kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster config).",
    )(fn)


def _client(kubeconfig: str | None, context: str | None, namespace: str | None) -> api.Client:
    """The cluster the flags name (`--request-timeout` is kept in the click context by its callback)."""
    from orchestrator import api

    timeout = click.get_current_context().meta.get(REQUEST_TIMEOUT_KEY)
    return api.Client(kubeconfig=kubeconfig, context=context, namespace=namespace, request_timeout=timeout)


def _warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def _note(message: str) -> None:
    click.echo(message, err=True)


@click.command()
@job_options
@submit_cluster_options
@click.option(
    "--dry-run",
    type=click.Choice(["client", "server"]),
    help="client: print what would be sent, contact nothing. server: the API server validates, stores nothing.",
)
@click.option(
    "--api",
    type=click.Choice(registry.CHOICES),
    default=None,
    help=f"Which job API to submit to: {registry.described()} [default: the job file's `api`, else "
    f"{registry.AUTO}: the first of {', '.join(registry.KEYS)} that the cluster serves].",
)
@click.option(
    "--replace",
    is_flag=True,
    help="If a job of this name exists, delete it (and wait) first; the new job keeps off the nodes the old "
    "one's hardware failures point at (scheduling.exclude_nodes, said in one line).",
)
@click.option(
    "--wait", "wait_", is_flag=True, help="Block until the job ends; exit 0 if it succeeded, 1 if not."
)
@click.option(
    "-f", "--follow", is_flag=True, help="Stream every pod's logs until the job ends (implies --wait)."
)
@click.option(
    "--build",
    is_flag=True,
    help="First build and push the image (as `orch build --push`) to the repository of the job's `image`, "
    "tagged by content, and submit exactly that reference.",
)
@click.option("--build-context", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Build context for --build.")  # fmt: skip
@click.option(
    "--build-arg", "build_args", multiple=True, metavar="KEY=VALUE", help="For --build. Repeatable."
)
@build_tool_option
@output_option("yaml", "json")
def submit(
    job_file: str,
    overrides: tuple[str, ...],
    kubeconfig: str | None,
    context: str | None,
    namespace: str | None,
    dry_run: str | None,
    api: str | None,
    replace: bool,
    wait_: bool,
    follow: bool,
    build: bool,
    build_context: str,
    build_args: tuple[str, ...],
    tool: str | None,
    output: str,
) -> int:
    """Render JOB and create it on the cluster: a PyTorchJob or a TrainJob, with its ConfigMap, PodMonitor
    (and, for a TrainJob, its TrainingRuntime).

    With `api: auto` (the default) API discovery decides: TrainJob where only Kubeflow Trainer v2 is
    installed, PyTorchJob where only the training operator is, PyTorchJob where both are; the choice is
    printed. `--dry-run=client` asks no cluster, so auto renders a PyTorchJob there (as `orch render` does).
    Everything is validated before anything is sent; if a create fails midway, what was created is
    deleted again. The other objects are owned by the job, so deleting the job removes them. `-o` sets the
    format of `--dry-run=client` output.

    \b
    Example:
      orch submit job.yaml --follow
      orch submit job.yaml -n research --context prod --set nodes=4
      orch submit job.yaml --replace --wait
      orch submit job.yaml --dry-run=client | less
      orch submit job.yaml --build --follow     # build, push, run that image
      orch submit job.yaml --api trainjob       # Kubeflow Trainer v2, whatever else is installed
    """
    from orchestrator import api as orch
    from orchestrator.rendering import render

    job = load_job(job_file, overrides, where="cluster")
    warn_missing_code(job, job_file, check_image=not build)
    client = _client(kubeconfig, context, namespace)
    build_with = orch.Build(build_context, build_args, tool, job_file) if build else None
    submitted = client.submit(job, api=api, replace=replace, dry_run=dry_run, build=build_with, notice=_note,
                              warn=_warn)  # fmt: skip
    if dry_run == "client":
        for message in submitted.warnings:
            _warn(message)
        click.echo(render.to_yaml(submitted.objects) if output == "yaml" else render.to_json(submitted.objects),
                   nl=False)  # fmt: skip
        return 0
    suffix = " (server dry run)" if dry_run == "server" else ""
    for ref in submitted.deleted:
        click.echo(f"{ref} deleted{suffix}")
    for ref in submitted.created:
        click.echo(f"{ref} created{suffix}")
    for message in submitted.warnings:
        _warn(message)
    if dry_run == "server":
        return 0
    name, ns = submitted.name, submitted.namespace
    if follow:
        return _follow_to_end(client, name)
    if wait_:
        return _wait(client, name, timeout=None)
    _note(f"follow it: orch logs {name} -n {ns} -f   |   orch status {name} -n {ns}")
    return 0


@click.command()
@click.argument("name", callback=checked_job_name)
@cluster_options
@output_option("table", "json", "yaml")
def status(
    name: str, kubeconfig: str | None, context: str | None, namespace: str | None, output: str
) -> None:
    """Show a job's phase, replicas, pods (node, restarts, last termination), recent warnings, and the nodes
    its hardware failures point at (a failed pre-flight check, a CUDA error only bad hardware raises).

    The phase is the most significant condition that is True: Failed > Succeeded > Suspended >
    Restarting > Running > Created, and Pending before the operator has seen the job.

    \b
    Example:
      orch status digits-ddp
      orch status digits-ddp -n research -o json | jq .phase
    """
    from orchestrator.commands import tables

    state = _client(kubeconfig, context, namespace).status(name)
    document = state.to_dict()
    if output == "table":
        click.echo(tables.format_status(state))
    elif output == "json":
        click.echo(json.dumps(document, indent=2))
    else:
        import yaml

        click.echo(yaml.safe_dump(document, sort_keys=False), nl=False)


@click.command("list")
@cluster_options
@click.option("-A", "--all-namespaces", is_flag=True, help="Jobs of every namespace.")
@click.option(
    "-l", "--selector", help="Only jobs with these labels, e.g. orch.dev/sweep=lr (a sweep's trials)."
)
@output_option("table", "wide", "json")
def list_jobs(
    kubeconfig: str | None,
    context: str | None,
    namespace: str | None,
    all_namespaces: bool,
    selector: str | None,
    output: str,
) -> None:
    """List the jobs orch submitted (label app.kubernetes.io/managed-by=orch): phase, age, nodes x GPUs.

    \b
    Example:
      orch list
      orch list -A -o wide
      orch list -l orch.dev/sweep=lr            # the trials of `orch sweep --cluster`
      orch list -o json | jq -r '.[] | select(.phase == "Failed") | .name'
    """
    from orchestrator.commands import tables

    rows = _client(kubeconfig, context, namespace).list(all_namespaces=all_namespaces, selector=selector)
    if output == "json":
        click.echo(json.dumps(rows, indent=2))
    elif not rows:
        _note("No orch jobs found." + ("" if all_namespaces else " (-A lists every namespace)"))
    else:
        click.echo(tables.format_list(rows, wide=output == "wide", all_namespaces=all_namespaces))


def _ranks(ctx: click.Context, param: click.Parameter, value: str | None) -> frozenset[int] | None:
    from orchestrator.cluster.logs import parse_ranks

    if value is None:
        return None
    try:
        return parse_ranks(value)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None


@click.command()
@click.argument("name", callback=checked_job_name)
@cluster_options
@click.option(
    "-f", "--follow", is_flag=True, help="Keep streaming until the job ends (new and restarted pods too)."
)
@click.option(
    "--rank", type=click.IntRange(min=0, max=MAX_RANK), help="Only the pod of this node rank (0 = master-0)."
)
@click.option(
    "--ranks", callback=_ranks, metavar="RANKS", help="Only these node ranks, e.g. 0-63 or 0,5,9-12."
)
@click.option("--all", "every", is_flag=True, help="Every pod (the default on jobs of more than 8 pods is "
              "rank 0 and the pods that failed or restarted).")  # fmt: skip
@click.option("--pod", help="Only this pod.")
@click.option("--tail", type=click.IntRange(min=0), help="Lines to show from the end of each log.")
@click.option("--since", type=DURATION, help="Only lines newer than this, e.g. 10m or 2h.")
@click.option("--max-log-requests", type=click.IntRange(min=1, max=MAX_LOG_REQUESTS), default=10,
              show_default=True, help=f"Log streams open at once, at most {MAX_LOG_REQUESTS}; with -f, pods "
              "beyond it are not followed (orch says which).")  # fmt: skip
def logs(
    name: str,
    kubeconfig: str | None,
    context: str | None,
    namespace: str | None,
    follow: bool,
    rank: int | None,
    ranks: frozenset[int] | None,
    every: bool,
    pod: str | None,
    tail: int | None,
    since: int | None,
    max_log_requests: int,
) -> None:
    """Print the training container's log of a job's pods (container `pytorch` of a PyTorchJob, `node` of a
    TrainJob), each line prefixed with its pod: [master-0]/[worker-N] (PyTorchJob), [node-N] (TrainJob).

    A job of up to 8 pods shows every pod; a bigger one shows rank 0 and every pod that failed, restarted
    or ended in error, and says how to get the rest (--all, --ranks). With -f, lines are merged as they
    arrive, pods still pending are waited for, restarted containers are picked up, and the command returns
    when the job has finished.

    \b
    Example:
      orch logs digits-ddp -f
      orch logs digits-ddp --rank 0 --tail 100
      orch logs big-job --ranks 0-63 --max-log-requests 64 -f
      orch logs digits-ddp --since 10m | grep loss
    """
    if sum(x is not None and x is not False for x in (rank, pod, ranks, every or None)) > 1:
        raise UsageError("--rank, --ranks, --all and --pod select the same thing; use one of them")
    _client(kubeconfig, context, namespace).logs(
        name,
        emit=_print_line,
        notice=_note,
        follow=follow,
        rank=rank,
        pod=pod,
        ranks=ranks,
        every=every,
        tail=tail,
        since_seconds=since,
        max_requests=max_log_requests,
    )


def _print_line(label: str, line: str) -> None:
    click.echo(f"[{label}] {line}")


@click.command()
@click.argument("name", callback=checked_job_name)
@cluster_options
@click.option("--timeout", type=DURATION, help="Give up after this long (exit 124), e.g. 2h. Default: never.")
def wait(
    name: str, kubeconfig: str | None, context: str | None, namespace: str | None, timeout: int | None
) -> int:
    """Wait for a job to end: exit 0 if it Succeeded, 1 if it Failed (with the reason), 124 on timeout.

    \b
    Example:
      orch wait digits-ddp --timeout 2h && echo trained
    """
    return _wait(_client(kubeconfig, context, namespace), name, timeout=timeout)


@click.command()
@click.argument("name", callback=checked_job_name)
@cluster_options
@click.option("--wait", "wait_", is_flag=True, help="Return only once the job and its pods are gone.")
@click.option("--timeout", type=DURATION, default=600, show_default=True, help="How long --wait waits.")
def delete(
    name: str, kubeconfig: str | None, context: str | None, namespace: str | None, wait_: bool, timeout: int
) -> None:
    """Delete a job; its pods, ConfigMap, PodMonitor (and TrainingRuntime) are deleted with it.

    \b
    Example:
      orch delete digits-ddp --wait
    """
    job = _client(kubeconfig, context, namespace).delete(name, wait=wait_, timeout=timeout)
    for deleted in (job.ref, *job.companions):
        click.echo(f"{deleted} deleted")
    for unchecked in job.unchecked:
        _warn(f"objects applied with the job but not owned by it were not looked for: {unchecked}")


# --- shared by submit/wait ---------------------------------------------------------------------------------


def _wait(client: api.Client, name: str, *, timeout: int | None) -> int:
    from orchestrator import api as orch

    try:
        job = client.wait(name, timeout=timeout, on_phase=lambda phase: _note(f"{name}: {phase}"))
    except orch.WaitTimeout as timed_out:
        _note(str(timed_out))
        return EXIT_TIMEOUT
    return _outcome(job)


def _follow_to_end(client: api.Client, name: str) -> int:
    job = client.logs(name, emit=_print_line, notice=_note, follow=True)
    if job is None:
        return 1
    return _outcome(job)


def _outcome(job: Job) -> int:
    if job.phase == "Succeeded":
        _note(f"job {job.name} succeeded")
        return 0
    condition = job.condition
    reason = ": ".join(p for p in (condition.get("reason"), condition.get("message")) if p)
    _note(f"job {job.name} {job.phase.lower()}" + (f": {reason}" if reason else ""))
    return 1
