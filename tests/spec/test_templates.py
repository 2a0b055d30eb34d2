"""The templates of manifests/ read only what their typed parts have (mypy cannot see into a .j2 file).

Statically: every attribute a template reads (`pod.container.image`, `for port in ports: port.number`), in
every branch, whether or not a rendered example reaches it, is a field of the dataclass it reads it from
(rendering/parts.py, each API module's own part), and a macro of parts.j2 gets the part it writes. At
render time: the environment is strict, so a misspelt name or attribute raises, naming it, instead of
writing nothing.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import jinja2
import pytest
from jinja2 import meta, nodes

from orchestrator.apis import pytorchjob, trainjob
from orchestrator.rendering import parts, templates

MANIFESTS = Path(__file__).parents[2] / "manifests"
# What each template is given (the keywords of its render_template call) and what parts.j2's macros take.
TEMPLATE_PARTS: dict[str, dict[str, Any]] = {
    "pod.yaml.j2": {"pod": parts.Pod, "layout": parts.PodLayout},
    "configmap.yaml.j2": {"config_map": parts.ConfigMap},
    "podmonitor.yaml.j2": {"monitor": parts.PodMonitor},
    "pytorchjob.yaml.j2": {"job": pytorchjob.PyTorchJob},
    "trainingruntime.yaml.j2": {"runtime": trainjob.TrainingRuntime},
    "trainjob.yaml.j2": {"job": trainjob.TrainJob},
    "parts.j2": {},
}
MACRO_PARAMETERS: dict[str, dict[str, Any]] = {
    "metadata": {"meta": parts.Metadata},
    "env": {"variables": tuple[parts.EnvVar, ...]},
}


def _fields(kind: Any) -> dict[str, Any]:
    """A dataclass's fields and class constants with their types ({} for anything else)."""
    if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
        return {}
    hints = typing.get_type_hints(kind)
    return {name: _unwrap(hint) for name, hint in hints.items()}


def _unwrap(hint: Any) -> Any:
    """X | None -> X; ClassVar[X] -> X."""
    if typing.get_origin(hint) is typing.ClassVar:
        return _unwrap(typing.get_args(hint)[0])
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        return _unwrap(rest[0]) if len(rest) == 1 else hint
    return hint


def _item(hint: Any) -> Any:
    """The item type of tuple[X, ...] / list[X] (None when unknown)."""
    args = typing.get_args(hint)
    return args[0] if typing.get_origin(hint) in (tuple, list) and args else None


class Checker:
    """Walks a template's AST with the type of each name in scope; collects what does not resolve."""

    def __init__(self, scope: dict[str, Any]):
        self.scope = dict(scope)
        self.problems: list[str] = []

    def type_of(self, node: nodes.Node) -> Any:
        if isinstance(node, nodes.Name):
            return self.scope.get(node.name)
        if isinstance(node, nodes.Getattr):
            owner = self.type_of(node.node)
            fields = _fields(owner)
            if fields and node.attr not in fields:
                self.problems.append(f"line {node.lineno}: {owner.__name__} has no attribute {node.attr!r}")
            return fields.get(node.attr)
        if isinstance(node, nodes.Add):
            return self.type_of(node.left)
        if isinstance(node, nodes.CondExpr):
            return self.type_of(node.expr1)
        if isinstance(node, nodes.Filter):
            return None
        return None

    def visit(self, node: nodes.Node) -> None:
        if isinstance(node, nodes.For):
            self.visit(node.iter)
            if isinstance(node.target, nodes.Name):
                self.scope[node.target.name] = _item(self.type_of(node.iter))
            for child in (*node.body, *node.else_):
                self.visit(child)
            return
        if isinstance(node, nodes.Assign) and isinstance(node.target, nodes.Name):
            self.visit(node.node)
            self.scope[node.target.name] = self.type_of(node.node)
            return
        if isinstance(node, nodes.Macro):
            inner = Checker({**self.scope, **MACRO_PARAMETERS[node.name]})
            for child in node.body:
                inner.visit(child)
            self.problems += inner.problems
            return
        if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr):
            macro = node.node.attr
            expected = list(MACRO_PARAMETERS.get(macro, {}).values())
            given = [self.type_of(arg) for arg in node.args]
            if (
                isinstance(node.node.node, nodes.Name)
                and node.node.node.name == "parts"
                and given != expected
            ):
                self.problems.append(f"line {node.lineno}: parts.{macro} gets {given}, takes {expected}")
        if isinstance(node, nodes.Getattr):
            self.type_of(node)  # checks the whole chain; its inner nodes are checked there
            return
        for child in node.iter_child_nodes():
            self.visit(child)


def problems(source: str, scope: dict[str, Any]) -> list[str]:
    environment = templates._environment()
    tree = environment.parse(source)
    names = meta.find_undeclared_variables(tree) - {"parts"}
    found = [f"reads {name!r}, which it is not given" for name in sorted(names - set(scope))]
    checker = Checker({**scope, "parts": None})
    checker.visit(tree)
    return found + checker.problems


def test_every_template_is_checked():
    assert {p.name for p in MANIFESTS.glob("*.j2")} == set(TEMPLATE_PARTS)


@pytest.mark.parametrize("template", TEMPLATE_PARTS)
def test_a_template_reads_only_fields_its_parts_have(template):
    assert problems((MANIFESTS / template).read_text(encoding="utf-8"), TEMPLATE_PARTS[template]) == []


def test_the_checker_sees_a_misspelt_attribute_in_a_branch_no_example_reaches():
    source = (
        "{% for port in layout.api_ports %}{{ port.numbr }}{% endfor %}"
        "{% if pod.affinity %}{{ pod.container.imag }}{% endif %}{{ parts.metadata(pod) }}{{ pods }}"
    )
    found = problems(source, {"pod": parts.Pod, "layout": parts.PodLayout})
    assert found == [
        "reads 'pods', which it is not given",
        "line 1: Port has no attribute 'numbr'",
        "line 1: Container has no attribute 'imag'",
        f"line 1: parts.metadata gets {[parts.Pod]}, takes {[parts.Metadata]}",
    ]


@pytest.mark.parametrize(
    "source",
    ["{{ part.nme | tojson }}", "{% if part.nme %}x{% endif %}", "{% for x in part.nme %}{% endfor %}"],
)
def test_a_misspelt_attribute_fails_the_render(source):
    part = parts.Port("metrics", 9400)
    with pytest.raises(jinja2.UndefinedError, match="has no attribute 'nme'"):
        templates._environment().from_string(source).render(part=part)
