"""`orch build`: argv per tool, the content-hash tag, tool discovery and the errors users see.

The build tools here are real (docker's client without a daemon, buildah); no registry can exist on
this machine, so the push-denied case talks to a tiny HTTP server that answers like a registry that
refuses the credentials.
"""

from __future__ import annotations

import http.server
import os
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.imaging import builder
from tests.conftest import require_tool
from tests.fakes.cli import run_orch

REPO_ROOT = Path(__file__).resolve().parents[2]


def orch(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`orch ARGS` in process, as the console script runs it (tests/fakes/cli.py): what it prints and returns.
    A build runs the tool as a child process; tests that build are `launch` through their buildah_env."""
    return run_orch(*args, env=dict(env or {}), cwd=cwd)


@pytest.fixture
def context(tmp_path: Path) -> Path:
    """A small build context with a .dockerignore, like a user's project."""
    root = tmp_path / "ctx"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "train.py").write_text("print('hi')\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "Dockerfile").write_text("FROM scratch\nCOPY pkg /pkg\n")
    (root / "notes").mkdir()
    (root / "notes" / "todo.md").write_text("x\n")
    (root / ".dockerignore").write_text("# docs are not in the image\nnotes\n*.log\n")
    return root


# --- argv ------------------------------------------------------------------------------------------


def test_build_argv_per_tool() -> None:
    request = builder.BuildRequest("ctx", build_args={"B": "2", "A": "1"})
    ref = "ghcr.io/acme/t:abc"
    assert builder.build_argv("docker", ref, request) == [
        "docker", "build", "--file", "ctx/Dockerfile", "--tag", ref,
        "--build-arg", "A=1", "--build-arg", "B=2", "ctx",
    ]  # fmt: skip
    assert builder.build_argv("podman", ref, request)[:2] == ["podman", "build"]
    assert builder.build_argv("buildah", ref, request) == [
        "buildah", "bud", "--file", "ctx/Dockerfile", "--tag", ref,
        "--build-arg", "A=1", "--build-arg", "B=2", "ctx",
    ]  # fmt: skip
    assert builder.push_argv("podman", ref) == ["podman", "push", ref]


def test_build_argv_custom_dockerfile_and_unknown_tool() -> None:
    request = builder.BuildRequest(".", dockerfile="images/cpu/Dockerfile")
    assert builder.build_argv("docker", "r:t", request)[2:4] == ["--file", "images/cpu/Dockerfile"]
    with pytest.raises(builder.UsageError, match="unknown build tool 'kaniko'"):
        builder.build_argv("kaniko", "r:t", request)


def test_image_ref_rejects_a_repo_that_has_a_tag() -> None:
    assert builder.image_ref("localhost:5000/team/trainer", "abc") == "localhost:5000/team/trainer:abc"
    with pytest.raises(builder.UsageError, match="already has a tag"):
        builder.image_ref("ghcr.io/acme/trainer:1.0", "abc")


@pytest.mark.parametrize(
    ("image", "repo"),
    [
        ("ghcr.io/acme/trainer:1.0", "ghcr.io/acme/trainer"),
        ("localhost:5000/trainer", "localhost:5000/trainer"),
        ("localhost:5000/t/trainer:v2@sha256:abc", "localhost:5000/t/trainer"),
        ("trainer", "trainer"),
    ],
)
def test_repository(image: str, repo: str) -> None:
    assert builder.repository(image) == repo


def test_parse_build_args(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FROM_ENV", "yes")
    assert builder.parse_build_args(["A=1", "B=x=y", "FROM_ENV", "EMPTY="]) == {
        "A": "1", "B": "x=y", "FROM_ENV": "yes", "EMPTY": "",
    }  # fmt: skip
    monkeypatch.delenv("NOPE", raising=False)
    with pytest.raises(builder.UsageError, match=r"\$NOPE is not set"):
        builder.parse_build_args(["NOPE"])


def test_git_revision_reads_head(tmp_path: Path) -> None:
    git = require_tool("git")
    subprocess.run([git, "init", "-q", str(tmp_path)], check=True)
    assert builder.git_revision(str(tmp_path)) is None  # no commit yet
    (tmp_path / "f").write_text("x")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    subprocess.run([git, "-C", str(tmp_path), "add", "f"], check=True)
    subprocess.run([git, "-C", str(tmp_path), "commit", "-qm", "x"], check=True, env=env)
    expected = subprocess.run([git, "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True)
    (tmp_path / "sub").mkdir()  # a context below the checkout's root finds the same .git
    assert builder.git_revision(str(tmp_path / "sub")) == expected.stdout.strip()
    subprocess.run([git, "-C", str(tmp_path), "pack-refs", "--all"], check=True)  # now only in packed-refs
    assert builder.git_revision(str(tmp_path)) == expected.stdout.strip()


# --- the content-hash tag ---------------------------------------------------------------------------


def test_context_files_respect_dockerignore(context: Path) -> None:
    (context / "build.log").write_text("noise")
    assert builder.context_files(str(context)) == [".dockerignore", "Dockerfile", "pkg/train.py", "run.sh"]


def test_repo_context_is_only_what_the_image_needs() -> None:
    files = builder.context_files(str(REPO_ROOT))
    assert "pyproject.toml" in files and "Dockerfile" in files and "images/cpu/Dockerfile" in files
    assert any(f.startswith("orchestrator/") for f in files)
    assert not [
        f
        for f in files
        if f.startswith(("tests/", ".venv/", ".git/", "runs/", "docs/")) or "__pycache__" in f
    ]


def test_tag_is_stable_and_follows_every_input(context: Path, tmp_path: Path) -> None:
    tag = builder.context_tag(str(context))
    assert tag == builder.context_tag(str(context)) and len(tag) == builder.TAG_LENGTH

    # A copy elsewhere, with other timestamps, is the same source: same tag.
    copy = tmp_path / "copy"
    shutil.copytree(context, copy)
    os.utime(copy / "pkg" / "train.py", (1, 1))
    assert builder.context_tag(str(copy)) == tag

    # Ignored files do not count; sent files, their mode and names do.
    (context / "notes" / "todo.md").write_text("changed\n")
    assert builder.context_tag(str(context)) == tag
    (context / "pkg" / "train.py").write_text("print('changed')\n")
    changed = builder.context_tag(str(context))
    assert changed != tag
    (context / "run.sh").chmod(0o755)
    executable = builder.context_tag(str(context))
    assert executable != changed
    (context / "pkg" / "train.py").rename(context / "pkg" / "main.py")
    assert builder.context_tag(str(context)) != executable

    # The Dockerfile and the build args are inputs too.
    before = builder.context_tag(str(context))
    assert builder.context_tag(str(context), build_args={"BASE_IMAGE": "x"}) != before
    (context / "Dockerfile").write_text("FROM scratch\n")
    assert builder.context_tag(str(context)) != before


def test_dockerfile_outside_the_context_is_hashed(context: Path, tmp_path: Path) -> None:
    outside = tmp_path / "Other.Dockerfile"
    outside.write_text("FROM scratch\n")
    tag = builder.context_tag(str(context), str(outside))
    outside.write_text("FROM scratch\nLABEL a=b\n")
    assert builder.context_tag(str(context), str(outside)) != tag


# --- the command ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tool", builder.TOOLS)
def test_dry_run_prints_commands_then_the_reference(tool: str, context: Path) -> None:
    result = orch("build", str(context), "--image", "ghcr.io/acme/t", "--tool", tool, "--push",
                  "--build-arg", "BASE_IMAGE=base:1", "--dry-run")  # fmt: skip
    assert result.returncode == 0, result.stderr
    tag = builder.context_tag(str(context), build_args={"BASE_IMAGE": "base:1"})
    ref = f"ghcr.io/acme/t:{tag}"
    build, push, last = result.stdout.strip().splitlines()
    head = ["buildah", "bud"] if tool == "buildah" else [tool, "build"]
    assert shlex.split(build) == [
        *head, "--file", f"{context}/Dockerfile", "--tag", ref, "--build-arg", "BASE_IMAGE=base:1",
        "--build-arg", f"ORCH_VERSION={builder.__version__}", str(context),
    ]  # fmt: skip
    assert shlex.split(push) == [tool, "push", ref]
    assert last == ref


@pytest.mark.parametrize(("on_path", "shown"), [(("buildah", "podman"), "podman"), ((), "docker")])
def test_dry_run_without_tool_shows_the_first_tool_on_path(
    on_path: tuple[str, ...], shown: str, context: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`orch build --dry-run` and `orch submit --build --dry-run` share this choice (builder.plan): no daemon
    is probed, since nothing runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in on_path:
        (bin_dir / tool).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    _, commands = builder.plan(builder.BuildRequest(context=str(context), push=True))
    assert [argv[0] for argv in commands] == [shown, shown]


def test_dry_run_of_the_repo_passes_revision_and_is_stable() -> None:
    first = orch("build", "--dry-run", "--tool", "podman", cwd=REPO_ROOT)
    second = orch("build", "--dry-run", "--tool", "podman", cwd=REPO_ROOT)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert first.stdout.strip().splitlines()[-1].startswith("localhost/orch-trainer:")
    revision = builder.git_revision(str(REPO_ROOT))
    if revision:
        assert f"VCS_REF={revision}" in first.stdout


def test_explicit_tag_wins(context: Path) -> None:
    result = orch("build", str(context), "--tag", "v1", "--tool", "docker", "--dry-run")
    assert result.stdout.strip().splitlines()[-1] == "localhost/orch-trainer:v1"


def test_no_build_tool_is_a_clear_error(context: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    result = subprocess.run([sys.executable, "-m", "orchestrator", "build", str(context)], capture_output=True,
                            text=True, env={**os.environ, "PATH": str(empty)})  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: no image build tool found: install docker, podman or buildah (or pass --dry-run to see the command)"
    )


def test_docker_without_a_daemon_is_a_clear_error(context: Path, tmp_path: Path) -> None:
    docker = require_tool("docker")
    only_docker = tmp_path / "bin"
    only_docker.mkdir()
    (only_docker / "docker").symlink_to(docker)
    env = {**os.environ, "PATH": str(only_docker), "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"}
    auto = subprocess.run([sys.executable, "-m", "orchestrator", "build", str(context)], capture_output=True,
                          text=True, env=env, timeout=60)  # fmt: skip
    assert auto.returncode == 1
    assert auto.stderr.startswith("error: docker is installed but its daemon is not reachable")
    explicit = subprocess.run([sys.executable, "-m", "orchestrator", "build", str(context), "--tool", "docker"],
                              capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert explicit.returncode == 1
    assert explicit.stderr.strip().splitlines()[-1].startswith("error: docker: daemon not reachable")
    assert "Traceback" not in explicit.stderr


def test_a_missing_dockerfile_named_by_file_is_a_usage_error(tmp_path: Path) -> None:
    result = orch("build", str(tmp_path), "--file", str(tmp_path / "Dockerfile"), "--tool", "buildah")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: Dockerfile '{tmp_path}/Dockerfile' not found (pass --file)"


# --- from any folder (#33): orch's own trainer image, the workspace layer on it ---------------------------------


def user_project(root: Path) -> Path:
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "tasks.py").write_text("def make_task():\n    pass\n")
    (root / "job.yaml").write_text(
        "name: demo\nimage: ghcr.io/acme/trainer:1\ntrain: {task: 'mypkg.tasks:make_task'}\n"
    )
    return root


@pytest.mark.parametrize("flag", ["--build-tool", "--tool"])  # --tool: its name before #33, kept as an alias
def test_a_folder_without_a_dockerfile_builds_orchs_own_trainer_image(tmp_path: Path, flag: str) -> None:
    """In a folder of one's own without job.yaml: the trainer image from the build context orch runs from (here
    this checkout; test_a_wheel_carries_the_build_context_of_its_trainer_image for an installed wheel)."""
    result = orch("build", "--image", "ghcr.io/acme/trainer", flag, "podman", "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    ref = f"ghcr.io/acme/trainer:{builder.context_tag(str(REPO_ROOT))}"
    command, last = result.stdout.strip().splitlines()
    argv = shlex.split(command)
    assert argv[:6] == ["podman", "build", "--file", f"{REPO_ROOT}/Dockerfile", "--tag", ref]
    assert argv[-1] == str(REPO_ROOT) and last == ref
    assert result.stderr.splitlines() == [
        f". has no Dockerfile: building orch's trainer image (from {REPO_ROOT})"
    ]


def test_in_a_project_the_workspace_goes_on_the_trainer_image_and_its_reference_is_printed(
    tmp_path: Path,
) -> None:
    from orchestrator.imaging import workspace

    root = user_project(tmp_path / "project")
    (root / ".env").write_text("TOKEN=x\n")
    result = orch(
        "build", "--image", "ghcr.io/acme/trainer", "--tool", "buildah", "--push", "--dry-run", cwd=root
    )
    assert result.returncode == 0, result.stderr
    trainer = f"ghcr.io/acme/trainer:{builder.context_tag(str(REPO_ROOT))}"
    build, push, last = result.stdout.strip().splitlines()
    assert shlex.split(build)[-1] == str(REPO_ROOT) and shlex.split(push) == ["buildah", "push", trainer]
    assert last == f"ghcr.io/acme/trainer:{workspace.tag(root, trainer)}"
    assert result.stderr.splitlines()[1:] == [
        f"workspace {root}: left out 1 files that look like credentials: .env (to ship one on purpose, add a line "
        "`!PATH` naming it to .orchignore)",
        f"workspace {root}: 2 files -> {last} (FROM {trainer})",
    ]
    # --base: no trainer image is built; the layer goes on the one named. The repository: the job's image's.
    only_layer = orch(
        "build", "--base", "ghcr.io/acme/trainer:1", "--build-tool", "buildah", "--dry-run", cwd=root
    )
    assert only_layer.returncode == 0, only_layer.stderr
    assert only_layer.stdout.strip().splitlines() == [
        f"ghcr.io/acme/trainer:{workspace.tag(root, 'ghcr.io/acme/trainer:1')}"
    ]


@pytest.mark.parametrize("flag", ["--build-tool", "--tool"])
def test_submit_build_takes_the_same_flag_and_builds_orchs_trainer_without_a_dockerfile(
    tmp_path: Path, flag: str
):
    """A built-in task in a folder of one's own: no workspace, no Dockerfile: orch's own trainer image is built
    into the job's repository (before #33: `Dockerfile './Dockerfile' not found`)."""
    import yaml

    (tmp_path / "job.yaml").write_text("name: demo\nimage: ghcr.io/acme/trainer:1\ntrain: {task: digits}\n")
    result = orch("submit", "job.yaml", "--build", flag, "podman", "--dry-run=client", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    ref = f"ghcr.io/acme/trainer:{builder.context_tag(str(REPO_ROOT))}"
    assert result.stderr.splitlines()[1].startswith(
        f"podman build --file {REPO_ROOT}/Dockerfile --tag {ref} "
    )
    job = next(o for o in yaml.safe_load_all(result.stdout) if o["kind"] == "PyTorchJob")
    assert {
        r["template"]["spec"]["containers"][0]["image"] for r in job["spec"]["pytorchReplicaSpecs"].values()
    } == {ref}


def test_a_wheel_carries_the_build_context_of_its_trainer_image(tmp_path: Path) -> None:
    """pip install of orch from a checkout (a wheel) has no checkout to build from: the wheel carries the
    Dockerfile, its script and pyproject.toml (orchestrator/build_context), own_context stages them as the
    checkout lays them out, and the Dockerfile's first stage (`pip wheel .` of that context) makes the same
    wheel again. Real: setuptools builds the wheel, another interpreter runs orch from it unpacked."""
    import zipfile

    source = tmp_path / "source"  # what .dockerignore sends: the checkout without its build outputs
    for relative in builder.context_files(str(REPO_ROOT)):
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / relative, source / relative)
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "--wheel-dir", str(tmp_path / "wheel"), str(source)], check=True, timeout=300)
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    script = (
        "import subprocess, sys\n"
        "from orchestrator.imaging import builder\n"
        "with builder.own_context() as context:\n"
        "    print(context)\n"
        f"    subprocess.run([*{pip!r}, '--wheel-dir', {str(tmp_path / 'again')!r}, context], check=True)\n"
    )
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=empty,
                            env={**os.environ, "PYTHONPATH": str(site)}, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert not Path(result.stdout.strip()).exists()  # staged in a temporary folder, removed afterwards
    (again,) = (tmp_path / "again").glob("*.whl")

    def contents(path: Path) -> dict[str, bytes]:
        with zipfile.ZipFile(path) as archive:
            return {n: archive.read(n) for n in archive.namelist() if ".dist-info/" not in n}

    assert contents(again) == contents(wheel)
    assert "orchestrator/build_context/Dockerfile" in contents(wheel)


class _RefusingRegistry(http.server.BaseHTTPRequestHandler):
    """Answers every request as a registry does for a client without push rights."""

    def _deny(self) -> None:
        body = b'{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.send_header("WWW-Authenticate", 'Basic realm="test"')
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = _deny

    def log_message(self, *args: object) -> None:
        pass


def test_push_denied_is_a_clear_error(tmp_path: Path, buildah_env: dict[str, str]) -> None:
    """A real `buildah push` of a FROM-scratch image to a registry that refuses it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RefusingRegistry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    registry = f"127.0.0.1:{server.server_address[1]}"
    registries_conf = tmp_path / "registries.conf"
    registries_conf.write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY hello /hello\n")
    (ctx / "hello").write_text("hi\n")
    try:
        result = orch("build", str(ctx), "--tool", "buildah", "--image", f"{registry}/team/trainer", "--push",
                      env={**buildah_env, "CONTAINERS_REGISTRIES_CONF": str(registries_conf)})  # fmt: skip
    finally:
        server.shutdown()
    tag = builder.context_tag(str(ctx))
    subprocess.run(["buildah", "rmi", f"{registry}/team/trainer:{tag}"], capture_output=True,
                   env={**os.environ, **buildah_env})  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: push of {registry}/team/trainer:{tag} denied by the registry: log in "
        f"(`buildah login {registry}`) or choose a repository you can write to with --image"
    )
