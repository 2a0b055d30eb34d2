"""Build and push the training image: pure argv builders, a content-hash tag, and one subprocess call.

`build_argv`/`push_argv` return the exact command lines for docker, podman or buildah; `context_tag`
hashes what the build would send (the context after .dockerignore, the Dockerfile, the build args), so
the same sources give the same tag and any change gives a new one. `run_build` is the only function
here that starts a process; everything else is plain data in, plain data out.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import __version__
from orchestrator.errors import OrchError, UsageError

TOOLS = ("docker", "podman", "buildah")  # the order auto-discovery tries them in
DEFAULT_REPO = "localhost/orch-trainer"
TAG_LENGTH = 12  # hex digits of the sha256; 48 bits is plenty to tell builds of one repo apart

# Build args orch fills in for the Dockerfile's OCI labels (unless the user passes their own).
LABEL_ARGS = ("ORCH_VERSION", "VCS_REF")

# What the tools print when they cannot reach their daemon / the registry refuses a push. Matched
# case-insensitively against the tail of the output so the user gets one line with a fix.
_DAEMON_DOWN = (
    "cannot connect to the docker daemon",
    "is the docker daemon running",
    "error during connect",
    "cannot connect to podman",
    "unable to connect to podman socket",
)
_PUSH_DENIED = (
    "denied",
    "unauthorized",
    "authentication required",
    "insufficient_scope",
    "401",
    "403",
)


class BuildToolMissing(OrchError):
    """No docker, podman or buildah on PATH (or not the one asked for)."""


class DaemonUnreachable(OrchError):
    """The build tool is installed but its daemon/service does not answer."""


class PushDenied(OrchError):
    """The registry refused the push (not logged in, or no write access to the repository)."""


class BuildFailed(OrchError):
    """The build (or push) command exited non-zero for another reason; its output was shown above."""


@dataclass(frozen=True)
class BuildRequest:
    """Everything one `orch build` needs; plain data so argv builders stay pure."""

    context: str
    image: str = DEFAULT_REPO
    tag: str | None = None  # None -> context_tag(...)
    dockerfile: str | None = None  # None -> <context>/Dockerfile
    build_args: Mapping[str, str] = field(default_factory=dict)
    push: bool = False

    @property
    def dockerfile_path(self) -> str:
        return self.dockerfile or os.path.join(self.context, "Dockerfile")


# --- pure: argv, references, build args ----------------------------------------------------------


def image_ref(image: str, tag: str) -> str:
    """`repo:tag`, refusing a repo that already carries a tag or digest (it would be ambiguous)."""
    last = image.rsplit("/", 1)[-1]
    if "@" in image or ":" in last:
        raise UsageError(f"--image {image!r} already has a tag or digest; pass the tag with --tag")
    return f"{image}:{tag}"


def repository(image: str) -> str:
    """`ghcr.io/acme/trainer:1.0` -> `ghcr.io/acme/trainer` (a registry port is not a tag); for
    `orch submit --build`, which rebuilds the job's image under a new content tag."""
    image = image.split("@", 1)[0]
    head, _, last = image.rpartition("/")
    name = last.split(":", 1)[0]
    return f"{head}/{name}" if head else name


def build_argv(tool: str, ref: str, request: BuildRequest) -> list[str]:
    """The build command line for `tool` (docker | podman | buildah). Pure: no files read, nothing run."""
    if tool not in TOOLS:
        raise UsageError(f"unknown build tool {tool!r}; choose one of {', '.join(TOOLS)}")
    # buildah's own verb is `bud` ("build-using-dockerfile"). It caches layers only with
    # BUILDAH_LAYERS=true: off by default, which keeps vfs-storage builds (CI) from copying the whole
    # root filesystem once per instruction.
    head = ["buildah", "bud"] if tool == "buildah" else [tool, "build"]
    argv = [*head, "--file", request.dockerfile_path, "--tag", ref]
    for key, value in sorted(request.build_args.items()):
        argv += ["--build-arg", f"{key}={value}"]
    return [*argv, request.context]


