"""Where each value of a composed YAML document stands, for error lines that point into the file."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import yaml

FieldPath = tuple[str | int, ...]
Position = tuple[int, int]  # 1-based line and column


def positions(node: yaml.Node, path: FieldPath = (), *, at_keys: bool = False) -> dict[FieldPath, Position]:
    """Position of every value in a composed document (a yaml.Node), by its path. With `at_keys`, a mapping's
    entry points at its key, which reads better than the value for "unknown field" and "wrong type"."""
    import yaml  # here: the kubeconfig reader imports yaml only when it reads one

    found = {path: (node.start_mark.line + 1, node.start_mark.column + 1)}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = (*path, key_node.value)
            found.update(positions(value_node, child, at_keys=at_keys))
            if at_keys:
                found[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            found.update(positions(item, (*path, index), at_keys=at_keys))
    return found
