"""The field types and rules every job-spec model uses, and the `Model` base. Pure, no I/O.

Give a new field its type from here (`Dns1123Name`, `Quantity`, `Duration`, `PositiveInt`, ...), so that every
field of a kind obeys the same rule and says the same thing when it is wrong; a new kind of value gets its
pattern and type here too. Patterns are Kubernetes' own (apimachinery's validation.go). A rule that needs
several fields is the model's (`JobSpec._check_consistency` raises `FieldError` with the path to change;
pydantic collects it with the other errors).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from orchestrator import naming
from orchestrator.job.durations import parse_duration

# --- Kubernetes name and value rules (apimachinery's validation.go; the name rules are naming.py's) ---------
# Every pattern is applied with re.fullmatch (Python's `$` would also match before a final newline, so
# `name: "digits\n"` would pass); they carry no anchors of their own.

QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")  # a key of a Secret's data (IsConfigMapKey)
IMAGE_REF = re.compile(r"[!-.0-~][!-~]*")  # printable ASCII without spaces, not starting with /
# A Kubernetes quantity: a number with an optional binary (Ki..Ei), decimal (m, k..E) or exponent suffix.
QUANTITY = re.compile(r"(\d+(\.\d*)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][-+]?\d+)?")
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")

# Kubernetes' integer fields are int32 (replicas, backoffLimit, ports, ...) or int64 (seconds).
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


# --- errors and the helpers every rule uses ---------------------------------------------------------------


class FieldError(PydanticCustomError):
    """A rule over several fields failed. `path` is the field the user must change, relative to the model
    whose validator raises it: dotted (`train.eval_every`) or a tuple whose ints index lists
    (`("pod_overrides", "containers", 0)`); a rule of the root model (JobSpec) names it from the top.

    A pydantic error of its own type (TYPE), not a ValueError: pydantic collects it beside the document's
    other errors (the loader reports them all, each at its line) and keeps the path in its context. One
    validator that finds several problems raises them together (`FieldError.joined`).
    """

    TYPE = "orch_field_rule"
    _PROBLEMS = "orch_problems"  # the context key: not a word a message holds in braces

    def __new__(cls, path: str | tuple[str | int, ...], message: str) -> FieldError:
        parts = tuple(path.split(".")) if isinstance(path, str) else tuple(path)
        error: FieldError = super().__new__(cls, cls.TYPE, message, {cls._PROBLEMS: ((parts, message),)})
        return error

    def __init__(self, path: str | tuple[str | int, ...], message: str) -> None:
        """The error is what __new__ made (PydanticCustomError's own arguments); `problems_of` reads it."""

    @classmethod
    def joined(cls, errors: list[FieldError]) -> FieldError:
        """One error carrying every one's (path, message), the first's message its own."""
        problems = tuple(problem for error in errors for problem in problems_of(error))
        joined: FieldError = PydanticCustomError.__new__(
            cls, cls.TYPE, problems[0][1], {cls._PROBLEMS: problems}
        )
        return joined


def problems_of(error: FieldError | dict[str, Any]) -> tuple[tuple[tuple[str | int, ...], str], ...]:
    """(path, message) of each rule a FieldError carries: the error itself, or its entry in pydantic's
    `ValidationError.errors()` (whose type is FieldError.TYPE)."""
    context = error.context if isinstance(error, FieldError) else error.get("ctx")
    return tuple((tuple(p), str(m)) for p, m in (context or {}).get(FieldError._PROBLEMS, ()))


def show(value: Any, limit: int = 60) -> str:
    """repr() of a user's value for an error message, cut to `limit` characters (a message is one short line)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


def matching(pattern: re.Pattern[str], what: str, max_length: int | None = None) -> Callable[[str], str]:
    """A validator (for `AfterValidator`): the whole string matches `pattern` and has at most `max_length`
    characters; the error calls it a valid `what`."""

    def validate(value: str) -> str:
        if max_length is not None and len(value) > max_length:
            raise ValueError(f"{show(value)} is longer than {max_length} characters")
        if not pattern.fullmatch(value):
            raise ValueError(f"{show(value)} is not a valid {what}")
        return value

    return validate


# --- the rules behind the types below ------------------------------------------------------------------------


def _quantity(value: Any) -> str:
    """Accept `cpu: 8` or `memory: 64Gi`; always hand Kubernetes a string."""
    if isinstance(value, bool):
        raise ValueError("must be a quantity like 8, 500m or 64Gi, not a boolean")
    if isinstance(value, (int, float)):
        value = format(value, "g")
    if not isinstance(value, str) or not QUANTITY.fullmatch(value):
        raise ValueError(f"{show(value)} is not a Kubernetes quantity (examples: 8, 500m, 64Gi, 1.5G)")
    return value


def _path(value: str) -> str:
    """A path without control characters, normalised (`/dev/shm/` -> `/dev/shm`, `a//b/./c` -> `a/b/c`)."""
    if not value or CONTROL_CHARACTER.search(value):
        raise ValueError(f"{show(value)} is not a path (empty, or has control characters)")
    normal = posixpath.normpath(value)
    return "/" + normal.lstrip("/") if normal.startswith("/") else normal


def _path_or_url(value: str) -> str:
    """An object-store URL kept as written (storage.url_problem checks it: normalising it as a path would
    make `s3://b/x` the local folder `s3:/b/x`), else a local path normalised as PathStr."""
    from orchestrator import storage

    if not storage.is_url(value):
        return _path(value)
    if problem := storage.url_problem(value):
        raise ValueError(problem)
    return value.rstrip("/")


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"{show(path)} must be an absolute path")
    return path


def _relative(path: str) -> str:
    if path.startswith("/") or path == ".." or path.startswith("../"):
        raise ValueError(f"{show(path)} must be a relative path inside the claim (no leading /, no ..)")
    return path


def _string_value(value: Any) -> Any:
    """Env values and selectors are strings; let `OMP_NUM_THREADS: 4` through, refuse `true` (ambiguous)."""
    if isinstance(value, bool):
        raise ValueError(
            f'{str(value).lower()} is a YAML boolean; quote it ("{str(value).lower()}") to pass a string'
        )
    if isinstance(value, (int, float)):
        return str(value)
    return value


# --- constrained types: use these for new fields, so every field of a kind obeys the same rule ---------------

Quantity = Annotated[str, BeforeValidator(_quantity)]
Duration = Annotated[int, BeforeValidator(parse_duration)]
StringValue = Annotated[str, BeforeValidator(_string_value)]
Dns1123Label = Annotated[
    str, AfterValidator(matching(naming.DNS1123_LABEL, "DNS-1123 label (lowercase letters, digits, '-')", 63))
]
Dns1123Name = Annotated[
    str,
    AfterValidator(
        matching(naming.DNS1123_SUBDOMAIN, "DNS-1123 name (lowercase letters, digits, '-', '.')", 253)
    ),
]
PathStr = Annotated[str, AfterValidator(_path)]
"""Compared and rendered in normal form, so reserved and duplicate paths are found however they are written."""
PathOrUrl = Annotated[str, AfterValidator(_path_or_url)]
"""A local path (as PathStr) or an object store's URL (s3://, gs://, az://; credentials refused)."""
AbsolutePath = Annotated[str, AfterValidator(_path), AfterValidator(_absolute)]
RelativePath = Annotated[str, AfterValidator(_path), AfterValidator(_relative)]
PositiveInt = Annotated[int, Field(gt=0, le=INT32_MAX)]
NonNegativeInt = Annotated[int, Field(ge=0, le=INT32_MAX)]
Seconds64 = Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]
Port = Annotated[int, Field(ge=1, le=65535)]
SecretKey = Annotated[
    str, AfterValidator(matching(SECRET_KEY, "secret key (letters, digits, '-', '_', '.')", 253))
]


