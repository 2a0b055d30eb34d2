"""The docs' facts about the job APIs, generated from the registry so that they cannot drift from the code.

    python -m orchestrator.apis.docs           # rewrite them in README.md and docs/*.md (run from the repo root)
    python -m orchestrator.apis.docs --check   # exit 1 and name each file whose text differs

Two kinds of places: a block between `<!-- apis:NAME -->` and `<!-- /apis:NAME -->` (a whole table, NAME in
BLOCKS), and one cell of a hand-written table (CELLS: the row whose first cell is given, its second cell).
Only what the registry and the API objects hold is generated; the prose around it stays hand-written.
tests/spec/test_docs_tables.py runs the check.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from orchestrator.apis import AUTO, CHOICES, REGISTRY, all_apis

FILES = ("README.md", "docs/*.md")


def comparison() -> str:
    """One column per API, in the registry's order: what each is, what orch creates, what it reads back."""
    apis = all_apis()

    def row(label: str, cells: list[str]) -> str:
        return f"| {label} | {' | '.join(cells)} |"

    def install(text: str) -> str:
        command, see, rest = text.partition(" (see ")
        return f"`{command}`" + (f" (see {rest}" if see else "")

    lines = [
        row("", [api.resource.kind for api in apis]),
        "|---" * (len(apis) + 1) + "|",
        row("`api:`, `--api`", [f"`{api.key}`" for api in apis]),
        row("served by", [REGISTRY[api.key].operator for api in apis]),
        row("the job object", [f"`{api.resource.api_version}` **{api.resource.kind}**" for api in apis]),
        row(
            "also created (owned by the job)",
            [
                ", ".join(r.kind + (" (before the job)" if r in api.before else "") for r in api.owned)
                for api in apis
            ],
        ),
        row("training container (the job's log and exit code)", [f"`{api.container}`" for api in apis]),
        row(
            "`restarts` in `orch status`",
            ["of the whole job (every pod)" if api.restarts_whole_job else "of one pod" for api in apis],
        ),
        row(
            f"`api: {AUTO}` on `orch submit`",
            ["first choice" if i == 0 else "when no API before it is served" for i, _ in enumerate(apis)],
        ),
        row(
            "served when API discovery lists",
            [f"`{api.resource.plural}` in `{api.resource.api_version}`" for api in apis],
        ),
        row("install", [install(api.install) for api in apis]),
    ]
    return "\n".join(lines)


def api_values() -> str:
    """The values `api:` takes, for the job spec's field table."""
    return r" \| ".join(f"`{choice}`" for choice in CHOICES)


BLOCKS: dict[str, Callable[[], str]] = {"comparison": comparison}
# (file, the row's first cell) -> the text of its second cell
CELLS: dict[tuple[str, str], Callable[[], str]] = {("docs/jobspec.md", "`api`"): api_values}


def generated(path: str, text: str) -> str:
    """`text` (the file at `path`, relative to the repo root) with every generated place rewritten."""
    for name, make in BLOCKS.items():
        text = _block(text, f"<!-- apis:{name} -->", make(), f"<!-- /apis:{name} -->")
    for (file, first), make in CELLS.items():
        if file == path:
            text = _cell(text, first, make())
    return text


def _block(text: str, start: str, block: str, end: str) -> str:
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    return pattern.sub(lambda _: f"{start}\n{block}\n{end}", text)


def _cell(text: str, first: str, cell: str) -> str:
    """The second cell of the first row whose first cell is `first`, replaced by `cell`."""
    # the cell ends at the first `|` that is not escaped (`\|` stands for a `|` inside a cell)
    row = re.compile(rf"^(\| {re.escape(first)} \| )(?:\\\||[^|\n])*?( \| )", re.MULTILINE)
    return row.sub(lambda m: m.group(1) + cell + m.group(2), text, count=1)


def differing(root: Path) -> dict[Path, str]:
    """The files under `root` whose generated places are not what the registry says: path -> new text."""
    found = {}
    for pattern in FILES:
        for file in sorted(root.glob(pattern)):
            text = file.read_text(encoding="utf-8")
            new = generated(file.relative_to(root).as_posix(), text)
            if new != text:
                found[file] = new
    return found


def main(argv: list[str]) -> int:
    check = "--check" in argv
    found = differing(Path("."))
    for file, text in found.items():
        if check:
            print(
                f"{file}: the API tables differ from orchestrator/apis (run: python -m orchestrator.apis.docs)"
            )
        else:
            file.write_text(text, encoding="utf-8")
            print(f"{file}: rewritten")
    return 1 if check and found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
