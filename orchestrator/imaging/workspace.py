"""The user's code on the cluster: a workspace folder built as a thin image layer over the trainer image.

    FROM <trainer image>
    COPY the workspace's files to /orch/workspace (on PYTHONPATH, the working directory)
    RUN pip install -r requirements.txt (only when the workspace has one; torch & co. kept as the base has them)

`workspace:` in job.yaml names the folder (relative to job.yaml); without it, the folder that holds job.yaml is
the workspace when it holds code the job refers to (a `train.task` module, a `command:` script or `-m`
module); `workspace: false` turns it off. What goes in (select): every file under the folder except what its
`.orchignore` (else `.dockerignore`, Docker's rules: orchestrator/imaging/ignorefile.py) excludes; never `.git`, virtual
environments, byte code or run outputs; credentials (SECRETS, and files that hold a private key) only when the
ignore file names them; never a symlink that points outside the folder, nor a FIFO, socket or device. The tag
(`workspace-<content>-<base>`) hashes exactly that (paths, executable bits, contents) and the layer's
Dockerfile, which names the base: the same files on the same trainer image give the same tag, so `orch
submit --build` rebuilds the layer only when a file changes, and the content part tells `orch render` whether
the job's image carries the workspace as it is now (image_problem).

Pure parts (what is referenced, which files, the Dockerfile, the tag) apart from `build_layer`, which stages
the files and calls builder.py's one build function.
"""

from __future__ import annotations

import fnmatch
import functools
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
from orchestrator.imaging import ignorefile

if TYPE_CHECKING:
    from orchestrator.job.spec import JobSpec