def _check_label_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not naming.DNS1123_SUBDOMAIN.fullmatch(prefix)):
        raise ValueError(f"key {show(key)}: prefix {show(prefix)} must be a DNS-1123 subdomain")
    if len(name) > 63 or not QUALIFIED_NAME.fullmatch(name):
        raise ValueError(
            f"key {show(key)} is not a valid Kubernetes label/annotation key "
            "(<= 63 characters: letters, digits, '-', '_', '.', starting and ending alphanumeric)"
        )
    return key


def _check_label_value(value: str) -> str:
    if len(value) > 63 or not LABEL_VALUE.fullmatch(value):
        raise ValueError(
            f"{show(value)} is not a valid label value "
            "(<= 63 characters: letters, digits, '-', '_', '.', starting and ending alphanumeric)"
        )
    return value


# Keys and values are validated one by one, so an error points at the entry's own line.
LabelKey = Annotated[str, AfterValidator(_check_label_key)]
LabelValue = Annotated[str, BeforeValidator(_string_value), AfterValidator(_check_label_value)]
NodeHostname = Annotated[str, Field(min_length=1), AfterValidator(_check_label_value)]
"""A node's `kubernetes.io/hostname` label (the kubelet sets it from the host name: most clusters name their
nodes so), as node affinity compares it."""
EnvName = Annotated[str, AfterValidator(matching(ENV_NAME, "environment variable name"))]
ImageRef = Annotated[
    str, AfterValidator(matching(IMAGE_REF, "image reference (e.g. ghcr.io/acme/trainer:1.0)"))
]


# --- the base of every model, and the rule for every value ----------------------------------------------------


class Model(BaseModel):
    """Base of every spec model: immutable, unknown keys are errors, defaults are validated too."""

    # allow_inf_nan=False: a float field is finite (`lr: .inf` would be written into train.json as Infinity).
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


# Free strings may hold these control characters (a multi-line env value or script argument); no others.
ALLOWED_CONTROL_CHARACTERS = "\t\n"


def value_problem(value: Any, path: tuple[str | int, ...] = ()) -> tuple[tuple[str | int, ...], str] | None:
    """(path, why) for the first value in `value` (at any depth, keys included) that a job cannot hold: one
    rule for every value, whether it came from YAML or a Python dict. A value is JSON (strings, numbers,
    booleans, null, lists, mappings with string keys: a date or bytes would crash render or `-o json`), and a
    string holds no control character other than tab and newline (NUL, ESC or CR never reach a pod's
    environment, a command line or a terminal). The character is named, the value never shown (it may be a
    secret)."""
    if isinstance(value, str):
        bad = next((c for c in value if _is_control(c)), None)
        if bad is None:
            return None
        return path, (
            f"holds the control character U+{ord(bad):04X} at position {value.index(bad)}; "
            "a string may hold tab and newline, no other control character"
        )
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return path, f"key {show(key)} is not a string"
            if (found := value_problem(key, (*path, key))) is not None:
                return found
            if (found := value_problem(item, (*path, key))) is not None:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            if (found := value_problem(item, (*path, index))) is not None:
                return found
        return None
    if value is None or isinstance(value, (bool, int, float, BaseModel)):
        return None
    return (
        path,
        f"a {type(value).__name__} has no JSON form (strings, numbers, booleans, null, lists, mappings)",
    )


def _is_control(character: str) -> bool:
    code = ord(character)
    return (code < 0x20 or 0x7F <= code <= 0x9F) and character not in ALLOWED_CONTROL_CHARACTERS
