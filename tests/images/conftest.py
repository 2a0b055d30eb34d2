"""Fixtures for real image builds with buildah (chroot isolation, overlay storage where the kernel has it, else
vfs; see ../shared/notes/offline-testing.md §6). No image registry is reachable here, so:
- the Python base is made locally by images/ci/make-base.sh (debootstrap from the Debian mirror apt
  uses) and kept in a cache dir, keyed by the script's content, so later runs skip the ~1 min;
- pip inside the build gets its wheels from a wheelhouse that the host's pip downloads (torch: the CPU
  wheel) and a local HTTP server serves as `--find-links`, exactly how a private mirror is used.

Every image here is built at most once per test run: the bases are kept across runs (keyed by their recipe),
the trainer image (the top-level Dockerfile) is built once per session for the tests that check it or build on
it, and removed at the end. A container is a copy of its image's whole root filesystem where the store is vfs,
so a test runs all its commands in one container.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import tomllib

from tests.conftest import require_tool
from tests.tiers import shared_fixture_teardown

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "orch-tests" / "images"
TORCH_SPEC = "torch==2.13.0"  # the CPU wheel the dev venv uses (Makefile's TORCH_SPEC)
ORCH = str(Path(sys.executable).with_name("orch"))


def storage_env() -> dict[str, str]:
    """Environment for buildah: chroot isolation (no cgroups/namespaces needed) and a store of our own."""
    driver = _storage_driver()
    return {"CONTAINERS_STORAGE_CONF": str(CACHE / f"storage-{driver}.conf"), "BUILDAH_ISOLATION": "chroot"}


@functools.cache
def _storage_driver() -> str:
    """overlay where the kernel gives it to us: containers and build stages share their image's layers. Else
    vfs, which copies the whole root filesystem for each container, build stage and commit: with it, ~300 of the
    image tests' ~480 CPU-s were the kernel copying files (docs/testing.md)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    for driver, root in (("overlay", "storage-overlay"), ("vfs", "storage")):  # vfs: the store's old place
        conf = CACHE / f"storage-{driver}.conf"
        conf.write_text(f'[storage]\ndriver = "{driver}"\ngraphroot = "{CACHE / root}"\n'
                        f'runroot = "{CACHE / f"run-{driver}"}"\n')  # fmt: skip
        env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf)}
        if subprocess.run(["buildah", "info"], capture_output=True, env=env, timeout=120).returncode == 0:
            return driver
    return "vfs"  # its errors are the clearest


@pytest.fixture
def buildah_env() -> dict[str, str]:
    """storage_env() for a test that runs buildah. Per test, not per session: a test that needs buildah and no
    base image (a FROM-scratch push) shares nothing, so tests/tiers.py leaves it free to run on any worker."""
    require_tool("buildah")
    return storage_env()