def inspect_argv(tool: str, ref: str) -> list[str]:
    """A command that exits 0 exactly when the tool's local store has `ref`."""
    if tool == "buildah":
        return ["buildah", "inspect", "--type", "image", ref]
    return [tool, "image", "inspect", ref]


def has_image(tool: str, ref: str) -> bool:
    """Whether `ref` was built here already (so an identical content tag need not be built again)."""
    return run_build(inspect_argv(tool, ref), echo=False).returncode == 0


def push_argv(tool: str, ref: str) -> list[str]:
    return [tool, "push", ref]


def parse_build_args(pairs: Sequence[str]) -> dict[str, str]:
    """`K=V` strings (from `--build-arg`) -> dict; a bare `K` takes the value from the environment,
    as `docker build --build-arg K` does."""
    args: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not key:
            raise UsageError(f"--build-arg {pair!r}: expected KEY=VALUE")
        if not sep:
            if key not in os.environ:
                raise UsageError(f"--build-arg {key}: no value given and ${key} is not set")
            value = os.environ[key]
        args[key] = value
    return args


def default_build_args(context: str, user_args: Mapping[str, str]) -> dict[str, str]:
    """The user's args plus the OCI label args orch knows (version, git revision), user args winning."""
    args = {"ORCH_VERSION": __version__}
    revision = git_revision(context)
    if revision:
        args["VCS_REF"] = revision
    return {**args, **user_args}


def git_revision(context: str) -> str | None:
    """The commit the context's git checkout is at, read from .git (no git binary needed), or None."""
    git_dir = _find_git_dir(Path(context).resolve())
    if git_dir is None:
        return None
    head = (git_dir / "HEAD").read_text().strip()
    if not head.startswith("ref: "):
        return head or None  # detached HEAD holds the sha itself
    ref = head[5:]
    loose = git_dir / ref
    if loose.is_file():
        return loose.read_text().strip()
    packed = git_dir / "packed-refs"
    if packed.is_file():
        for line in packed.read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name == ref:
                return sha
    return None  # an unborn branch: no commit yet


def _find_git_dir(start: Path) -> Path | None:
    for directory in (start, *start.parents):
        candidate = directory / ".git"
        if candidate.is_dir():
            return candidate
        if candidate.is_file():  # a worktree or submodule: "gitdir: <path>"
            target = candidate.read_text().strip().removeprefix("gitdir: ")
            return (directory / target).resolve()
    return None


# --- the content-hash tag ---------------------------------------------------------------------------


def context_files(context: str) -> list[str]:
    """Relative paths of the regular files and symlinks a build would send, sorted: what `<context>/.dockerignore`
    keeps, by Docker's rules (orchestrator/imaging/ignorefile.py, a port of the matcher docker's client uses). The
    Dockerfile is hashed apart (context_tag), wherever it is."""
    from orchestrator.imaging import ignorefile

    path = Path(context) / ".dockerignore"
    try:
        matcher = ignorefile.load(path) if path.is_file() else ignorefile.Matcher([])
    except ignorefile.BadPattern as error:
        raise UsageError(f"{error} (Docker's .dockerignore rules)") from None
    return sorted(relative for relative, entry in ignorefile.walk(context, matcher)
                  if entry.is_symlink() or entry.is_file())  # fmt: skip


def context_tag(
    context: str, dockerfile: str | None = None, build_args: Mapping[str, str] | None = None
) -> str:
    """A tag derived from the build inputs: same sources -> same tag; any change -> a new tag.

    Hashed: each sent file's path, executable bit and contents (a symlink: its target); the
    Dockerfile's contents (also when it lies outside the context); and the build args, since
    `BASE_IMAGE=...` changes the image as much as a source file does. Timestamps and owners are not
    hashed: a fresh checkout of the same commit gets the same tag.
    """
    digest = hashlib.sha256()

    def add(*parts: bytes) -> None:
        for part in parts:  # length-prefixed, so ("ab","c") and ("a","bc") differ
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)

    for relative in context_files(context):
        full = os.path.join(context, relative)
        mode = os.lstat(full).st_mode
        if stat.S_ISLNK(mode):
            add(b"link", relative.encode(), os.readlink(full).encode())
            continue
        executable = b"x" if mode & stat.S_IXUSR else b"-"
        add(b"file", relative.encode(), executable)
        add(_file_sha256(full))
    dockerfile = dockerfile or os.path.join(context, "Dockerfile")
    if os.path.isfile(dockerfile):
        with open(dockerfile, "rb") as handle:
            add(b"dockerfile", handle.read())
    for key, value in sorted((build_args or {}).items()):
        add(b"arg", key.encode(), value.encode())
    return digest.hexdigest()[:TAG_LENGTH]


