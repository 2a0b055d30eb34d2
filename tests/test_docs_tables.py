"""The docs' tables of job APIs say what orchestrator/apis says (they are generated from it).

When a test here fails after a change to an API module or the registry, regenerate the tables from the repo
root and review the diff:

    .venv/bin/python -m orchestrator.apis.docs
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.apis import docs, registry

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = (
    "the docs' API tables differ from orchestrator/apis: run `.venv/bin/python -m orchestrator.apis.docs`"
)


def test_the_docs_api_tables_say_what_the_registry_says():
    assert sorted(str(p.relative_to(ROOT)) for p in docs.differing(ROOT)) == [], REGENERATE


def test_every_generated_place_is_in_the_docs():
    """A marker or a row removed by hand would silently end the check for that table."""
    texts = {
        p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
        for pattern in docs.FILES
        for p in ROOT.glob(pattern)
    }
    for name in docs.BLOCKS:
        assert any(f"<!-- apis:{name} -->" in text for text in texts.values()), name
    for file, first in docs.CELLS:
        assert f"\n| {first} | " in texts[file], (file, first)


def test_a_registry_change_shows_as_a_difference(monkeypatch):
    entry = registry.REGISTRY["trainjob"]
    monkeypatch.setitem(registry.REGISTRY, "trainjob", entry._replace(operator="Kubeflow Trainer v9"))
    changed = docs.differing(ROOT)
    assert {p.relative_to(ROOT).as_posix() for p in changed} == {"docs/cluster.md", "docs/jobspec.md"}
    assert (
        "| served by | Kubeflow training operator | Kubeflow Trainer v9 |"
        in changed[ROOT / "docs/cluster.md"]
    )


def test_a_cell_is_rewritten_up_to_its_first_unescaped_bar():
    text = "| field | type |\n|---|---|\n| `api` | `auto` \\| `old` | `auto` | which API |\n| `image` | ref | x | y |\n"
    assert docs.generated("docs/jobspec.md", text) == text.replace(
        "`auto` \\| `old`", " \\| ".join(f"`{c}`" for c in registry.CHOICES)
    )
    assert docs.generated("docs/cluster.md", text) == text  # the cell belongs to the job spec's table
