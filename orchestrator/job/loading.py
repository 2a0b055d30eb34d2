"""job.yaml + `--set` overrides -> a validated JobSpec, or one SpecError naming file, line, column and field.

The YAML is composed into nodes first so that every value keeps its position; pydantic's error locations are
then mapped back to the nearest node. Reads the job file; writes nothing.

What the loader reads and builds is bounded before anything is built from it (a job file is small; these
bounds only stop files that would take the machine down): at most MAX_FILE_BYTES are read, nodes nest at most
MAX_DEPTH deep, the document counts at most MAX_VALUES values once its aliases are expanded (a 300-byte alias
"bomb" expands to billions), aliases may not refer to themselves, integers fit in an int64 and floats are
finite. Each error names its bound. What it builds is JSON-compatible only: a plain date stays a string,
and tags without a JSON form (`!!binary`, `!!set`, `!!timestamp`, ...) are refused at their position.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator import apis, runtime_env
from orchestrator.errors import SpecError
from orchestrator.job import fields
from orchestrator.job import spec as spec_models
from orchestrator.job.yaml_positions import FieldPath, Position, positions
from orchestrator.redaction import redact

MAX_FILE_BYTES = 256 * 1024
MAX_DEPTH = 64
MAX_VALUES = 100_000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Fields whose values are secrets: an error about them never shows the value.
SECRET_FIELDS = ("secret_env",)


class _BoundError(yaml.MarkedYAMLError):
    """A job file past one of the loader's bounds (not a YAML syntax error)."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one) and nesting past MAX_DEPTH."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        # PyYAML composes recursively: bound the depth before Python's recursion limit does.
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]  # untyped in types-PyYAML
                raise _BoundError(
                    problem=f"nested deeper than {MAX_DEPTH} levels (the bound)", problem_mark=mark
                )
            node: yaml.Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1


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
# A plain `2024-01-01` is the string it reads as (YAML 1.2's core schema has no timestamps; YAML 1.1's would
# make it a date, which neither JSON nor a Kubernetes object can hold).
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
# What a job file may hold is what JSON (and so a Kubernetes object) can: explicit `!!binary`, `!!set`,
# `!!omap`, `!!pairs` or `!!timestamp` values are refused at their position instead of converted.
JSON_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "map", "seq", "merge")
)


def _check_bounds(loader: _Loader, root: yaml.Node) -> None:
    """Measure the document as if its aliases were expanded, without expanding them: at most MAX_VALUES values
    and MAX_DEPTH levels; no alias inside the node it names; integers in int64, finite floats.
    Raises _BoundError at the offending node."""
    measured: dict[int, tuple[int, int]] = {}  # id(node) -> (values under it, levels under it), expanded
    visiting: set[int] = set()

    def measure(node: yaml.Node, depth: int) -> tuple[int, int]:
        key = id(node)
        if depth >= MAX_DEPTH:
            raise _BoundError(
                problem=f"nested deeper than {MAX_DEPTH} levels (aliases expanded; the bound)",
                problem_mark=node.start_mark,
            )
        if key in visiting:
            raise _BoundError(
                problem="an alias refers to a node that contains it", problem_mark=node.start_mark
            )
        if key not in measured:
            visiting.add(key)
            count, height = 1, 1
            children: list[yaml.Node] = []
            if node.tag not in JSON_TAGS:
                raise _BoundError(
                    problem=f"{node.tag.replace('tag:yaml.org,2002:', '!!')} values have no JSON form "
                    "(a job is JSON: strings, numbers, booleans, null, lists and mappings); drop the tag",
                    problem_mark=node.start_mark,
                )
            if isinstance(node, yaml.MappingNode):
                children = [n for pair in node.value for n in pair]
            elif isinstance(node, yaml.SequenceNode):
                children = list(node.value)
            elif isinstance(node, yaml.ScalarNode):
                _check_number(loader, node)
            for child in children:
                child_count, child_height = measure(child, depth + 1)
                count, height = count + child_count, max(height, child_height + 1)
                if count > MAX_VALUES:
                    break
            visiting.discard(key)
            measured[key] = count, height
        count, height = measured[key]
        if depth + height > MAX_DEPTH:
            raise _BoundError(
                problem=f"nested deeper than {MAX_DEPTH} levels (aliases expanded; the bound)",
                problem_mark=node.start_mark,
            )
        if count > MAX_VALUES:
            raise _BoundError(
                problem=f"expands to more than {MAX_VALUES} values (aliases expanded; the bound)",
                problem_mark=node.start_mark,
            )
        return count, height

    measure(root, 0)


