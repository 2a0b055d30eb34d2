"""job.yaml + `--set` overrides -> a validated JobSpec, or one SpecError naming file, line, column and field.

The YAML is composed into nodes first so that every value keeps its position; pydantic's error locations are
then mapped back to the nearest node. Reads the job file; writes nothing.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator import spec as spec_models
from orchestrator.errors import SpecError

FieldPath = tuple[str | int, ...]
Position = tuple[int, int]  # 1-based line and column


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is not a string", key_node.start_mark
            )
        if key in seen:
            first = seen[key].start_mark.line + 1
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first defined on line {first})", key_node.start_mark
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _positions(node: yaml.Node, path: FieldPath = ()) -> dict[FieldPath, Position]:
    """Position of every value (and of every mapping key, under the key's own path) in a composed document."""
    found = {path: (node.start_mark.line + 1, node.start_mark.column + 1)}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = (*path, key_node.value)
            found.update(_positions(value_node, child))
            # Point at the key, which reads better than the value for "unknown field" and "wrong type".
            found[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            found.update(_positions(item, (*path, index)))
    return found


def parse_yaml(text: str, file: str) -> tuple[Any, dict[FieldPath, Position]]:
    """The document's data and the position of each field; YAML mistakes become SpecErrors."""
    try:
        node = yaml.compose(text, Loader=_Loader)
        data = _Loader(text).get_single_data() if node is not None else None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        problem = " ".join(str(p) for p in (error.context, error.problem) if p)
        raise SpecError(
            f"invalid YAML: {problem}",
            file=file,
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
        ) from None
    except yaml.YAMLError as error:  # e.g. several documents in one file
        raise SpecError(f"invalid YAML: {error}", file=file) from None
    if node is None:
        raise SpecError(
            "the file is empty; `orch init job.yaml` writes a starter job", file=file, line=1, column=1
        )
    if not isinstance(data, dict):
        raise SpecError(
            f"a job file is a mapping of fields (name:, image:, train: ...), not a {type(data).__name__}",
            file=file,
            line=node.start_mark.line + 1,
            column=node.start_mark.column + 1,
        )
    return data, _positions(node)


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[FieldPath, str]:
    """Apply `key.path=value` overrides in place (values parsed as YAML); returns which path came from which flag."""
    origins: dict[FieldPath, str] = {}
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"--set {override!r}: expected KEY=VALUE, e.g. --set nodes=4")
        path = tuple(key.strip().split("."))
        try:
            value = yaml.load(raw, Loader=_Loader) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        target = data
        for depth, part in enumerate(path[:-1]):
            child = target.get(part)
            if child is None:
                child = target[part] = {}
            if not isinstance(child, dict):
                raise SpecError(f"--set {override}: {'.'.join(path[: depth + 1])} is not a mapping")
            target = child
        target[path[-1]] = value
        origins[path] = f"--set {override}"
    return origins


def _nearest(path: FieldPath, table: dict[FieldPath, Any]) -> Any:
    for length in range(len(path), -1, -1):
        if path[:length] in table:
            return table[path[:length]]
    return None


def _model_at(path: FieldPath) -> type[BaseModel] | None:
    """The spec model that owns the last key of `path` (for "did you mean" hints)."""
    model: Any = spec_models.JobSpec
    for part in path[:-1]:
        if isinstance(part, int):
            continue
        field = (
            model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        )
        if field is None:
            return None
        model = _unwrap_model(field.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        if (found := _unwrap_model(arg)) is not None:
            return found
    return None


def _message(error: Mapping[str, Any], path: FieldPath) -> str:
    kind, message = error["type"], error["msg"]
    if kind == "extra_forbidden":
        model = _model_at(path)
        known = list(model.model_fields) if model else []
        hint = difflib.get_close_matches(str(path[-1]), known, n=1)
        return "unknown field" + (f"; did you mean {hint[0]!r}?" if hint else f" (known: {', '.join(known)})")
    if kind == "missing":
        return "required field is missing"
    if kind in ("value_error", "assertion_error"):
        message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if kind == "literal_error" or kind.endswith("_type") or kind.endswith("_parsing"):
        message += f" (got {error['input']!r})"
    return message


def _dotted(path: FieldPath) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path))


def validate(
    data: dict[str, Any],
    *,
    file: str,
    positions: dict[FieldPath, Position],
    origins: dict[FieldPath, str] | None = None,
    require_image: bool = False,
) -> spec_models.JobSpec:
    """Validate parsed data; the first problem becomes a SpecError located in the file (or at its --set flag)."""
    origins = origins or {}

    def fail(path: FieldPath, message: str) -> SpecError:
        # A problem in (or under, or above) an overridden field is the flag's fault, not the file's.
        origin = next(
            (flag for o, flag in origins.items() if path[: len(o)] == o or o[: len(path)] == path), None
        )
        if origin:
            return SpecError(message, file=origin, field=_dotted(path))
        line, column = _nearest(path, positions) or (None, None)
        return SpecError(message, file=file, line=line, column=column, field=_dotted(path))

    try:
        job = spec_models.JobSpec.model_validate(data)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        # pydantic appends the union member or validator name to the location; keep the data path only.
        path = tuple(p for p in first["loc"] if isinstance(p, int) or not _is_internal(str(p)))
        raise fail(path, _message(first, path)) from None
    except spec_models.FieldError as error:
        raise fail(tuple(error.path.split(".")), error.message) from None
    if require_image and not job.image:
        raise fail(("image",), "required to render or submit (the training image the pods run)")
    return job


def _is_internal(part: str) -> bool:
    # Union branches and constrained types: "int", "str", "function-after[...]", "list[str]", "bool", ...
    return any(c in part for c in "[]()") or part in ("int", "str", "float", "bool", "none", "dict")


def load_job(
    path: str | Path, overrides: Sequence[str] = (), *, require_image: bool = False
) -> spec_models.JobSpec:
    """Read, override and validate a job file. Raises SpecError (exit code 2) with file:line:col: field: why."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("no such file; `orch init` writes a starter job.yaml", file=file) from None
    except (OSError, UnicodeDecodeError) as error:
        raise SpecError(f"cannot read: {error}", file=file) from None
    data, positions = parse_yaml(text, file)
    origins = apply_overrides(data, overrides)
    return validate(data, file=file, positions=positions, origins=origins, require_image=require_image)
