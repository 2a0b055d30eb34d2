"""The user's code on the cluster: a workspace folder built as a thin image layer over the trainer image.

    FROM <trainer image>
    COPY the workspace's files to /orch/workspace (on PYTHONPATH, the working directory)
    RUN pip install -r requirements.txt (only when the workspace has one; torch & co. kept as the base has them)

`workspace:` in job.yaml names the folder (relative to job.yaml); without it, the folder that holds job.yaml is
the workspace when it holds code the job refers to (a `train.task` module, a `command:` script or `-m`
module); `workspace: false` turns it off. What goes in: every file under the folder except what its
`.orchignore` (else `.dockerignore`) excludes, and never `.git`, virtual environments, byte code or run
outputs. The tag is a hash of exactly that (paths, executable bits, contents) and of the layer's Dockerfile,
which names the base: the same files on the same trainer image give the same tag, so `orch submit --build`
rebuilds the layer only when a file changes.

Pure parts (what is referenced, which files, the Dockerfile, the tag) apart from `build_layer`, which stages
the files and calls images.py's one build function.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import outputs

if TYPE_CHECKING:
    from orchestrator.job.spec import JobSpec

IMAGE_DIR = "/orch/workspace"  # where the files go in the image: on PYTHONPATH, the working directory
TAG_PREFIX = "workspace-"
REQUIREMENTS = "requirements.txt"
IGNORE_FILES = (".orchignore", ".dockerignore")  # the first that exists is used
# Never shipped, whatever the ignore file says: version control, virtual environments, byte code, caches
# and what `orch run` writes (runs/, and any folder holding a run's run.json).
ALWAYS_EXCLUDED = (".git", ".hg", ".svn", "__pycache__", "*.pyc", ".venv", "venv", ".venv-*", "runs",
                   ".mypy_cache", ".pytest_cache", ".ruff_cache", "*.egg-info")  # fmt: skip
IMAGE_PACKAGE = "orchestrator"  # the package every orch image has: tasks under it need no workspace


@dataclass(frozen=True)
class Reference:
    """A piece of code the job names: a Python module (`mypkg.tasks`) or a script path (`train.py`)."""

    field: str  # where the job names it: train.task, command
    name: str  # as written
    module: str | None = None  # `mypkg.tasks` for a module; None for a script
    path: str | None = None  # `train.py` for a script (relative to the workspace)


def references(spec: JobSpec) -> list[Reference]:
    """The modules and scripts the job needs from its image: a plug-in `train.task`, a `command:` script
    (`python train.py`, `bash run.sh`, `./train`) or module (`python -m pkg.train`). Pure."""
    found: list[Reference] = []
    if spec.train is not None and (module := spec.train.task_module) is not None:
        found.append(Reference("train.task", spec.train.task, module=module))
    if spec.command:
        argv = list(spec.command)
        interpreter = os.path.basename(argv[0])
        if re.fullmatch(r"python[0-9.]*", interpreter) and len(argv) > 1:
            if argv[1] == "-m" and len(argv) > 2:
                found.append(Reference("command", argv[2], module=argv[2]))
            elif not argv[1].startswith("-"):
                found.append(Reference("command", argv[1], path=argv[1]))
        elif interpreter in ("bash", "sh") and len(argv) > 1 and not argv[1].startswith("-"):
            found.append(Reference("command", argv[1], path=argv[1]))
        elif argv[0].startswith("./") or (not argv[0].startswith("/") and "/" in argv[0]):
            found.append(Reference("command", argv[0], path=argv[0]))
    return found


def in_folder(reference: Reference, folder: Path, files: set[str]) -> bool:
    """Whether the workspace files (relative paths, as `files` lists them) provide `reference`."""
    if reference.path is not None:
        return os.path.normpath(reference.path) in files
    assert reference.module is not None
    parts = reference.module.split(".")
    return f"{'/'.join(parts)}.py" in files or any(
        f.startswith("/".join(parts) + "/") and f.endswith(".py") for f in files
    )


def in_image_package(reference: Reference) -> bool:
    return reference.module is not None and reference.module.split(".")[0] == IMAGE_PACKAGE


def resolve(spec: JobSpec, job_file: str | Path) -> Path | None:
    """The workspace folder of the job: `workspace:` (relative to job.yaml), or job.yaml's folder when it
    holds code the job refers to, or None (`workspace: false`, or nothing referenced there)."""
    base = Path(job_file).resolve().parent
    if spec.workspace is False:
        return None
    if isinstance(spec.workspace, str):
        return (base / spec.workspace).resolve()
    wanted = [r for r in references(spec) if not in_image_package(r)]
    if not wanted:
        return None
    kept = set(files(base))
    return base if any(in_folder(r, base, kept) for r in wanted) else None


def missing(spec: JobSpec, job_file: str | Path) -> list[str]:
    """Warnings for code the job names that neither the image's orchestrator package nor the workspace has:
    the pods would fail to import or run it."""
    wanted = [r for r in references(spec) if not in_image_package(r)]
    if not wanted:
        return []
    folder = resolve(spec, job_file)
    kept = set(files(folder)) if folder is not None and folder.is_dir() else set()
    shown = f"the workspace {folder}" if folder is not None else "a workspace (none: workspace: false)"
    if folder is None and spec.workspace is not False:
        shown = f"a workspace (none: {Path(job_file).resolve().parent} does not hold it)"
    found = []
    for reference in wanted:
        if folder is not None and in_folder(reference, folder, kept):
            continue
        what = f"module {reference.module}" if reference.module else f"script {reference.path}"
        found.append(
            f"{reference.field} {reference.name!r}: {what} is neither in the image's {IMAGE_PACKAGE} package "
            f"nor in {shown}: the pods cannot find it unless the image installs it; put it in the "
            "workspace (docs/images.md, Workspaces) and submit with --build"
        )
    return found


# --- which files go in --------------------------------------------------------------------------------------


def ignore_patterns(folder: Path) -> list[str]:
    """The workspace's `.orchignore`, else its `.dockerignore` (docker's syntax), plus what never goes in."""
    patterns: list[str] = []
    for name in IGNORE_FILES:
        path = folder / name
        if path.is_file():
            lines = [line.strip() for line in path.read_text().splitlines()]
            patterns = [line for line in lines if line and not line.startswith("#")]
            break
    # After the user's patterns, so a `!` exception there cannot bring them back.
    return [*patterns, *(f"**/{p}" for p in ALWAYS_EXCLUDED), *ALWAYS_EXCLUDED]


def files(folder: Path) -> list[str]:
    """Relative paths (with /) of the regular files and symlinks that go into the layer, sorted.

    docker-py's port of docker's .dockerignore matcher decides (as for `orch build`'s context); a folder
    holding a virtual environment (pyvenv.cfg) or an `orch run` output (run.json) is left out whatever its name.
    """
    from docker.utils.build import exclude_paths

    kept = exclude_paths(str(folder), ignore_patterns(folder))
    skipped = _skipped_folders(folder)
    out = []
    for relative in kept:
        relative = relative.replace(os.sep, "/")
        if any(relative == s or relative.startswith(s + "/") for s in skipped):
            continue
        full = folder / relative
        if full.is_symlink() or full.is_file():
            out.append(relative)
    return sorted(out)


def _skipped_folders(folder: Path) -> list[str]:
    skipped = []
    for directory, subdirs, names in os.walk(folder):
        if "pyvenv.cfg" in names or any(marker in names for marker in outputs.LOCAL_RUN_MARKERS):
            skipped.append(os.path.relpath(directory, folder).replace(os.sep, "/"))
            subdirs[:] = []
        else:  # nothing below an always-excluded folder goes in: do not walk it
            subdirs[:] = [d for d in subdirs if not any(fnmatch.fnmatch(d, p) for p in ALWAYS_EXCLUDED)]
    return skipped


# --- the layer ----------------------------------------------------------------------------------------------


def dockerfile(base_image: str, *, requirements: bool) -> str:
    """The layer's Dockerfile. The files come in as the image's user (10001, group 0: OpenShift's random
    UIDs can read them). requirements.txt is installed with every torch/triton/nvidia-* package the base
    has as a constraint, as the trainer image does: pip keeps the base's CUDA build or fails."""
    lines = [
        "# orch workspace layer (orchestrator/workspace.py): the job's code over the trainer image",
        f"FROM {base_image}",
        f"COPY --chown=10001:0 . {IMAGE_DIR}/",
    ]
    if requirements:
        lines += [
            "USER root",
            "RUN set -eu; "
            "python -m pip list --format=freeze | grep -iE '^(torch|triton|nvidia-)' > /tmp/keep-base.txt || true; "
            "python -m pip install --no-cache-dir --disable-pip-version-check --constraint /tmp/keep-base.txt "
            f"-r {IMAGE_DIR}/{REQUIREMENTS}; rm /tmp/keep-base.txt",
            "USER 10001",
        ]
    lines += [f"ENV PYTHONPATH={IMAGE_DIR}", f"WORKDIR {IMAGE_DIR}", ""]
    return "\n".join(lines)


def tag(folder: Path, base_image: str, kept: Iterable[str] | None = None) -> str:
    """`workspace-<12 hex>`: a hash of the files that go in (path, executable bit, contents; a symlink's
    target) and of the layer's Dockerfile (so of the base image reference). No timestamps or owners."""
    from orchestrator.images import TAG_LENGTH

    kept = list(files(folder) if kept is None else kept)
    digest = hashlib.sha256()

    def add(*parts: bytes) -> None:
        for part in parts:  # length-prefixed: ("ab", "c") and ("a", "bc") differ
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)

    add(dockerfile(base_image, requirements=REQUIREMENTS in kept).encode())
    for relative in kept:
        full = folder / relative
        mode = os.lstat(full).st_mode
        if stat.S_ISLNK(mode):
            add(b"link", relative.encode(), os.readlink(full).encode())
        else:
            add(b"file", relative.encode(), b"x" if mode & stat.S_IXUSR else b"-", full.read_bytes())
    return TAG_PREFIX + digest.hexdigest()[:TAG_LENGTH]


