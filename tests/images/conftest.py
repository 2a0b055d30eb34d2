"""Fixtures for real image builds with buildah (chroot isolation, vfs storage; see
../shared/notes/offline-testing.md §6). No image registry is reachable here, so:
- the Python base is made locally by images/ci/make-base.sh (debootstrap from the Debian mirror apt
  uses) and kept in a cache dir, keyed by the script's content, so later runs skip the ~1 min;
- pip inside the build gets its wheels from a wheelhouse that the host's pip downloads (torch: the CPU
  wheel) and a local HTTP server serves as `--find-links`, exactly how a private mirror is used.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

from tests.conftest import require_tool

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "orch-tests" / "images"
TORCH_SPEC = "torch==2.13.0"  # the CPU wheel the dev venv uses (Makefile's TORCH_SPEC)


@pytest.fixture(scope="session")
def buildah_env() -> dict[str, str]:
    """Environment for buildah: chroot isolation (no cgroups/namespaces needed) and a vfs store of our own."""
    require_tool("buildah")
    CACHE.mkdir(parents=True, exist_ok=True)
    conf = CACHE / "storage.conf"
    conf.write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{CACHE / "storage"}"\nrunroot = "{CACHE / "run"}"\n'
    )
    return {"CONTAINERS_STORAGE_CONF": str(conf), "BUILDAH_ISOLATION": "chroot"}


def buildah(env: dict[str, str], *args: str, timeout: float = 300, check: bool = True) -> str:
    result = subprocess.run(["buildah", *args], capture_output=True, text=True, env={**os.environ, **env},
                            timeout=timeout)  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(
            f"buildah {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result.stdout


@pytest.fixture(scope="session")
def ci_base(buildah_env: dict[str, str]) -> str:
    """localhost/orch-ci-base:<hash of make-base.sh>: bookworm + python3 + venv, built once per recipe."""
    require_tool("debootstrap")
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
def torch_base(buildah_env: dict[str, str], ci_base: str, wheelhouse: str) -> str:
    """Stand-in for the pytorch/pytorch base (Python + torch + torchrun on PATH, root): the `torch` stage of
    images/cpu/Dockerfile, built once per (that Dockerfile, base, wheel set) and kept like the base."""
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