def _check_number(loader: _Loader, node: yaml.ScalarNode) -> None:
    if node.tag == "tag:yaml.org,2002:int":
        # Python refuses to convert more than 4300 digits; an int64 has at most 19 (plus sign, '_' and base).
        value = loader.construct_yaml_int(node) if len(node.value) <= 80 else None
        if value is None or not INT64_MIN <= value <= INT64_MAX:
            raise _BoundError(
                problem=f"integer {_short(node.value)} is outside the int64 range (the bound)",
                problem_mark=node.start_mark,
            )
    elif node.tag == "tag:yaml.org,2002:float" and not math.isfinite(loader.construct_yaml_float(node)):
        raise _BoundError(
            problem=f"{_short(node.value)} is not a finite number (Kubernetes and JSON have no inf or nan)",
            problem_mark=node.start_mark,
        )


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _compose(text: str) -> tuple[Any, yaml.Node | None]:
    """Data and root node of one YAML document, within the bounds; raises yaml errors."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        _check_bounds(loader, node)
        return loader.construct_document(node), node
    finally:
        loader.dispose()


def parse_yaml(text: str, file: str) -> tuple[Any, dict[FieldPath, Position]]:
    """The document's data and the position of each field; YAML mistakes become SpecErrors."""
    try:
        data, node = _compose(text)
    except _BoundError as error:
        mark = error.problem_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
        raise SpecError(f"{error.problem}", file=file, line=line, column=column) from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        problem = " ".join(str(p) for p in (error.context, error.problem) if p)
        raise SpecError(
            f"invalid YAML: {problem}",
            file=file,
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
        ) from None
    except yaml.YAMLError as error:  # e.g. several documents in one file, or a control character
        raise SpecError(f"invalid YAML: {' '.join(str(error).split())}", file=file) from None
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
    return data, positions(node, at_keys=True)


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[FieldPath, str]:
    """Apply `key.path=value` overrides in place (values parsed as YAML, within the loader's bounds); returns
    which path came from which flag. A number in the path indexes a list (`--set volumes.0.read_only=true`)."""
    origins: dict[FieldPath, str] = {}
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"--set {_redacted(override)!r}: expected KEY=VALUE, e.g. --set nodes=4")
        flag = f"--set {_redacted(override)}"
        try:
            value = _compose(raw)[0] if raw.strip() else ""
        except _BoundError as error:
            raise SpecError(f"{error.problem}", file=flag) from None
        except yaml.YAMLError:
            value = raw
        # `volumes[0].mount` (the form errors print) is `volumes.0.mount`.
        parts = _LIST_INDEX.sub(r".\1", key.strip()).split(".")
        path: FieldPath = ()
        target: Any = data
        for depth, part in enumerate(parts):
            where = _dotted(path) or "the job"
            if isinstance(target, list):
                if not part.isdigit() or int(part) >= len(target):
                    items = f"{len(target)} item{'s' * (len(target) != 1)}"
                    what = f"index {part} does not exist" if part.isdigit() else f"{part!r} is not an index"
                    raise SpecError(f"{where} is a list of {items}; {what}", file=flag)
                step: str | int = int(part)
            elif isinstance(target, dict):
                step = part
                if depth < len(parts) - 1 and target.get(part) is None:
                    if parts[depth + 1].isdigit():  # no list to index: it cannot be made up here
                        where = _dotted((*path, step))
                        raise SpecError(
                            f"{where} is a list of 0 items; index {parts[depth + 1]} does not exist",
                            file=flag,
                        )
                    target[part] = {}
            else:
                raise SpecError(f"{where} is not a mapping", file=flag)
            path = (*path, step)
            if depth == len(parts) - 1:
                target[step] = value
            else:
                target = target[step]
        origins[path] = flag
    return origins


