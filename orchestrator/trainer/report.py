"""What rank 0 tells people: log lines on stdout, JSON events for `orch run`'s progress bar, summary.json.

Every other rank gets a Reporter that says nothing, so the loop never asks who it is before logging.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def format_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Reporter:
    def __init__(self, *, enabled: bool, lines: bool, events_file: str | None) -> None:
        self.enabled, self.lines = enabled, lines
        self.events = open(events_file, "a", buffering=1) if enabled and events_file else None  # noqa: SIM115

    def event(self, kind: str, **fields: Any) -> None:
        if self.events:
            self.events.write(json.dumps({"event": kind, **fields}) + "\n")

    def say(self, message: str) -> None:
        if self.enabled and self.lines:
            print(message, flush=True)

    def step(self, *, step: int, max_steps: int, loss: float, lr: float, grad_norm: float,
             samples_per_second: float, eta_seconds: float, skipped: int) -> None:  # fmt: skip
        self.event("step", step=step, max_steps=max_steps, loss=loss, lr=lr, grad_norm=grad_norm,
                   samples_per_second=samples_per_second, eta_seconds=eta_seconds, skipped=skipped)  # fmt: skip
        self.say(
            f"step {step}/{max_steps}  loss {loss:.4f}  lr {lr:.3g}  grad_norm {grad_norm:.3g}  "
            f"{samples_per_second:,.0f} samples/s  eta {format_duration(eta_seconds)}"
            + (f"  skipped {skipped}" if skipped else "")
        )

    def evaluation(self, *, step: int, results: dict[str, float]) -> None:
        self.event("eval", step=step, **results)
        self.say(f"eval at step {step}: " + "  ".join(f"{k} {v:.4f}" for k, v in results.items()))

    def close(self) -> None:
        if self.events:
            self.events.close()
            self.events = None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Written to a temporary name and renamed, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)
