"""A rank whose training raised ends at once (#25, class 9): a non-daemon thread (DCP's async save, blocked in
a collective with ranks that are gone) cannot hold it until the launcher's SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

# A thread like DCP's async save thread: not a daemon, blocked for good.
SCRIPT = """
import threading, time
from orchestrator.trainer.exits import exit_now
threading.Thread(target=lambda: time.sleep(3600), daemon=False).start()
try:
    raise {error}
except BaseException as error:
    exit_now(error)
"""


@pytest.mark.parametrize(
    ("error", "returncode", "traceback"),
    [
        ("KeyboardInterrupt()", -signal.SIGINT, True),
        ("RuntimeError('checkpoint failed')", 1, True),
        ("SystemExit(3)", 3, False),
        ("SystemExit(0)", 0, False),
    ],
)
def test_a_raised_rank_exits_at_once_with_pythons_status(error, returncode, traceback):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(error=error)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == returncode, result.stderr
    assert ("Traceback (most recent call last):" in result.stderr) is traceback
