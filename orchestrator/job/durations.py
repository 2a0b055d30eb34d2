"""The one duration parser: job.yaml's durations (`deadline: 1w`) and the CLI's (`orch wait --timeout 1w`).

Pure and light (imports only `re`), so click option types can use it without loading the spec's pydantic.
"""

from __future__ import annotations

import re
from typing import Any

DURATION = re.compile(r"(\d+[smhdw])+")
DURATION_PART = re.compile(r"(\d+)([smhdw])")
DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_DURATION_SECONDS = 2**31 - 1  # ttlSecondsAfterFinished is an int32; 68 years bounds every duration
EXAMPLES = "90s, 30m, 1h30m, 24h, 1d, 1w"


def parse_duration(value: Any) -> int:
    """`24h`, `1d`, `1w`, `1h30m`, `90s` or a number of seconds -> seconds; ValueError says why not."""
    if isinstance(value, bool):
        raise ValueError(f"must be a duration like {EXAMPLES}")
    if isinstance(value, str) and value.isdigit() and len(value) <= 20:
        value = int(value)
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and len(value) <= 64 and DURATION.fullmatch(value):
        seconds = sum(int(n) * DURATION_SECONDS[unit] for n, unit in DURATION_PART.findall(value))
    else:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:55] + "...'"
        raise ValueError(f"{shown} is not a duration (examples: {EXAMPLES})")
    if seconds <= 0:
        raise ValueError("must be longer than 0 seconds")
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"{seconds} seconds is longer than the bound, {MAX_DURATION_SECONDS} (68 years)")
    return seconds
