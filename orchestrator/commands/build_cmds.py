"""`orch build` and `orch doctor`. Parse, call one library function, print. Imports only click here."""

from __future__ import annotations

import click

from orchestrator.commands.common import load_job, output_option


@click.command()
@click.argument("context", default=".", type=click.Path(file_okay=False))
@click.option(
    "--image",
    default=None,
    metavar="REPO",
    help="Repository to tag, e.g. ghcr.io/acme/trainer [default: localhost/orch-trainer].",
)
@click.option(
    "--tag", default=None, help="Tag [default: a hash of the build context, Dockerfile and build args]."
)
@click.option("--push", is_flag=True, help="Push the image after building it.")
@click.option(
    "--tool",
    type=click.Choice(["docker", "podman", "buildah"]),
    default=None,
    help="Build tool [default: the first of docker (if its daemon answers), podman, buildah].",
)
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
    help="Dockerfile [default: CONTEXT/Dockerfile]; images/cpu/Dockerfile for the CPU image.",
)
@click.option("--dry-run", is_flag=True, help="Print the commands instead of running them.")
def build(
    context: str,
    image: str | None,
    tag: str | None,
    push: bool,
    tool: str | None,
    build_args: tuple[str, ...],
    dockerfile: str | None,
    dry_run: bool,
) -> None:
    """Build the training image (and push it); print the full image reference last.

    The build log goes to stderr and the reference to stdout, so scripts can capture it.

    \b
    Example:
      orch build --image ghcr.io/acme/trainer --push
      orch build -f images/cpu/Dockerfile --image ghcr.io/acme/trainer-cpu
      REF=$(orch build --image ghcr.io/acme/trainer --push) && orch submit job.yaml --set image=$REF
    """
    import shlex

    from orchestrator import images

    request = images.BuildRequest(
        context=context,
        image=image or images.DEFAULT_REPO,
        tag=tag,
        dockerfile=dockerfile,
        build_args=images.parse_build_args(build_args),
        push=push,
    )
    if dry_run:
        ref, commands = images.plan(request, tool)
        for argv in commands:
            click.echo(shlex.join(argv))
    else:
        ref = images.build_and_push(request, tool=tool)
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
        click.echo(doctor_lib.format_table(checks))
    return 1 if any(check.status == doctor_lib.FAIL for check in checks) else 0