def _file_sha256(path: str) -> bytes:
    file_digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            file_digest.update(chunk)
    return file_digest.digest()


# --- orch's own build context --------------------------------------------------------------------------------

# What the top-level Dockerfile reads besides the package: the wheel carries these as orchestrator/build_context
# (pyproject.toml's package-dir), so a pip-installed orch can build its trainer image from any folder.
OWN_CONTEXT_FILES = (
    "Dockerfile",
    ".dockerignore",
    "pyproject.toml",
    "README.md",
    "images/install-trainer.sh",
)


@contextmanager
def own_context() -> Iterator[str]:
    """The build context of orch's own trainer image (the top-level Dockerfile), for `orch build` in a folder
    without a Dockerfile: the source tree this orch runs from (a checkout, an editable install), else a copy
    staged from the installed package, laid out as the checkout is (pyproject.toml, README.md, orchestrator/,
    manifests/, the Dockerfile and its script), in a temporary folder removed afterwards."""
    import orchestrator

    package = Path(orchestrator.__file__).resolve().parent
    checkout = package.parent
    if (checkout / "manifests").is_dir() and all((checkout / name).is_file() for name in OWN_CONTEXT_FILES):
        yield str(checkout)
        return
    packaged = package / "build_context"
    if not all((packaged / name).is_file() for name in OWN_CONTEXT_FILES):
        raise UsageError(
            f"this orch ({package}) carries no build context for its trainer image: pass --base IMAGE (a "
            "trainer image you pushed), or run from an orch checkout"
        )

    def leave_out(directory: str, names: list[str]) -> list[str]:
        top = Path(directory) == package  # the package's own copies of the context and the manifests
        return [n for n in names if n in ("__pycache__",) or n.endswith(".pyc")
                or (top and n in ("build_context", "manifests"))]  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="orch-trainer-context-") as staging:
        for name in OWN_CONTEXT_FILES:
            (Path(staging) / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(packaged / name, Path(staging) / name)
        shutil.copytree(package, Path(staging) / "orchestrator", ignore=leave_out)
        shutil.copytree(package / "manifests", Path(staging) / "manifests", ignore=leave_out)
        yield staging


# --- tools and the one subprocess call -------------------------------------------------------------


def find_tool(preferred: str | None = None) -> str:
    """The build tool to use: `preferred` if given (must be on PATH), else the first of TOOLS that works.

    docker only counts when its daemon answers, so a machine with a docker client but no daemon
    falls through to podman or buildah instead of failing later.
    """
    if preferred:
        if preferred not in TOOLS:
            raise UsageError(f"unknown build tool {preferred!r}; choose one of {', '.join(TOOLS)}")
        if shutil.which(preferred) is None:
            raise BuildToolMissing(
                f"{preferred} is not installed or not on PATH; install it or pick --build-tool"
            )
        return preferred
    installed = [tool for tool in TOOLS if shutil.which(tool)]
    if not installed:
        raise BuildToolMissing(
            "no image build tool found: install docker, podman or buildah (or pass --dry-run to see the command)"
        )
    for tool in installed:
        if tool != "docker" or daemon_reachable("docker"):
            return tool
    raise DaemonUnreachable(
        "docker is installed but its daemon is not reachable: start it (e.g. `sudo systemctl start docker`), "
        "check DOCKER_HOST, or install podman/buildah"
    )


def daemon_reachable(tool: str) -> bool:
    """Whether `tool`'s daemon answers (`docker info`); daemonless tools always do."""
    if tool != "docker":
        return True
    return run_build(["docker", "info", "--format", "{{.ServerVersion}}"], echo=False).returncode == 0


@dataclass(frozen=True)
class Completed:
    returncode: int
    tail: str  # the last lines of combined stdout+stderr, for error classification


def run_build(argv: Sequence[str], *, echo: bool = True, env: Mapping[str, str] | None = None) -> Completed:
    """Run one tool command; stream its output to stderr (when `echo`) and keep the tail.

    This is the only place orch starts a build/push process. stdout stays clean for the final
    image reference, so `REF=$(orch build ...)` works while the build log scrolls by on stderr.
    """
    tail: deque[str] = deque(maxlen=40)
    try:
        process = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env={**os.environ, **env} if env else None,
        )
    except FileNotFoundError as error:
        raise BuildToolMissing(f"{argv[0]} is not installed or not on PATH") from error
    assert process.stdout is not None
    for line in process.stdout:
        tail.append(line)
        if echo:
            sys.stderr.write(line)
            sys.stderr.flush()
    return Completed(process.wait(), "".join(tail))


