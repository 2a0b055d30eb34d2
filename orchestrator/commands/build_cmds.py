"""`orch build` and `orch doctor`. Parse, call one library function, print. Imports only click here."""

from __future__ import annotations

import click

from orchestrator.commands.common import build_tool_option, load_job, output_option


@click.command()
@click.argument("folder", default=".", type=click.Path(file_okay=False))
@click.option(
    "--image",
    default=None,
    metavar="REPO",
    help="Repository to tag, e.g. ghcr.io/acme/trainer [default: the job's image's, else localhost/orch-trainer].",
)
@click.option(
    "--tag",
    default=None,
    help="The trainer image's tag [default: a hash of the build context, Dockerfile and build args].",
)
@click.option("--push", is_flag=True, help="Push the image(s) after building.")
@build_tool_option
@click.option(
    "--build-arg",
    "build_args",
    multiple=True,
    metavar="KEY=VALUE",
    help="Passed to the Dockerfile, e.g. --build-arg BASE_IMAGE=... Repeatable.",
)
@click.option(
    "--file",
    "-f",
    "dockerfile",
    default=None,
    type=click.Path(dir_okay=False),
    help="Dockerfile [default: FOLDER/Dockerfile, else orch's own]; images/cpu/Dockerfile for the CPU image.",
)
@click.option(
    "--base",
    default=None,
    metavar="IMAGE",
    help="Build no trainer image: put the workspace layer on this one (a trainer image you pushed).",
)
@click.option(
    "--job",
    "job_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="The job whose workspace goes on top as a layer [default: FOLDER/job.yaml, when there is one].",
)
@click.option("--dry-run", is_flag=True, help="Print the commands instead of running them.")
def build(
    folder: str,
    image: str | None,
    tag: str | None,
    push: bool,
    tool: str | None,
    build_args: tuple[str, ...],
    dockerfile: str | None,
    base: str | None,
    job_file: str | None,
    dry_run: bool,
) -> None:
    """Build the training image, and the job's workspace as a layer on it (and push them); print the image
    reference to run last.

    The trainer image comes from FOLDER's Dockerfile, or from orch's own when FOLDER has none (so this works
    in any folder), or is --base. When FOLDER holds job.yaml (or --job names one) whose task or script lives
    in a workspace, its files go on top (docs/images.md, Workspaces) and that reference is printed. The
    build log goes to stderr and the reference to stdout, so scripts can capture it.

    \b
    Example:
      orch build --image ghcr.io/acme/trainer --push     # in your project: trainer + your code
      orch build -f images/cpu/Dockerfile --image ghcr.io/acme/trainer-cpu
      orch build --base ghcr.io/acme/trainer:3f2a... --push   # only your code, over a pushed trainer
      REF=$(orch build --image ghcr.io/acme/trainer --push) && orch render job.yaml --set image=$REF
    """
    import os

    from orchestrator import api as orch

    if job_file is None and os.path.isfile(os.path.join(folder, "job.yaml")):
        job_file = os.path.join(folder, "job.yaml")
    job = load_job(job_file, ()) if job_file else None
    say = click.echo if dry_run else (lambda line: click.echo(line, err=True))
    ref = orch.build_image(folder, job=job, job_file=job_file, image=image, tag=tag, dockerfile=dockerfile,
                           build_args=build_args, base=base, tool=tool, push=push, dry_run=dry_run,
                           notice=lambda line: click.echo(line, err=True), commands=say)  # fmt: skip
    click.echo(ref)


@click.command()
@click.argument("job_file", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a field of JOB_FILE, as `orch run --set` does. Repeatable.",
)
@click.option(
    "--cluster",
    "check_cluster",
    is_flag=True,
    help="Also check the cluster kubectl points at (CRDs, GPU nodes, permissions).",
)
@click.option(
    "--namespace", "-n", default=None, help="Namespace for the permission check [default: the context's]."
)
@click.option(
    "--context", "kube_context", default=None, help="kubeconfig context [default: the current one]."
)
@click.option("--kubeconfig", default=None, type=click.Path(dir_okay=False), help="kubeconfig file.")
@output_option("table", "json")
def doctor(
    job_file: str | None,
    overrides: tuple[str, ...],
    check_cluster: bool,
    namespace: str | None,
    kube_context: str | None,
    kubeconfig: str | None,
    output: str,
) -> int:
    """Check this machine (and with --cluster, the cluster) before you spend GPU hours.

    Each check prints OK, WARN or FAIL with a one-line fix; the exit code is 1 if any check fails.
    With JOB_FILE (and --set overrides), also what that job needs here (a C compiler when it sets
    train.compile).

    \b
    Example:
      orch doctor
      orch doctor job.yaml --set train.compile=true
      orch doctor --cluster -n ml
      orch doctor -o json
    """
    import json

    from orchestrator import doctor as doctor_lib
    from orchestrator.commands import tables
    from orchestrator.errors import UsageError

    if overrides and not job_file:
        raise UsageError("--set overrides a job file's fields; name the job file (orch doctor JOB --set ...)")
    spec = load_job(job_file, overrides) if job_file else None
    compiles = bool(spec is not None and spec.train is not None and spec.train.compile)
    checks = doctor_lib.local_checks(compiles=compiles)
    if check_cluster:
        checks += doctor_lib.cluster_checks(namespace=namespace, context=kube_context, kubeconfig=kubeconfig)
    if output == "json":
        click.echo(json.dumps([check.as_dict() for check in checks], indent=2))
    else:
        click.echo(tables.format_checks(checks))
    return 1 if any(check.status == doctor_lib.FAIL for check in checks) else 0