def buildah(env: dict[str, str], *args: str, timeout: float = 300, check: bool = True) -> str:
    result = subprocess.run(["buildah", *args], capture_output=True, text=True, env={**os.environ, **env},
                            timeout=timeout)  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(
            f"buildah {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result.stdout


@contextmanager
def container(env: dict[str, str], ref: str) -> Iterator[str]:
    """A working container of `ref` (on vfs, a full copy of the image), removed afterwards."""
    name = buildah(env, "from", ref).strip()
    try:
        yield name
    finally:
        buildah(env, "rm", name, check=False)


def container_file(env: dict[str, str], name: str, path: str) -> str:
    """A file of container `name`, read from its mounted root filesystem. Not `buildah run NAME -- cat PATH`: under
    chroot isolation that once printed nothing and exited 0 for a complete summary.json (a CI run, 2026-12-02)."""
    root = buildah(env, "mount", name).strip()
    try:
        return (Path(root) / path.lstrip("/")).read_text()
    finally:
        buildah(env, "umount", name, check=False)


def orch_build(env: dict[str, str], *args: str) -> str:
    """`orch build` of the repository with buildah; the image reference it prints last."""
    result = subprocess.run([ORCH, "build", str(REPO_ROOT), "--tool", "buildah", *args], capture_output=True,
                            text=True, env={**os.environ, **env}, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout.strip().splitlines()[-1]


def image_config(env: dict[str, str], ref: str) -> dict:
    return json.loads(buildah(env, "inspect", "--type", "image", ref))["OCIv1"]["config"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pip_from(wheelhouse: str) -> list[str]:
    """Build args that make pip inside the build install only from the local wheelhouse."""
    return ["--build-arg", "PIP_NO_INDEX=1", "--build-arg", f"PIP_FIND_LINKS={wheelhouse}"]


@pytest.fixture(scope="session")
def ci_base() -> str:
    """localhost/orch-ci-base:<hash of make-base.sh>: bookworm + python3 + venv, built once per recipe."""
    require_tool("buildah")
    require_tool("debootstrap")
    buildah_env = storage_env()
    script = REPO_ROOT / "images" / "ci" / "make-base.sh"
    name = f"localhost/orch-ci-base:{hashlib.sha256(script.read_bytes()).hexdigest()[:12]}"
    present = subprocess.run(["buildah", "inspect", "--type", "image", name], capture_output=True,
                             env={**os.environ, **buildah_env})  # fmt: skip
    if present.returncode != 0:
        result = subprocess.run(["sh", str(script), name], capture_output=True, text=True,
                                env={**os.environ, **buildah_env}, timeout=600)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
    return name


def _requirements() -> list[str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    return [
        *project["build-system"]["requires"],
        *project["project"]["dependencies"],
        *project["project"]["optional-dependencies"]["train"],
        *project["project"]["optional-dependencies"]["tracking"],  # the images install [train,tracking]
        TORCH_SPEC,
    ]


@pytest.fixture(scope="session")
def wheelhouse() -> Iterator[str]:
    """URL of a local HTTP find-links directory with every wheel the images install."""
    requirements = _requirements()
    key = hashlib.sha256("\n".join([sys.version, *requirements]).encode()).hexdigest()[:12]
    directory = CACHE / f"wheels-{key}"
    if not (directory / ".complete").exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
                        "--dest", str(directory), *requirements], check=True, timeout=600)  # fmt: skip
        (directory / ".complete").touch()
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def torch_base(ci_base: str, wheelhouse: str) -> str:
    """Stand-in for the pytorch/pytorch base (Python + torch + torchrun on PATH, root): the `torch` stage of
    images/cpu/Dockerfile, built once per (that Dockerfile, base, wheel set) and kept like the base."""
    buildah_env = storage_env()
    dockerfile = REPO_ROOT / "images" / "cpu" / "Dockerfile"
    key = hashlib.sha256(dockerfile.read_bytes() + ci_base.encode() + "\n".join(_requirements()).encode())
    name = f"localhost/orch-ci-torch:{key.hexdigest()[:12]}"
    present = subprocess.run(["buildah", "inspect", "--type", "image", name], capture_output=True,
                             env={**os.environ, **buildah_env})  # fmt: skip
    if present.returncode != 0:
        buildah(buildah_env, "bud", "--target", "torch", "--file", str(dockerfile), "--tag", name,
                "--build-arg", f"PYTHON_IMAGE={ci_base}", "--build-arg", "PIP_NO_INDEX=1",
                "--build-arg", f"PIP_FIND_LINKS={wheelhouse}", str(REPO_ROOT), timeout=900)  # fmt: skip
    return name


@pytest.fixture(scope="session")
def trainer_image(torch_base: str, wheelhouse: str) -> Iterator[str]:
    """The top-level (CUDA) Dockerfile built by `orch build` on torch_base, once per session: test_image.py checks
    it, test_workspace_image.py layers a workspace on it and trains in that. Removed at the end of the session."""
    env = storage_env()
    ref = orch_build(env, "--image", "localhost/orch-trainer", "--build-arg", f"BASE_IMAGE={torch_base}",
                     *pip_from(wheelhouse))  # fmt: skip
    yield ref
    with shared_fixture_teardown():  # may run in the teardown of an in-process test (tests/tiers.py)
        buildah(env, "rmi", "--force", ref, check=False)
        buildah(env, "rmi", "--prune", check=False)
