"""The precompiled templates (orchestrator/rendering/precompiled/) are what manifests/ compiles to, byte for byte.

`orch render` reads Jinja2's modules of the templates instead of compiling them in every process
(rendering/templates.py). They are generated here: after a change to a template, to the environment's
options or to Jinja2, regenerate them and commit the folder with the template:
    ORCH_UPDATE_GOLDENS=1 .venv/bin/pytest tests/spec/test_precompiled.py
Until then this test fails; rendering stays right meanwhile (a template whose source or Jinja2 differs from
what its module was compiled from is compiled from source), so the goldens never depend on it.
"""

from __future__ import annotations

import os
from pathlib import Path

import jinja2
import pytest

from orchestrator.job import loading
from orchestrator.rendering import precompiled, render, templates

REPO = Path(__file__).parents[2]
FOLDER = Path(precompiled.__file__).parent
UPDATE = os.environ.get("ORCH_UPDATE_GOLDENS") == "1"
INDEX = '''\
"""manifests/*.j2 compiled by Jinja2 {version} (Environment.compile_templates), one module per template.

rendering/templates.py reads a template's module (jinja2.ModuleLoader) while the template's source has the
digest below and Jinja2 is this version, and compiles the template otherwise. Generated, never edited:
ORCH_UPDATE_GOLDENS=1 pytest tests/spec/test_precompiled.py (which fails while this folder is out of date).
"""

JINJA2_VERSION = "{version}"
SOURCE_DIGESTS = {{
{digests}}}
'''


def compiled(target: Path) -> dict[str, bytes]:
    """The folder as the templates compile now: Jinja2's module of each, and the index templates.py reads."""
    environment = templates._environment()
    environment.compile_templates(target, zip=None, ignore_errors=False)
    digests = "".join(
        f'    "{name}": "{templates.source_digest(templates.source(name))}",\n'
        for name in environment.list_templates()
    )
    (target / "__init__.py").write_text(INDEX.format(version=jinja2.__version__, digests=digests))
    return {path.name: path.read_bytes() for path in sorted(target.glob("*.py"))}


@pytest.fixture
def fresh_environment():
    """A new environment for the test (templates are cached in it), and one again after it."""
    templates._environment.cache_clear()
    yield
    templates._environment.cache_clear()


def test_the_precompiled_templates_are_what_the_templates_compile_to(tmp_path):
    expected = compiled(tmp_path)
    if UPDATE:
        for stale in FOLDER.glob("*.py"):
            stale.unlink()
        for name, text in expected.items():
            (FOLDER / name).write_bytes(text)
    found = {path.name: path.read_bytes() for path in sorted(FOLDER.glob("*.py"))}
    differ = sorted(name for name in {*found, *expected} if found.get(name) != expected.get(name))
    assert differ == [], f"out of date: {differ}; regenerate: ORCH_UPDATE_GOLDENS=1 pytest {__file__}"


def test_every_template_renders_from_its_precompiled_module(fresh_environment):
    """What `orch render` reads is the module, not the template compiled again (what it saves)."""
    environment = templates._environment()
    names = environment.list_templates()
    assert names == sorted(p.name for p in (REPO / "manifests").glob("*.j2"))
    loaded = {name: environment.get_template(name).filename for name in names}
    assert {name: Path(where).parent for name, where in loaded.items()} == dict.fromkeys(names, FOLDER)


def test_a_template_changed_since_it_was_precompiled_renders_as_it_is_now(fresh_environment, monkeypatch):
    """Its module is stale (its source digest differs): the template is compiled from its source instead."""
    spec = loading.load_job(REPO / "examples" / "gpt-multinode.yaml")
    before = render.render(spec)
    templates._environment.cache_clear()
    edited = templates.source

    def source(name: str) -> str:
        text = edited(name)
        return text.replace("kind: ConfigMap", "kind: Edited") if name == "configmap.yaml.j2" else text

    monkeypatch.setattr(templates, "source", source)
    after = render.render(spec)
    assert [o["kind"] for o in after] == ["Edited", *(o["kind"] for o in before[1:])]
    assert after[1:] == before[1:]  # the other templates' modules are still current
    environment = templates._environment()
    assert environment.get_template("configmap.yaml.j2").filename == "<template>"
    assert Path(environment.get_template("pod.yaml.j2").filename).parent == FOLDER


def test_modules_another_jinja2_compiled_are_not_used(fresh_environment, monkeypatch):
    """Jinja2's generated code calls its runtime's functions, which change between versions."""
    spec = loading.load_job(REPO / "examples" / "gpt-multinode.yaml")
    objects = {api: render.render(spec, api=api) for api in ("pytorchjob", "trainjob")}
    templates._environment.cache_clear()
    monkeypatch.setattr(precompiled, "JINJA2_VERSION", "0.0")
    assert {api: render.render(spec, api=api) for api in objects} == objects
    environment = templates._environment()
    loaded = {environment.get_template(name).filename for name in environment.list_templates()}
    assert loaded == {"<template>"}  # compiled from source, every one
