"""A user's side of the emulator: a kubeconfig pointing at it, and `orch` run as the console script runs."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from click.testing import CliRunner

from tests.fakes.kube import Kube


def write_kubeconfig(path: Path, url: str, *, contexts: dict[str, str | None], current: str) -> Path:
    """A kubeconfig like a user's: one cluster, a token user, a context per namespace."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "tester", "user": {"token": "not-a-secret"}}],
        "contexts": [
            {
                "name": name,
                "context": {"cluster": "emulator", "user": "tester", **({"namespace": ns} if ns else {})},
            }
            for name, ns in contexts.items()
        ],
        "current-context": current,
    }
    path.write_text(yaml.safe_dump(config))
    return path


FAST = {"ORCH_POLL_SECONDS": "0.05", "ORCH_API_BACKOFF_SECONDS": "0.01", "ORCH_API_RETRIES": "3"}


@dataclass
class Env:
    kube: Kube
    kubeconfig: Path
    home: Path
    vars: dict[str, str]

    def orch(self, *args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
        """Run `orch` in this process exactly as the console script does (main(): errors, exit codes)."""
        return CliRunner().invoke(_EntryPoint(), list(args), env={**self.vars, **(env or {})})


def run_orch(
    *args: str, cwd: Path | None = None, env: dict[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    """`orch ARGS` run in this process exactly as the console script runs it (main(): its `error:` line and exit
    code), for tests about what orch prints and returns: milliseconds, where a process costs a Python start
    (~0.4 CPU-s). An exception that main() lets escape (a traceback in the real process) is raised here, so
    such a test fails on it too."""
    with contextlib.chdir(cwd or Path.cwd()):
        result = CliRunner().invoke(_EntryPoint(), list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception.with_traceback(result.exc_info[2] if result.exc_info else None)
    return subprocess.CompletedProcess(["orch", *args], result.exit_code, result.stdout, result.stderr)


class _EntryPoint:
    """Lets CliRunner run `orchestrator.cli.main()` (which reads sys.argv and calls sys.exit)."""

    name = "orch"

    def main(self, args=(), prog_name=None, **_):  # type: ignore[no-untyped-def]
        from orchestrator.cli import main

        saved = sys.argv
        handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
        sys.argv = ["orch", *args]
        try:
            main()
        finally:
            # The process would end here; this one goes on (orch run ignores stop signals once its run is over).
            sys.argv = saved
            for number, handler in handlers.items():
                signal.signal(number, handler)
