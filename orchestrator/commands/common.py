"""Options and helpers shared by several commands. Imports only click at module level."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from orchestrator.apis import registry

if TYPE_CHECKING:
    from orchestrator import api
    from orchestrator.job.spec import JobSpec

F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:
    _IntParamType = click.ParamType[int]
else:
    _IntParamType = click.ParamType  # generic only from click 8.4 on; pyproject allows 8.1


class Duration(_IntParamType):
    """`90s`, `10m`, `2h`, `1d`, `1w`, `1h30m`, or a number of seconds: the job file's duration parser."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from orchestrator.job.durations import parse_duration

        try:
            return parse_duration(value)
        except ValueError as error:
            self.fail(str(error), param, ctx)


DURATION = Duration()


def checked_job_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Callback of a NAME argument: the job file's `name:` rule (naming.py), else `error: NAME: ...` (exit 2)
    before anything is sent; a name goes into request paths, selectors and PromQL."""
    from orchestrator import naming
    from orchestrator.errors import UsageError

    if value is not None and (problem := naming.job_name_problem(value)):
        raise UsageError(f"NAME: {problem}")
    return value


def checked_namespace(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Callback of `-n/--namespace`: a DNS-1123 label (naming.py), else `error: --namespace: ...` (exit 2)."""
    from orchestrator import naming
    from orchestrator.errors import UsageError

    if value is not None and (problem := naming.namespace_problem(value)):
        raise UsageError(f"--namespace: {problem}")
    return value


def job_options(fn: F) -> F:
    """`JOB` (path to job.yaml) and repeatable `--set key.path=value` overrides."""
    fn = click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="KEY=VALUE",
        help="Override a field of the job file, e.g. --set nodes=4 --set train.optimizer.lr=1e-3. "
        "Values are parsed as YAML. Repeatable.",
    )(fn)
    return click.argument("job_file", metavar="JOB", type=click.Path(dir_okay=False))(fn)


def output_option(*choices: str, default: str | None = None) -> Callable[[F], F]:
    """`-o/--output FORMAT` with the given choices; the first one is the default."""

    def decorate(fn: F) -> F:
        return click.option(
            "-o",
            "--output",
            type=click.Choice(choices),
            default=default or choices[0],
            show_default=True,
            help="Output format.",
        )(fn)

    return decorate


def load_job(job_file: str, overrides: tuple[str, ...], *, where: api.Where = "anywhere") -> JobSpec:
    """Load and validate a job file for a command (orchestrator.api.load_job); SpecError (exit 2) on any
    problem. `where`: what runs it next (cluster: render and submit; local: `orch run`)."""
    from orchestrator import api as orch

    return orch.load_job(job_file, overrides, where=where)


def warn_missing_code(spec: JobSpec, job_file: str, *, check_image: bool = True) -> None:
    """`warning: ...` on stderr for each task module or script that neither the image's orchestrator package
    nor the job's workspace holds, and (`check_image`; not for `orch submit --build`, which makes the image)
    when the job's image does not carry its workspace as it is now: the pods could not import or run it."""
    from orchestrator.imaging import workspace

    found = workspace.missing(spec, job_file)
    if check_image and (problem := workspace.image_problem(spec, job_file)):
        found.append(problem)
    for message in found:
        click.echo(f"warning: {message}", err=True)


def build_tool_option(fn: F) -> F:
    """`--build-tool docker|podman|buildah` (`orch build` and `orch submit --build`); `--tool`, its name on `orch
    build` before #33, stays an alias on both."""
    return click.option(
        "--build-tool",
        "--tool",
        "tool",
        type=click.Choice(["docker", "podman", "buildah"]),
        default=None,
        help="Build tool (alias: --tool) [default: the first of docker (if its daemon answers), podman, buildah].",
    )(fn)


def api_option(fn: F) -> F:
    """`--api auto|KEY...`: which Kubeflow API renders the job (overrides the file's `api:`)."""
    return click.option(
        "--api",
        type=click.Choice(registry.CHOICES),
        default=None,
        help=f"Kubeflow API to render: {registry.described()}, or {registry.AUTO} (the file's `api:`, default "
        f"{registry.AUTO}; render: {registry.KEYS[0]}, submit: what the cluster serves).",
    )(fn)