@dataclass(frozen=True)
class Layer:
    ref: str  # repository:workspace-<hash>
    files: list[str]
    built: bool  # False: the tool already had this reference (same files, same base): not rebuilt


def build_layer(
    folder: Path, base_image: str, repository: str, *, tool: str | None = None, push: bool = True
) -> Layer:
    """Build (unless the tool already has it) and push `repository:workspace-<hash>` FROM `base_image`.

    The build context is a temporary folder holding only the files that go in and the Dockerfile, so
    nothing else of the folder reaches the builder."""
    from orchestrator import images

    if not folder.is_dir():
        from orchestrator.errors import UsageError

        raise UsageError(f"workspace {folder} is not a folder")
    kept = files(folder)
    ref = images.image_ref(repository, tag(folder, base_image, kept))
    chosen = images.find_tool(tool)
    present = images.has_image(chosen, ref)
    with tempfile.TemporaryDirectory(prefix="orch-workspace-") as staging:
        context = Path(staging) / "context"
        context.mkdir()
        for relative in kept:
            target = context / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(folder / relative, target, follow_symlinks=False)
        layer_file = Path(staging) / "Dockerfile"
        layer_file.write_text(dockerfile(base_image, requirements=REQUIREMENTS in kept))
        if not present:
            request = images.BuildRequest(str(context), repository, ref.rsplit(":", 1)[1], str(layer_file))
            argv = images.build_argv(chosen, ref, request)
            images.check_completed(chosen, ref, images.run_build(argv), pushing=False)
    if push:
        images.check_completed(chosen, ref, images.run_build(images.push_argv(chosen, ref)), pushing=True)
    return Layer(ref, kept, built=not present)
