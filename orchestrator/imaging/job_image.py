"""The image a job runs: its trainer image (a folder's Dockerfile, orch's own, or one given), and the job's
workspace as a thin layer over it (workspace.py). `orch build` and `orch submit --build` (through
orchestrator.api) call it; builder.py builds and pushes each image."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.job.spec import JobSpec

Callback = Callable[[str], None]


def build(
    folder: str | Path,
    *,
    job: JobSpec | None,
    job_file: str | Path | None,
    image: str | None,
    tag: str | None,
    dockerfile: str | None,
    build_args: Sequence[str],
    base: str | None,
    tool: str | None,
    push: bool,
    dry_run: bool,
    notice: Callback,
    commands: Callback | None,
) -> str:
    """What `orchestrator.api.build_image` says (its arguments checked there): the reference to run."""
    from orchestrator.imaging import builder, workspace

    repository = image or (
        builder.repository(job.image) if job is not None and job.image else builder.DEFAULT_REPO
    )
    if base is None:
        base = _trainer(folder, repository, tag=tag, dockerfile=dockerfile, build_args=build_args, tool=tool,
                        push=push, dry_run=dry_run, notice=notice, commands=commands or notice)  # fmt: skip
    found = workspace.resolve(job, job_file) if job is not None and job_file is not None else None
    if found is None:
        return base
    return _layer(found, base, repository, tool=tool, push=push, dry_run=dry_run, notice=notice)


def _trainer(
    folder: str | Path,
    repository: str,
    *,
    tag: str | None,
    dockerfile: str | None,
    build_args: Sequence[str],
    tool: str | None,
    push: bool,
    dry_run: bool,
    notice: Callback,
    commands: Callback,
) -> str:
    from orchestrator.imaging import builder

    def build_from(context: str) -> str:
        request = builder.BuildRequest(str(context), repository, tag, dockerfile,
                                      builder.parse_build_args(build_args), push)  # fmt: skip
        if dry_run:
            ref, planned = builder.plan(request, tool)
            for argv in planned:
                commands(shlex.join(argv))
            return ref
        ref = builder.build_and_push(request, tool=tool)
        notice(f"built{' and pushed' if push else ''} {ref}")
        return ref

    if dockerfile is not None or os.path.isfile(os.path.join(folder, "Dockerfile")):
        return build_from(str(folder))
    with builder.own_context() as context:
        notice(f"{folder} has no Dockerfile: building orch's trainer image (from {context})")
        return build_from(context)


def _layer(
    folder: Path, base: str, repository: str, *, tool: str | None, push: bool, dry_run: bool, notice: Callback
) -> str:
    from orchestrator.imaging import workspace

    if dry_run:
        selection, ref = workspace.plan_layer(folder, base, repository)
        for line in selection.notes():
            notice(line)
        notice(f"workspace {folder}: {len(selection.files)} files -> {ref} (FROM {base})")
        return ref
    layer = workspace.build_layer(folder, base, repository, tool=tool, push=push)
    for line in layer.notes:
        notice(line)
    state = "built" if layer.built else "unchanged, not rebuilt"
    notice(
        f"workspace {folder}: {len(layer.files)} files -> {layer.ref} ({state}{'; pushed' if push else ''})"
    )
    return layer.ref


def for_submit(
    job: JobSpec,
    *,
    context: str,
    job_file: str | Path,
    build_args: Sequence[str],
    tool: str | None,
    dry_run: bool,
    notice: Callback,
) -> str:
    """`Client.submit(build=...)`: the image the job runs, built and pushed; its reference.

    The trainer image is built and pushed from `context` when it has a Dockerfile (an orch checkout).
    Without one, the job's `image` is the trainer image as it is when the job has a workspace (only the layer
    is built over it), and orch's own trainer image is built when it has none (`build`). On a client dry
    run nothing is built: the commands go to `notice` and the reference they would push is returned, so the
    objects show the image the job would run."""
    from orchestrator.imaging import workspace

    folder = workspace.resolve(job, job_file)
    has_dockerfile = os.path.isfile(os.path.join(context, "Dockerfile"))
    return build(
        context, job=job, job_file=job_file, image=None, tag=None, dockerfile=None, build_args=build_args,
        base=job.image if folder is not None and not has_dockerfile else None, tool=tool, push=True,
        dry_run=dry_run, notice=notice, commands=None,
    )  # fmt: skip