IMAGE_DIR = "/orch/workspace"  # where the files go in the image: on PYTHONPATH, the working directory
TAG_PREFIX = "workspace-"
REQUIREMENTS = "requirements.txt"
IGNORE_FILES = (".orchignore", ".dockerignore")  # the first that exists is used
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
    the pods would fail to import or run it. None with `workspace: false`: the image carries the code."""
    wanted = [r for r in references(spec) if not in_image_package(r)]
    if not wanted or spec.workspace is False:  # false: the user says the image carries the code
        return []
    folder = resolve(spec, job_file)
    kept = set(files(folder)) if folder is not None and folder.is_dir() else set()
    shown = f"the workspace {folder}"
    if folder is None:
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


def image_problem(spec: JobSpec, job_file: str | Path) -> str | None:
    """What is wrong when the job has a workspace (its task or script lives there) and its `image` does not
    carry it as it is now, else None. How orch tells: the workspace layer's tag is `workspace-<content>-<base>`
    (tag()), and <content> is content_digest() of the files; any other reference (the plain trainer image, a
    layer of older files, a bare digest) would leave every pod without the code. An image that installs the
    code itself: `workspace: false` says so."""
    folder = resolve(spec, job_file)
    if folder is None or not folder.is_dir() or not spec.image:
        return None
    from orchestrator.imaging import builder  # here: a job without a workspace (most) needs none of it

    named = [f"{r.field} {r.name!r}" for r in references(spec) if not in_image_package(r)]
    what = f"{' and '.join(named) or 'the job'}: the workspace {_show(str(folder))}"
    image, repository = spec.image, builder.repository(spec.image)
    tagged = image.split("@", 1)[0][len(repository) :].lstrip(":")
    fix = (
        f"build it first: REF=$(orch build --image {repository} --push) and render with --set image=$REF, or "
        "orch submit --build (workspace: false when the image installs the code itself; docs/images.md, Workspaces)"
    )
    if (carried := TAG.fullmatch(tagged)) is None:
        told = (
            " (orch cannot tell from a digest: name it by the tag orch build prints)" if "@" in image else ""
        )
        return f"{what} is not in the image {image}{told}: every pod would fail to find the code; {fix}"
    if carried["content"] != content_digest(folder):
        return (f"{what} is in the image {image} as it was when that was built; its files have changed since; "
                f"{fix}")  # fmt: skip
    return None


# --- which files go in --------------------------------------------------------------------------------------

# Never shipped, whatever the ignore file says (names, at any depth): version control, virtual environments,
# byte code, caches and what `orch run` writes (runs/, and any folder holding a run's run.json).
ALWAYS_EXCLUDED = (".git", ".hg", ".svn", "__pycache__", "*.pyc", ".venv", "venv", ".venv-*", "runs",
                   ".mypy_cache", ".pytest_cache", ".ruff_cache", "*.egg-info")  # fmt: skip
# Left out by default because they hold credentials (patterns at any depth; a folder leaves out all it holds):
# environment files, cloud CLIs' credentials and service-account keys, SSH, TLS and GPG keys, kubeconfigs,
# registry and package-index tokens. One goes in only when a `!` line of the ignore file names it (or a path
# between it and the secret folder it is in): `!config/ca.pem`, `!**/.env.example`; `!mypkg` is not enough.
SECRETS = (
    ".env", ".env.*", "*.env", ".envrc", ".netrc", "_netrc", ".git-credentials", ".pgpass", ".vault-token",
    ".npmrc", ".pypirc", ".docker/config.json",
    ".aws", ".azure", ".config/gcloud", "*credentials*.json", "client_secret*.json", "*service?account*.json",
    ".ssh", ".gnupg", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
    "*.pem", "*.key", "*.p12", "*.pfx", "*.ppk", "*.jks", "*.keystore",
    ".kube", "kubeconfig*", "*.kubeconfig",
)  # fmt: skip
# ...and files whose first bytes hold a private key, whatever their name: a PEM/OpenSSH/PGP private key, an AWS
# secret key line (as in ~/.aws/credentials), a Google service-account key.
_SECRET_CONTENT = re.compile(
    rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
    rb"|^\s*aws_secret_access_key\s*=\s*[A-Za-z0-9/+]{30,}\s*$"
    rb'|"type"\s*:\s*"service_account"',
    re.MULTILINE | re.IGNORECASE,
)
SNIFFED_BYTES = 64 * 1024  # how much of each file is read for _SECRET_CONTENT
MAX_FILE_BYTES = 100 * 2**20  # a layer is for code: data and weights belong in the object store or a volume
MAX_TOTAL_BYTES = 1024 * 2**20


@functools.cache  # built when a workspace is walked, not when `orch render` imports this to warn
def _secret_matcher() -> ignorefile.Matcher:
    return ignorefile.Matcher([f"**/{p}" for p in SECRETS])


@dataclass(frozen=True)
class LeftOut:
    path: str  # relative, with /
    why: str  # secret | link-outside | special
    detail: str = ""  # a symlink's target


@dataclass(frozen=True)
class Selection:
    """What goes into the layer (`files`, sorted), what orch itself left out and must say so (`left_out`), and
    the sizes the limits apply to."""

    folder: Path
    files: list[str]
    left_out: list[LeftOut]
    sizes: dict[str, int]

    def notes(self) -> list[str]:
        """One line for each kind of file left out: which, and how to ship one on purpose."""
        lines = []
        for why, says, fix in _LEFT_OUT_LINES:
            paths = [f"{_show(e.path)} -> {_show(e.detail)}" if e.detail else _show(e.path)
                     for e in self.left_out if e.why == why]  # fmt: skip
            if paths:
                shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
                lines.append(
                    f"workspace {_show(str(self.folder))}: left out {len(paths)} {says}: {shown} ({fix})"
                )
        return lines

    def check_size(self) -> None:
        """UsageError (exit 2) when a file or the whole layer is over the limits."""
        from orchestrator.errors import UsageError

        for path, size in sorted(self.sizes.items(), key=lambda item: -item[1])[:1]:
            if size > MAX_FILE_BYTES:
                raise UsageError(
                    f"workspace {_show(str(self.folder))}: {_show(path)} is {_mib(size)}, over the layer's "
                    f"{_mib(MAX_FILE_BYTES)} limit for one file: leave it out in .orchignore and read it from "
                    "the object store or a volume (docs/images.md, Workspaces)"
                )
        total = sum(self.sizes.values())
        if total > MAX_TOTAL_BYTES:
            raise UsageError(
                f"workspace {_show(str(self.folder))}: {len(self.files)} files, {_mib(total)}, over the layer's "
                f"{_mib(MAX_TOTAL_BYTES)} limit: leave data, weights and outputs out in .orchignore "
                "(docs/images.md, Workspaces)"
            )


_LEFT_OUT_LINES = (
    ("secret", "files that look like credentials",
     "to ship one on purpose, add a line `!PATH` naming it to .orchignore"),
    ("link-outside", "symlinks that point outside the workspace",
     "copy what they point to into the workspace, or point them inside it with a relative target"),
    ("special", "files that are not regular files or symlinks (FIFOs, sockets, devices)", "a layer cannot hold them"),
)  # fmt: skip


def _show(text: str) -> str:
    """A path as one line can show it: quoted when it holds a space, a comma or a character that is not printable
    (a newline in a file name cannot forge a line of output)."""
    return repr(text) if any(not c.isprintable() or c in " ,'\"" for c in text) else text


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def ignore_matcher(folder: Path) -> ignorefile.Matcher:
    """The workspace's `.orchignore`, else its `.dockerignore` (Docker's rules, orchestrator/imaging/ignorefile.py)."""
    from orchestrator.errors import UsageError

    for name in IGNORE_FILES:
        path = folder / name
        if path.is_file():
            try:
                return ignorefile.load(path)
            except ignorefile.BadPattern as error:
                raise UsageError(
                    f"workspace {error} (docs/images.md, Workspaces: the rules are Docker's)"
                ) from None
    return ignorefile.Matcher([])


def select(folder: Path) -> Selection:
    """Walk the workspace (never following a symlink) and decide for each path: the ignore file's patterns,
    what never goes in, the secrets left out unless the ignore file names them, symlinks that point outside
    the workspace and special files left out."""
    matcher = ignore_matcher(folder)
    root = os.path.realpath(folder)
    kept: list[str] = []
    left_out: list[LeftOut] = []
    sizes: dict[str, int] = {}
    for relative, entry in ignorefile.walk(folder, matcher, skip=_never_shipped):
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            target = os.readlink(entry.path)
            if os.path.isabs(target) or os.path.commonpath([root, os.path.realpath(entry.path)]) != root:
                left_out.append(LeftOut(relative, "link-outside", target))
                continue
        elif not stat.S_ISREG(mode):
            left_out.append(LeftOut(relative, "special"))
            continue
        if _is_secret(relative, entry.path, matcher, link=stat.S_ISLNK(mode)):
            left_out.append(LeftOut(relative, "secret"))
            continue
        kept.append(relative)
        sizes[relative] = 0 if stat.S_ISLNK(mode) else entry.stat(follow_symlinks=False).st_size
    return Selection(folder, sorted(kept), left_out, sizes)


def _never_shipped(entry: os.DirEntry[str]) -> bool:
    """ALWAYS_EXCLUDED by name, and a folder that is a virtual environment or an `orch run` output."""
    if any(fnmatch.fnmatchcase(entry.name, p) for p in ALWAYS_EXCLUDED):
        return True
    return entry.is_dir(follow_symlinks=False) and any(
        os.path.lexists(os.path.join(entry.path, n)) for n in ("pyvenv.cfg", *outputs.LOCAL_RUN_MARKERS)
    )


def _is_secret(relative: str, full: str, matcher: ignorefile.Matcher, *, link: bool) -> bool:
    """Whether `relative` is a secret the ignore file does not name: by its name or a folder's, else by its
    first bytes. Named: a `!` pattern matches the path itself, or a path between it and the secret folder."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    by_name = next(
        (i for i, p in enumerate(prefixes) if any(s.match(p) for s in _secret_matcher().patterns)), None
    )
    if by_name is None:
        if link:
            return False
        with open(full, "rb") as handle:
            if not _SECRET_CONTENT.search(handle.read(SNIFFED_BYTES)):
                return False
        by_name = len(parts) - 1
    return not any(p.match(prefix) for p in matcher.exclusions for prefix in prefixes[by_name:])


