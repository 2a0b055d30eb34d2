"""The Jinja2 templates in manifests/, filled and parsed: `render_template(name, **parts) -> dict`.

Each template writes one kind of object from the typed parts it is given (rendering/parts.py, and each API
module's own). Every value a template places goes through `tojson` (here `yaml_scalar`): a JSON scalar or
flow collection is valid YAML, so nothing a user writes can change a manifest's structure. The environment
is strict: a name or attribute a template misspells raises (StrictUndefined) instead of writing nothing.
Imports jinja2 and yaml only when a template is rendered.

The templates come precompiled (rendering/precompiled/: what Jinja2's `compile_templates` writes, ~25 ms of
`orch render` not spent compiling them in every process), read through a `jinja2.ModuleLoader`. A template's
module is used only while it is what the template compiles to now: the same source, the same Jinja2 (another
version's generated code may call runtime functions this one lacks); otherwise the template is compiled as
before, in memory. Rendering writes nothing. tests/spec/test_precompiled.py fails while precompiled/ differs
from what the templates compile to, and rewrites it with ORCH_UPDATE_GOLDENS=1.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import MutableMapping
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


def source(name: str) -> str:
    """The text of the template `name` (a file of the package orchestrator.manifests, manifests/ here)."""
    import importlib.resources

    return importlib.resources.files("orchestrator.manifests").joinpath(name).read_text(encoding="utf-8")


def source_digest(text: str) -> str:
    """What precompiled/ records of each template's source (precompiled.SOURCE_DIGESTS)."""
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


@functools.cache
def _environment() -> jinja2.Environment:
    import importlib.resources

    import jinja2

    from orchestrator.rendering import precompiled

    modules = jinja2.ModuleLoader(list(precompiled.__path__))

    class Loader(jinja2.BaseLoader):
        """The template's precompiled module while it is current, else its source (compiled by Jinja2)."""

        def get_source(self, environment: jinja2.Environment, name: str) -> tuple[str, None, None]:
            return source(name), None, None  # no file name (a traceback says <template>); never reloaded

        def list_templates(self) -> list[str]:  # what compile_templates compiles (test_precompiled.py)
            files = importlib.resources.files("orchestrator.manifests").iterdir()
            return sorted(f.name for f in files if f.name.endswith(".j2"))

        def load(
            self,
            environment: jinja2.Environment,
            name: str,
            globals: MutableMapping[str, Any] | None = None,
        ) -> jinja2.Template:
            current = source_digest(source(name)) == precompiled.SOURCE_DIGESTS.get(name)
            if current and jinja2.__version__ == precompiled.JINJA2_VERSION:
                return modules.load(environment, name, globals)
            return super().load(environment, name, globals)

    env = jinja2.Environment(
        loader=Loader(),
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
