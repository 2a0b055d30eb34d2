"""The sweep's picture: the objective per trial, and per parameter, as one PNG (matplotlib, offline, no
display). People look at a sweep; they do not read a table of 50 rows.

matplotlib is optional (the `sweep` extra installs it): without it `write` returns None and the status says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from orchestrator.sweep.spec import CategoricalParameter, FloatParameter, IntParameter, Sweep
from orchestrator.sweep.study import TrialRow

PLOT = "objective.png"
COLORS = {"complete": "tab:blue", "pruned": "tab:orange", "running": "tab:green", "failed": "tab:red"}


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def write(sweep: Sweep, rows: Sequence[TrialRow], path: Path | None = None) -> Path | None:
    """Draw the trials into `path` (default: the sweep folder's objective.png); None without matplotlib."""
    if not available():
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    path = path or sweep.folder / PLOT
    parameters = list(sweep.spec.parameters.items())
    columns = 1 + len(parameters)
    figure, axes = plt.subplots(1, columns, figsize=(4.2 * columns, 3.6), squeeze=False, sharey=True)
    shown = [row for row in rows if row.value is not None and math.isfinite(row.value)]
    per_trial = axes[0][0]
    for state, color in COLORS.items():
        these = [row for row in shown if row.state == state]
        if these:
            per_trial.scatter([r.number for r in these], [r.value for r in these], c=color, label=state, s=22)
    best_so_far = _best_so_far(
        sorted((r for r in shown if r.state == "complete"), key=lambda r: r.number), sweep.maximize
    )
    if best_so_far:
        per_trial.step(*zip(*best_so_far, strict=True), where="post", c="black", lw=1, label="best so far")
    per_trial.set_xlabel("trial")
    per_trial.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    per_trial.set_ylabel(sweep.metric + (" (higher is better)" if sweep.maximize else " (lower is better)"))
    per_trial.legend(fontsize=7)
    for axis, (name, parameter) in zip(axes[0][1:], parameters, strict=True):
        for state, color in COLORS.items():
            these = [row for row in shown if row.state == state and name in row.params]
            if not these:
                continue
            xs = [row.params[name] for row in these]
            if isinstance(parameter, CategoricalParameter):
                labels = [str(v) for v in parameter.values]
                xs = [labels.index(str(x)) if str(x) in labels else -1 for x in xs]
            axis.scatter(xs, [r.value for r in these], c=color, s=22)
        if isinstance(parameter, CategoricalParameter):
            axis.set_xticks(range(len(parameter.values)), [str(v) for v in parameter.values])
        elif isinstance(parameter, (FloatParameter, IntParameter)) and parameter.log:
            axis.set_xscale("log")
            axis.xaxis.set_minor_formatter(ticker.NullFormatter())  # 2x10^-3 ... labels overlap
        axis.set_xlabel(name)
    figure.suptitle(f"sweep {sweep.name}: {len(rows)} trials")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    figure.savefig(tmp, dpi=100)
    plt.close(figure)
    tmp.replace(path)
    return path


def _best_so_far(rows: Sequence[TrialRow], maximize: bool) -> list[tuple[int, float]]:
    best: float | None = None
    points = []
    for row in rows:
        assert row.value is not None
        if best is None or (row.value > best if maximize else row.value < best):
            best = row.value
        points.append((row.number, best))
    return points
