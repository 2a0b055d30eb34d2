"""What `orch sweep` reads of a trial as it trains: the objective's value at each evaluation and at the end.

The sweep names its metric in ORCH_OBJECTIVE (`eval/loss`, `eval/accuracy`, `train/loss`: the names the
trackers show). Rank 0 then keeps `objective.json` in the output directory, rewritten whole (renamed into
place, so a reader never sees half of it) each time the metric gets a value: `eval/*` at each evaluation,
`train/*` at each log step. The sweep reports those values to its pruner, and takes `final` as the trial's
result:

    {"metric": "eval/loss", "values": [[100, 0.52], [200, 0.31]], "final": 0.29, "pruned": false,
     "recorded": ["eval/accuracy", "eval/loss"]}

`final` is null until the run ends (and when the metric never got a value: `recorded` then says which
metrics it did get). A `command:` job reports its objective by writing the same file itself
(docs/sweeps.md). With an object store (output.url: a cluster trial's, which the sweep reads), each write is
also uploaded beside the run's checkpoints (one PUT of a small file: an object is replaced whole, so a reader
never sees half of it either), and a pod that starts again on an empty output dir reads its earlier values
from there. Nothing happens when ORCH_OBJECTIVE is unset.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator import outputs


class ObjectiveReport:
    """Rank 0's objective.json for `orch sweep`; a report that writes nothing when `metric` is None or on
    every other rank."""

    def __init__(self, metric: str | None, output_dir: Path, *, enabled: bool, kept: Any = None) -> None:
        """`kept`: the object store's location of the run (storage.location(output_url)), or None."""
        self.metric = metric if enabled else None
        self.path = output_dir / outputs.OBJECTIVE
        self.remote = kept / outputs.OBJECTIVE if kept is not None else None
        self.values: list[list[float]] = []
        self.recorded: set[str] = set()
        if self.metric is not None:  # a resumed trial keeps its earlier values
            self._load()

    def evaluated(self, step: int, results: Mapping[str, Any]) -> None:
        """After an evaluation: its results, as the trackers name them (eval/NAME)."""
        self._seen(step, "eval", results)

    def logged(self, step: int, metrics: Mapping[str, Any]) -> None:
        """At a log step: orch's numbers and the task's (train/NAME)."""
        self._seen(step, "train", metrics)

    def finish(self, step: int, *, pruned: bool) -> None:
        """The run ended at `step`: its value there is the result (pruned: the last one it had)."""
        if self.metric is None:
            return
        last = self.values[-1] if self.values else None
        final = last[1] if last is not None and (pruned or last[0] == step) else None
        self._write(final=final, pruned=pruned)

    def _seen(self, step: int, prefix: str, values: Mapping[str, Any]) -> None:
        if self.metric is None:
            return
        numbers = {
            f"{prefix}/{name}": float(value)
            for name, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        new = set(numbers) - self.recorded
        self.recorded |= set(numbers)
        value = numbers.get(self.metric)
        if value is None:
            if new:  # say once which metrics there are, so the sweep can name them
                self._write(final=None, pruned=False)
            return
        # a resumed run evaluates again the steps after its checkpoint: the new value replaces the old
        self.values = [*(v for v in self.values if v[0] < step), [step, value]]
        self._write(final=None, pruned=False)

    def _write(self, *, final: float | None, pruned: bool) -> None:
        def finite(value: float | None) -> float | str | None:  # JSON has no NaN: say it in words
            return value if value is None or math.isfinite(value) else str(value)

        outputs.write_json(
            self.path,
            {
                "metric": self.metric,
                "values": [[int(step), finite(value)] for step, value in self.values],
                "final": finite(final),
                "pruned": pruned,
                "recorded": sorted(self.recorded),
            },
        )
        if self.remote is not None:
            from orchestrator import storage

            storage.upload(self.path, self.remote)

    def _load(self) -> None:
        import json

        try:
            if self.path.exists():
                text = self.path.read_text()
            elif self.remote is not None:  # a new pod: its output dir is empty, the store has the values
                text = _read_remote(self.remote)
            else:
                return
            data = json.loads(text) if text else {}
            self.values = [[int(s), float(v)] for s, v in data.get("values", [])]
            self.recorded = set(data.get("recorded", []))
        except (OSError, ValueError, TypeError):
            self.values, self.recorded = [], set()


def _read_remote(path: Any) -> str:
    """objective.json from the store; "" when it is not there or cannot be read (the run starts counting
    again: its start checked the store, so this is a blip, and the values to come still reach the sweep)."""
    try:
        return str(path.read_bytes().decode()) if path.exists() else ""
    except Exception:  # noqa: BLE001 (obstore's and fsspec's errors alike)
        return ""
