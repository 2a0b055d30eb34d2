"""The shape of a Kubernetes pod spec, for checking `pod_overrides` before anything is rendered from them.

`podspec_shape.json` is generated from the official `kubernetes` client's models (V1PodSpec and every model
under it: field names as the API writes them, field types, required fields) by tests/spec/test_pod_shape.py,
which also fails when the installed client's models disagree with it. It is data rather than an import of
`kubernetes` because `orch validate` and `orch render` must not load that package (~0.4 s).

A type in the file is a model name ("V1Container"), a scalar ("str", "int", "bool", "float", "int|str",
"quantity": a string or a number, "any"), ["list", TYPE] or ["map", TYPE].
"""

from __future__ import annotations

import difflib
import functools
import json
from pathlib import Path
from typing import Any

FieldPath = tuple[str | int, ...]
ROOT = "V1PodSpec"
SHAPE_FILE = Path(__file__).with_name("podspec_shape.json")


@functools.cache
def models() -> dict[str, dict[str, Any]]:
    loaded: dict[str, dict[str, Any]] = json.loads(SHAPE_FILE.read_text())
    return loaded


def problem(overrides: Any, kind: str = ROOT) -> tuple[FieldPath, str] | None:
    """(path inside the overrides, what is wrong) for the first value that is not of the shape of `kind` (the
    pod spec, or one of the models under it such as "V1Affinity"); None when the overrides fit. `null` may stand for any field (it deletes the field when merged); a list item is
    never null, and an item of a list whose objects are keyed by `name` (containers, volumes, env, ...) needs
    its `name`: the overrides are merged into orch's pod item by item on it."""
    return _check(overrides, kind, ())


def _check(value: Any, kind: Any, path: FieldPath) -> tuple[FieldPath, str] | None:
    if isinstance(kind, list):
        container, item_kind = kind
        if container == "list":
            if not isinstance(value, list):
                return path, f"must be a list{_of(item_kind)} (got {_show(value)})"
            for index, item in enumerate(value):
                if item is None:
                    return (*path, index), f"a list item cannot be null (expected {_a(item_kind)})"
                if (found := _check(item, item_kind, (*path, index))) is not None:
                    return found
            return None
        if not isinstance(value, dict):
            return path, f"must be a mapping (got {_show(value)})"
        for key, item in value.items():
            if item is not None and (found := _check(item, item_kind, (*path, key))) is not None:
                return found
        return None
    if kind in models():
        return _check_model(value, kind, path)
    if _scalar_fits(value, kind):
        return None
    return path, f"must be {_a(kind)} (got {_show(value)})"


def _check_model(value: Any, kind: str, path: FieldPath) -> tuple[FieldPath, str] | None:
    if not isinstance(value, dict):
        return path, f"must be {_a(kind)} (got {_show(value)})"
    model = models()[kind]
    fields: dict[str, Any] = model["fields"]
    for key, item in value.items():
        if key not in fields:
            hint = difflib.get_close_matches(str(key), fields, n=1)
            known = f"; did you mean {hint[0]!r}?" if hint else f" of {_a(kind)}"
            return (*path, key), f"unknown field{known}"
        if item is not None and (found := _check(item, fields[key], (*path, key))) is not None:
            return found
    if path and isinstance(path[-1], int) and "name" in model["required"] and value.get("name") is None:
        return path, f"needs a name: {_a(kind)} in a list is merged into orch's pod by its name"
    return None


def _scalar_fits(value: Any, kind: str) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return {
        "any": True,
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": number,
        "int|str": isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)),
        "quantity": isinstance(value, str) or number,
    }.get(kind, False)


def _a(kind: Any) -> str:
    if isinstance(kind, list):
        return f"a {kind[0]}{_of(kind[1])}"
    words = {
        "str": "a string",
        "int": "an integer",
        "bool": "true or false",
        "float": "a number",
        "int|str": "an integer or a string",
        "quantity": "a quantity (a number or a string like 500m or 64Gi)",
        "any": "a value",
    }
    return words.get(kind, f"an object ({kind})")


def _of(kind: Any) -> str:
    return f" of {kind}s" if isinstance(kind, str) and kind in models() else ""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:35]}...{text[-2:]}"