def check_completed(tool: str, ref: str, result: Completed, *, pushing: bool) -> None:
    """Turn a non-zero exit into the one-line error that says what to do."""
    if result.returncode == 0:
        return
    text = result.tail.lower()
    if any(marker in text for marker in _DAEMON_DOWN):
        raise DaemonUnreachable(
            f"{tool}: daemon not reachable; start it (or check DOCKER_HOST), or use --build-tool podman/buildah"
        )
    if pushing and any(marker in text for marker in _PUSH_DENIED):
        registry = ref.split("/", 1)[0]
        raise PushDenied(
            f"push of {ref} denied by the registry: log in (`{tool} login {registry}`) "
            "or choose a repository you can write to with --image"
        )
    last = result.tail.strip().splitlines()[-1] if result.tail.strip() else "no output"
    verb = "push" if pushing else "build"
    raise BuildFailed(f"{tool} {verb} failed (exit {result.returncode}): {last}")


def build_and_push(request: BuildRequest, *, tool: str | None = None) -> str:
    """Build the image (and push it when `request.push`); return the full image reference.

    This is what `orch build` and `orch submit --build` call: the returned reference is exactly the
    one that was built and pushed, so the job runs those bytes.
    """
    context = request.context
    if not os.path.isdir(context):
        raise UsageError(f"build context {context!r} is not a directory")
    if not os.path.isfile(request.dockerfile_path):
        raise UsageError(f"Dockerfile {request.dockerfile_path!r} not found (pass --file)")
    args = default_build_args(context, request.build_args)
    tag = request.tag or context_tag(context, request.dockerfile, request.build_args)
    ref = image_ref(request.image, tag)
    chosen = find_tool(tool)
    resolved = BuildRequest(context, request.image, tag, request.dockerfile, args, request.push)
    # A content tag the tool has already holds these sources: buildah (no layer cache by default) would
    # otherwise rebuild the whole image. A tag the user chose may move, so it is always built.
    if request.tag is not None or not has_image(chosen, ref):
        check_completed(chosen, ref, run_build(build_argv(chosen, ref, resolved)), pushing=False)
    if request.push:
        check_completed(chosen, ref, run_build(push_argv(chosen, ref)), pushing=True)
    return ref


def plan(request: BuildRequest, tool: str | None = None) -> tuple[str, list[list[str]]]:
    """What `build_and_push` would run, without running it: (image reference, [argv, ...]).

    `tool` None: the first of TOOLS on PATH (docker if none is), with no daemon probe: a dry run runs nothing.
    """
    tool = tool or next((t for t in TOOLS if shutil.which(t)), TOOLS[0])
    args = default_build_args(request.context, request.build_args)
    tag = request.tag or context_tag(request.context, request.dockerfile, request.build_args)
    ref = image_ref(request.image, tag)
    resolved = BuildRequest(request.context, request.image, tag, request.dockerfile, args, request.push)
    commands = [build_argv(tool, ref, resolved)]
    if request.push:
        commands.append(push_argv(tool, ref))
    return ref, commands
