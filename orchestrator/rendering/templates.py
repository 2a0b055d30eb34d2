"""The Jinja2 templates in manifests/, filled and parsed: `render_template(name, **parts) -> dict`.

Each template writes one kind of object from the typed parts it is given (rendering/parts.py, and each API
module's own). Every value a template places goes through `tojson` (here `yaml_scalar`): a JSON scalar or
flow collection is valid YAML, so nothing a user writes can change a manifest's structure. The environment
is strict: a name or attribute a template misspells raises (StrictUndefined) instead of writing nothing.
Imports jinja2 and yaml only when a template is rendered.
"""

from __future__ import annotations

import functools
import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jinja2

# Characters PyYAML's reader refuses anywhere in a stream (C0 controls but tab and line breaks, DEL, C1,
# surrogates, U+FFFE/U+FFFF), plus what its emitter escapes in a quoted scalar: the ones YAML 1.1 reads as
# line breaks (they would be folded) and the byte order mark. JSON leaves them raw with ensure_ascii=False.
# Listed rather than written as the complement of what is allowed: a negated class spanning the astral
# planes takes `re` ~5 ms to compile, in every `orch render`.
_YAML_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]")


def yaml_scalar(value: Any) -> str:
    """`value` as JSON that any YAML parser reads back unchanged (the templates' `tojson` filter).

    Unlike Jinja's own `tojson` (HTML escaping, astral characters as surrogate pairs that PyYAML cannot
    rejoin), this keeps text as is and escapes only what a YAML reader would reject or fold.
    """
    text = json.dumps(value, ensure_ascii=False, default=_not_json)
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _not_json(value: object) -> object:
    """json.dumps' fallback: a name or attribute a template misspelt (jinja2's StrictUndefined) raises its
    own error, naming it; anything else that is not JSON (a part placed whole) is refused."""
    str(value)
    raise TypeError(
        f"a template placed a {type(value).__name__}, which is not a JSON value: place its fields"
    )


@functools.cache
def _environment() -> jinja2.Environment:
    import importlib.resources

    import jinja2

    templates = importlib.resources.files("orchestrator.manifests")
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: templates.joinpath(name).read_text(encoding="utf-8")),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["tojson"] = yaml_scalar
    return env


def render_template(template: str, **parts: object) -> dict[str, Any]:
    """One object: the template `template` (a file in manifests/) filled from `parts`, parsed."""
    import yaml

    text = _environment().get_template(template).render(parts)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    parsed: dict[str, Any] = yaml.load(text, Loader=loader)
    return parsed
