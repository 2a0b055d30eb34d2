"""Every series the trainer's exporter declares (trainer/metrics.py's tables) is in docs/metrics.md's table,
under the name Prometheus shows (a counter's with `_total`), with its type and its labels besides the rank's."""

from __future__ import annotations

import re

from orchestrator.trainer import metrics
from tests.metrics.conftest import REPO

DECLARED = (
    *metrics.TRAINING_SERIES,
    *metrics.CUDA_SERIES,
    metrics.COLLECTIVE_TIMEOUT,
    metrics.PEAK_FLOPS,
    metrics.PEAK_FLOPS_UNKNOWN,
    metrics.RANK_INFO,
    *metrics.GOODPUT_SERIES,
)


def documented() -> dict[str, tuple[str, set[str]]]:
    """docs/metrics.md's rows: name -> (type, extra labels)."""
    rows = {}
    for line in (REPO / "docs" / "metrics.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) == 5 and re.fullmatch(r"`orch_[a-z_]+`", cells[0]):
            rows[cells[0].strip("`")] = (cells[1].split()[0], set(re.findall(r"`([a-z_]+)`", cells[3])))
    return rows


def test_every_declared_series_is_documented_with_its_type_and_labels():
    rows = documented()
    for series in DECLARED:
        shown = series.name + ("_total" if series.kind == "counter" else "")
        assert shown in rows, f"{shown} is not in docs/metrics.md"
        kind, labels = rows[shown]
        assert kind == series.kind, shown
        extra = {"le"} if series.kind == "histogram" else set()
        assert set(series.by) | extra <= labels, shown
