"""Every `make ...` line the docs show is one make runs (#33: `make gpu-check --tiny`, as docs/testing.md wrote
it, was a make error: make reads `--tiny` as its own option), and what `make gpu-check` writes lands where git
ignores it (it wrote gpu-check.json into the checkout's root)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from benchmarks import gpu

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# `make TARGET ...` in a code span, or at the start of a line in a code block
MAKE_LINE = re.compile(r"(?:`|^\s*)make ([^`\n#]*)", re.MULTILINE)


def documented_make_commands() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for match in MAKE_LINE.finditer(doc.read_text(encoding="utf-8")):
            found.append((doc.name, match.group(1).strip()))
    return found


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*):(?!=)", text, re.MULTILINE)}


def test_every_documented_make_command_names_a_target_and_passes_flags_as_variables():
    commands = documented_make_commands()
    assert any(line.startswith("gpu-check") for _, line in commands)  # the parser finds them
    targets = makefile_targets()
    for doc, line in commands:
        words = shlex.split(line)  # GPU_CHECK_ARGS='--json PATH' is one word, as the shell reads it
        named = [w for w in words if "=" not in w and not w.startswith("-")]
        assert named and all(w in targets for w in named), f"{doc}: make {line}: no such target"
        flags = [w for w in words if w.startswith("--")]
        assert flags == [], (
            f"{doc}: make {line}: make takes {flags} as its own option; use a variable or target"
        )


def test_the_gpu_check_report_goes_under_a_git_ignored_folder():
    folder = gpu.CHECK_REPORT.split("/")[0]
    ignored = (REPO / ".gitignore").read_text(encoding="utf-8").split()
    assert "/" in gpu.CHECK_REPORT and f"{folder}/" in ignored
