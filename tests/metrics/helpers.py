"""Helpers shared by the metrics tests: run exporter driver processes, scrape an endpoint."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "metrics" / "drive_exporter.py"


def start_driver(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    # Nothing of the test runner's own metrics settings leaks in: each test says what it sets.
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "PROMETHEUS_MULTIPROC"))}
    full_env.update(env or {})
    return subprocess.Popen(
        [sys.executable, str(DRIVER), *args],
        cwd=REPO,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def scrape(port: int, timeout: float = 15.0) -> dict[str, list]:
    """name -> [(labels, value)] from an exporter, retrying until it answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out
