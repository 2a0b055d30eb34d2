"""User strings never change the structure of the rendered objects (property test).

For every field where job.yaml accepts free text (restricted strings such as names, keys and label values
are checked by the spec instead: see test_hostile_input.py), hypothesis generates text full of YAML and Jinja2 syntax
(quotes, newlines, `{{ }}`, `: `, `#`, `---`, anchors, tags, unicode line separators, control characters).
The same job is rendered twice: once with those strings and once with a plain token in each slot. Rendering
is injection-free exactly when the first result equals the second with each token swapped for its string:
same keys, same nesting, same values, nothing extra. The CLI's YAML and JSON serialisations must round-trip too.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.job.spec import JobSpec
from orchestrator.rendering import render, templates

SPECIALS = [
    '"',
    "'",
    "\\",
    "\n",
    "\r\n",
    "\t",
    "{{ name }}",
    "{% if x %}",
    "{#",
    "}}",
    ": ",
    " #",
    "# c",
    "---",
    "...",
    "- ",
    "? ",
    "|",
    ">-",
    "&anchor",
    "*anchor",
    "!!python/object/apply:os.system",
    "%YAML 1.2",
    "@",
    "`",
    "null",
    "~",
    "true",
    "no",
    "1e3",
    "0o17",
    ",",
    "[",
    "]",
    "{",
    "}",
    "ü",
    "日本語",
    "😀",
    "\u2028",
    "\u2029",
    "\x85",
    "\x7f",
    "\x00",
    "\x1b[31m",
    "\ufeff",
    "\u00a0",
    " ",
    "\\u0041",
    "\\n",
]


def without_control_characters(text: str) -> str:
    """The spec refuses control characters other than tab and newline in every string (issue #25; see
    test_hostile_input.py): what is left is the free text whose escaping is tested here."""
    return "".join(c for c in text if c in "\t\n" or not (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F))


nasty = (
    st.lists(st.one_of(st.sampled_from(SPECIALS), st.text(max_size=6)), min_size=1, max_size=6)
    .map("".join)
    .map(without_control_characters)
    .filter(bool)
)
maybe_empty = st.one_of(st.just(""), nasty)


def no_space(text: str) -> str:
    """An image reference: printable ASCII without spaces, not starting with '/' (the spec refuses the rest)."""
    return "".join(c for c in text if "!" <= c <= "~").lstrip("/") or "x"


def path_segment(text: str) -> str:
    """A checkpoint dir `/c/<segment>`: no control characters, no '/', not '.' or '..' (the spec normalises
    paths and refuses control characters; what is left is free text)."""
    segment = "".join(c for c in text if c.isprintable() and c != "/")
    return "/c/" + (segment if segment.strip(".") else "x")


def nested(leaf: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """JSON-like values whose strings (and mapping keys) are nasty."""
    return st.recursive(
        st.one_of(leaf, st.integers(), st.booleans(), st.none()),
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(nasty, inner, max_size=3)),
        max_leaves=6,
    )


@st.composite
def free_text_fields(draw: st.DrawFn) -> dict[str, Any]:
    """The free-text slots of a job, each holding a nasty string (or a structure of them)."""
    return {
        "image": no_space(draw(nasty)),
        "env": draw(st.lists(maybe_empty, min_size=1, max_size=3)),
        "annotations": draw(st.lists(maybe_empty, min_size=1, max_size=3)),
        "task_args": draw(st.dictionaries(nasty, nested(nasty), max_size=3)),
        "checkpoint_dir": path_segment(draw(nasty)),
        "cuda_alloc_conf": draw(nasty),
        "command": draw(st.lists(maybe_empty, min_size=1, max_size=4)),
        # affinity and pod_overrides are checked against the pod spec's shape: free text in their free slots.
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 1,
                        "preference": {
                            "matchExpressions": [
                                {
                                    "key": draw(nasty),
                                    "operator": "In",
                                    "values": draw(st.lists(nasty, max_size=3)),
                                }
                            ]
                        },
                    }
                ]
            }
        },
        "pod_overrides": {
            "nodeSelector": draw(st.dictionaries(nasty, nasty, max_size=3)),
            "containers": [
                {"name": "sidecar", "image": "busybox", "args": draw(st.lists(nasty, max_size=3))}
            ],
        },
    }


# The pod spec's own field names and values that hold the free text above in place (not free text).
STRUCTURE = {
    "nodeAffinity",
    "preferredDuringSchedulingIgnoredDuringExecution",
    "weight",
    "preference",
    "matchExpressions",
    "key",
    "operator",
    "In",
    "values",
    "nodeSelector",
    "containers",
    "name",
    "sidecar",
    "image",
    "busybox",
    "args",
}


class Tokens:
    """Replaces every string in a structure (except the pod spec's STRUCTURE) with a unique plain token,
    remembering token -> string."""

    def __init__(self) -> None:
        self.original: dict[str, str] = {}

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str) and value and value not in STRUCTURE:  # "" stays "": emptiness is meaning
            token = f"tok{len(self.original)}z"
            self.original[token] = value
            return token
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self(v) for v in value)
        if isinstance(value, dict):
            return {self(k): self(v) for k, v in value.items()}
        return value

    def restore(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.original.get(value, value)
        if isinstance(value, list):
            return [self.restore(v) for v in value]
        if isinstance(value, dict):
            return {self.restore(k): self.restore(v) for k, v in value.items()}
        return value


def job(fields: dict[str, Any], *, train: bool) -> JobSpec:
    data: dict[str, Any] = {
        "name": "escape-test",
        "image": fields["image"],
        "nodes": 2,
        "env": {f"VAR_{i}": v for i, v in enumerate(fields["env"])},
        "secret_env": {"TOKEN": {"secret": "creds", "key": "token"}},
        "annotations": {f"example.com/note-{i}": v for i, v in enumerate(fields["annotations"])},
        "affinity": fields["affinity"],
        "pod_overrides": fields["pod_overrides"],
    }
    if train:
        data["train"] = {
            "task_args": fields["task_args"],
            "checkpoint": {"dir": fields["checkpoint_dir"]},
            "cuda_alloc_conf": fields["cuda_alloc_conf"],
        }
    else:
        data["command"] = fields["command"]
    return JobSpec.model_validate(data)


def comparable(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """train.json is JSON inside a string: compare it parsed."""
    for obj in objects:
        if obj["kind"] == "ConfigMap":
            obj["data"]["train.json"] = json.loads(obj["data"]["train.json"])
    return objects


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=free_text_fields(), train=st.booleans(), api=st.sampled_from(["pytorchjob", "trainjob"]))
def test_user_strings_are_values_never_structure(fields, train, api):
    tokens = Tokens()
    safe_fields = {name: tokens(value) for name, value in fields.items()}

    rendered = render.render(job(fields, train=train), api=api)
    expected = tokens.restore(comparable(render.render(job(safe_fields, train=train), api=api)))
    assert comparable(json.loads(json.dumps(rendered))) == expected

    # The CLI's serialisations hold exactly the same objects.
    assert list(yaml.safe_load_all(render.to_yaml(rendered))) == rendered
    assert json.loads(render.to_json(rendered))["items"] == rendered


@settings(max_examples=150, deadline=None)
@given(value=st.one_of(nasty, st.text()))
def test_template_filter_emits_a_yaml_scalar_that_reads_back_unchanged(value):
    document = f"key: {templates.yaml_scalar(value)}\nnext: 1\n"
    assert yaml.safe_load(document) == {"key": value, "next": 1}
    assert yaml.load(document, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) == {
        "key": value,
        "next": 1,
    }


def test_the_filter_escapes_exactly_what_a_yaml_reader_refuses_or_folds():
    """Every code point: escaped when PyYAML's reader refuses it (its NON_PRINTABLE), or when its emitter would
    escape it in a quoted scalar (the YAML 1.1 line breaks, which a reader folds, and the byte order mark)."""
    everything = "".join(map(chr, range(sys.maxunicode + 1)))
    refused = set(yaml.reader.Reader.NON_PRINTABLE.findall(everything))
    assert set(templates._YAML_UNSAFE.findall(everything)) == refused | set("\x85\u2028\u2029\ufeff")


def test_a_hostile_annotation_stays_one_value():
    """A readable instance of the property: a value that would inject a key if pasted unquoted."""
    fields = {
        "image": "i:1",
        "env": ["x"],
        "task_args": {},
        "checkpoint_dir": "/c",
        "cuda_alloc_conf": "c",
        "command": ["python"],
        "affinity": {"nodeAffinity": {}},
        "pod_overrides": {},
        "annotations": ["x\n  injected: true\n---\nkind: Secret {{ name }} # end"],
    }
    (job_object,) = [o for o in render.render(job(fields, train=True)) if o["kind"] == "PyTorchJob"]
    assert job_object["metadata"]["annotations"] == {"example.com/note-0": fields["annotations"][0]}
    assert len(render.render(job(fields, train=True))) == 3