def files(folder: Path) -> list[str]:
    """Relative paths (with /) of the regular files and symlinks that go into the layer, sorted (select())."""
    return select(folder).files


# --- the layer ----------------------------------------------------------------------------------------------


def dockerfile(base_image: str, *, requirements: bool) -> str:
    """The layer's Dockerfile. The files come in as the image's user (10001, group 0: OpenShift's random
    UIDs can read them). requirements.txt is installed with every torch/triton/nvidia-* package the base
    has as a constraint, as the trainer image does: pip keeps the base's CUDA build or fails."""
    lines = [
        "# orch workspace layer (orchestrator/imaging/workspace.py): the job's code over the trainer image",
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


CONTENT_DIGITS, BASE_DIGITS = 12, 8
TAG = re.compile(
    rf"{TAG_PREFIX}(?P<content>[0-9a-f]{{{CONTENT_DIGITS}}})-(?P<base>[0-9a-f]{{{BASE_DIGITS}}})"
)


def tag(folder: Path, base_image: str, kept: Iterable[str] | None = None) -> str:
    """`workspace-<12 hex>-<8 hex>`: content_digest() of the files, then a hash of the layer's Dockerfile (so of
    the base image reference). The first part alone says which files an image carries, so `orch render` can
    tell whether the job's image holds its workspace as it is now (image_problem)."""
    kept = list(files(folder) if kept is None else kept)
    layer_file = dockerfile(base_image, requirements=REQUIREMENTS in kept)
    base = hashlib.sha256(layer_file.encode()).hexdigest()[:BASE_DIGITS]
    return f"{TAG_PREFIX}{content_digest(folder, kept)}-{base}"


def content_digest(folder: Path, kept: Iterable[str] | None = None) -> str:
    """12 hex of a sha256 over what the layer holds of each file: its path, whether it is executable (the layer
    gets 0755 or 0644, nothing else of the mode), its bytes; a symlink's target. Not timestamps or owners: a
    fresh checkout of the same files gets the same digest; a changed byte, a chmod +x, a rename: a new one."""
    digest = hashlib.sha256()

    def add(*parts: bytes) -> None:
        for part in parts:  # length-prefixed: ("ab", "c") and ("a", "bc") differ
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)

    for relative in files(folder) if kept is None else kept:
        full = folder / relative
        name = os.fsencode(relative)  # a name that is not UTF-8 hashes as its bytes
        mode = os.lstat(full).st_mode
        if stat.S_ISLNK(mode):
            add(b"link", name, os.fsencode(os.readlink(full)))
            continue
        add(b"file", name, b"x" if mode & stat.S_IXUSR else b"-")
        file_digest = hashlib.sha256()
        with open(full, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                file_digest.update(chunk)
        add(file_digest.digest())
    return digest.hexdigest()[:CONTENT_DIGITS]


@dataclass(frozen=True)
class Layer:
    ref: str  # repository:workspace-<content>-<base>
    files: list[str]
    built: bool  # False: the tool already had this reference (same files, same base): not rebuilt
    notes: list[str]  # what was left out (Selection.notes)


def plan_layer(folder: Path, base_image: str, repository: str) -> tuple[Selection, str]:
    """What build_layer would ship and the reference it would push, without building: for a dry run. Refuses
    (UsageError) a folder that is not one, and files over the size limits."""
    from orchestrator.errors import UsageError
    from orchestrator.imaging import builder

    if not folder.is_dir():
        raise UsageError(f"workspace {_show(str(folder))} is not a folder")
    selection = select(folder)
    selection.check_size()
    return selection, builder.image_ref(repository, tag(folder, base_image, selection.files))


def build_layer(
    folder: Path, base_image: str, repository: str, *, tool: str | None = None, push: bool = True
) -> Layer:
    """Build (unless the tool already has it) and push `repository:workspace-<content>-<base>` FROM `base_image`.

    The build context is a temporary folder holding only the files that go in, each as the tag hashed it
    (0755 or 0644, one fixed timestamp), and the Dockerfile beside it, so nothing else of the folder reaches
    the builder and the same files give the same layer."""
    from orchestrator.imaging import builder

    selection, ref = plan_layer(folder, base_image, repository)
    chosen = builder.find_tool(tool)
    present = builder.has_image(chosen, ref)
    if not present:
        with tempfile.TemporaryDirectory(prefix="orch-workspace-") as staging:
            context = Path(staging) / "context"
            _stage(folder, selection.files, context)
            layer_file = Path(staging) / "Dockerfile"
            layer_file.write_text(dockerfile(base_image, requirements=REQUIREMENTS in selection.files))
            request = builder.BuildRequest(str(context), repository, ref.rsplit(":", 1)[1], str(layer_file))
            argv = builder.build_argv(chosen, ref, request)
            builder.check_completed(chosen, ref, builder.run_build(argv), pushing=False)
    if push:
        builder.check_completed(chosen, ref, builder.run_build(builder.push_argv(chosen, ref)), pushing=True)
    return Layer(ref, selection.files, built=not present, notes=selection.notes())


def _stage(folder: Path, kept: list[str], context: Path) -> None:
    """Copy `kept` into `context` as the layer will hold them: the bytes, 0755 if the owner may execute the file
    else 0644 (no setuid, no group or world write), folders 0755, symlinks as symlinks, all dated 0."""
    context.mkdir(mode=0o755)
    folders: set[Path] = set()
    for relative in kept:
        source, target = folder / relative, context / relative
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        folders.update(target.parents)
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        else:
            shutil.copyfile(source, target)
            target.chmod(0o755 if os.lstat(source).st_mode & stat.S_IXUSR else 0o644)
        os.utime(target, (0, 0), follow_symlinks=False)
    for directory in folders:
        if directory == context or context in directory.parents:
            directory.chmod(0o755)
            os.utime(directory, (0, 0))