_LIST_INDEX = re.compile(r"\[(\d+)\]")


def _redacted(override: str) -> str:
    """`--set secret_env.TOKEN=...` as it may be shown: the value of a secret field is not, nor the
    credentials of a URL."""
    key, sep, _ = override.partition("=")
    return f"{key}=<hidden>" if sep and _is_secret(tuple(key.strip().split("."))) else redact(override)


def _is_secret(path: FieldPath) -> bool:
    return bool(path) and path[0] in SECRET_FIELDS


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
        hint = difflib.get_close_matches(str(path[-1]), known, n=1) if path else []
        return "unknown field" + (f"; did you mean {hint[0]!r}?" if hint else f" (known: {', '.join(known)})")
    if kind == "missing":
        return "required field is missing"
    if kind == "int_parsing_size":  # a float like 1e20 where an integer belongs
        return f"{fields.show(error['input'])} is outside the int64 range (the bound)"
    if kind in ("value_error", "assertion_error"):
        message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if (kind == "literal_error" or kind.endswith("_type") or kind.endswith("_parsing")) and not _is_secret(
        path
    ):
        message += f" (got {fields.show(error['input'])})"
    if _is_secret(path) and isinstance(error.get("input"), str) and error["input"]:
        message = message.replace(error["input"], "<hidden>")  # a secret given in the wrong place
    return str(message)


def _dotted(path: FieldPath) -> str:
    """`train.optimizer.lr`, `volumes[0].mount`; a key that is not a plain word is quoted (`labels['a b']`)."""
    return "".join(
        f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) if _PLAIN_KEY.fullmatch(p) else f"[{p!r}]"
        for i, p in enumerate(path)
    )


_PLAIN_KEY = re.compile(r"[-\w./]+")


def validate(
    data: dict[str, Any],
    *,
    file: str,
    positions: dict[FieldPath, Position],
    origins: dict[FieldPath, str] | None = None,
    require_image: bool = False,
    local_run: bool = False,
) -> spec_models.JobSpec:
    """Validate parsed data. Every problem found is a SpecError located in the file (or at its --set flag);
    all of them are raised together, in file order (SpecError.several): pydantic's errors and the spec's
    rules over several fields in one pass, one per field; then, for a valid spec, the API's, the image's
    and tracking's. Rules that need valid fields run only once the fields are valid."""
    origins = origins or {}

    def located(path: FieldPath, message: str) -> SpecError:
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
        raise SpecError.several(_in_file_order(_problems(data, error), located)) from None
    found: list[tuple[FieldPath, str]] = []
    if job.api != apis.AUTO and (problem := apis.by_key(job.api).spec_problem(job, job.name)):
        found.append((tuple(problem[0].split(".")), problem[1]))
    if require_image and not job.image:
        found.append((("image",), "required to render or submit (the training image the pods run)"))
    # Where it will run decides what tracking needs: packages here (`orch run`), or a URI the pods can read.
    where = "local" if local_run else "cluster" if require_image else "anywhere"
    if tracking := _tracking_problem(job, where=where):
        found.append((tuple(tracking[0].split(".")), tracking[1]))
    if found:
        raise SpecError.several(_in_file_order(found, located))
    return job


def _problems(data: dict[str, Any], error: ValidationError) -> list[tuple[FieldPath, str]]:
    """(path, message) of each problem pydantic found, one per field (a value that fits no member of a
    union is one problem, said as its first member's), and each of the rules a FieldError carries."""
    found: list[tuple[FieldPath, str]] = []
    seen: set[FieldPath] = set()
    for entry in error.errors(include_url=False):
        path = data_path(data, entry)
        if entry["type"] == "default_factory_not_called":  # a default computed from a field found wrong
            continue
        if entry["type"] == fields.FieldError.TYPE:
            found += [((*path, *parts), message) for parts, message in fields.problems_of(dict(entry))]
        elif path not in seen:
            seen.add(path)
            found.append((path, _message(entry, path)))
    return found


def _in_file_order(
    found: list[tuple[FieldPath, str]], located: Callable[[FieldPath, str], SpecError]
) -> list[SpecError]:
    """The problems as SpecErrors, by line and column; those without a line in the file (a --set flag's, a
    mapping's) after them, in the order found."""
    errors = [located(path, message) for path, message in found]
    return sorted(errors, key=lambda e: (0, e.line, e.column or 0) if e.line is not None else (1, 0, 0))


def _tracking_problem(job: spec_models.JobSpec, *, where: str) -> tuple[str, str] | None:
    """(field, why) when the job's tracking cannot work where it is about to run. local (`orch run`): the
    packages must be importable here and the URI known from the spec or this shell; cluster (pods): the
    URI must come from the spec or from the job's env / secret_env, and a file store must outlive the pod;
    anywhere (`orch validate`): the URI known to one of them."""
    if where == "local":
        settings = runtime_env.TrackingSettings.for_job(job, name=job.name, api_kind="")
        if missing := runtime_env.missing_requirements(settings):
            field = "mlflow" if "mlflow" in missing else "tensorboard"
            return (
                f"tracking.{field}",
                f"needs {' and '.join(missing)}, not installed here: {runtime_env.PIP_LINE}",
            )
        return job.tracking_problem({**os.environ, **job.env}, in_pod=False)
    in_pods = dict.fromkeys({*job.env, *job.secret_env}, "set")
    if where == "cluster":
        return job.tracking_problem(in_pods, in_pod=True)
    return job.tracking_problem({**os.environ, **in_pods}, in_pod=False)


def data_path(data: Any, error: Mapping[str, Any]) -> FieldPath:
    """The part of a pydantic error location that is a path in the data (the job file's, the sweep file's).
    pydantic adds union members and validator names ("int", "function-after[...]") to it; a part is kept when
    the data holds it there (a key of that mapping, an index of that list), so a key that looks like one of
    those ("volumes[0]") is kept. The field a `missing` error names is not in the data: it is kept as the
    last part."""
    loc = list(error["loc"])
    missing = loc.pop() if error["type"] == "missing" and loc else None
    path: list[str | int] = []
    target = data
    for part in loc:
        in_mapping = isinstance(target, dict) and part in target
        in_list = isinstance(target, list) and isinstance(part, int) and 0 <= part < len(target)
        if in_mapping or in_list:
            target = target[part]
            path.append(part)
    return (*path, missing) if missing is not None else tuple(path)


def load_job(
    path: str | Path, overrides: Sequence[str] = (), *, require_image: bool = False, local_run: bool = False
) -> spec_models.JobSpec:
    """Read, override and validate a job file. Raises SpecError (exit code 2) with file:line:col: field: why."""
    file = str(path)
    text = read_job_text(path)
    data, positions = parse_yaml(text, file)
    origins = apply_overrides(data, overrides)
    return validate(
        data,
        file=file,
        positions=positions,
        origins=origins,
        require_image=require_image,
        local_run=local_run,
    )


def read_job_text(path: str | Path) -> str:
    """The text of a job file, reading at most MAX_FILE_BYTES (+1 to notice more): `/dev/zero` or a huge file
    ends in one error instead of filling memory."""
    file = str(path)
    try:
        with open(path, "rb") as stream:
            raw = stream.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SpecError("no such file; `orch init` writes a starter job.yaml", file=file) from None
    except OSError as error:
        raise SpecError(f"cannot read: {error.strerror or error}", file=file) from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(f"larger than {MAX_FILE_BYTES // 1024} KiB, the bound on a job file", file=file)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(f"not UTF-8 text (byte {error.start}: {error.reason})", file=file) from None
