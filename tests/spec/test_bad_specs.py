"""A corpus of malformed job files (tests/spec/bad/*.yaml): each gets one line naming file, line and field.

Each file starts with `# expect: FIELD: TEXT` (FIELD `-` for YAML-level mistakes that have no field) and
marks the line the error must point at with `# <-` (or says `# line: N`). Every file goes through the loader;
a sample also goes through `orch validate` / `orch render` (in process, as the console script runs: exit code and
stderr), and two of those through the real console script in a process of its own (the process-level contract).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.job import loading
from tests.fakes.cli import run_orch

BAD = sorted((Path(__file__).parent / "bad").glob("*.yaml"))
ORCH = Path(sys.executable).with_name("orch")


def expectation(path: Path) -> tuple[str, str, int]:
    lines = path.read_text(encoding="utf-8").splitlines()
    field, _, text = re.fullmatch(r"# expect: (.*)", lines[0]).group(1).partition(": ")
    marked = [number for number, line in enumerate(lines, 1) if line.rstrip().endswith("# <-")]
    stated = [int(m.group(1)) for line in lines if (m := re.fullmatch(r"# line: (\d+)", line))]
    (line,) = marked or stated
    return field, text, line


def check_message(message: str, path: Path) -> None:
    field, text, line = expectation(path)
    assert message.startswith(f"{path}:{line}:"), message
    if field != "-":
        assert f": {field}: " in message, message
    assert text in message, message
    assert "\n" not in message


def test_corpus_is_large_enough():
    assert len(BAD) >= 30


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_loader_names_file_line_and_field(path):
    with pytest.raises(SpecError) as caught:
        loading.load_job(path)
    assert caught.value.exit_code == 2
    check_message(str(caught.value), path)


CLI_SAMPLE = [
    "yaml-syntax",
    "duplicate-key",
    "empty-file",
    "unknown-nested",
    "batch-not-divisible",
    "env-boolean",
    "volume-relative-mount",
    "elastic-outside-nodes",
]


def assert_exit_2_with_one_line(result: subprocess.CompletedProcess[str], path: Path) -> None:
    assert result.returncode == 2
    assert result.stdout == ""  # nothing half-rendered
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ")
    check_message(line.removeprefix("error: "), path)


@pytest.mark.parametrize("command", ["validate", "render"])
@pytest.mark.parametrize("stem", CLI_SAMPLE)
def test_cli_exits_2_with_one_line_and_no_traceback(stem, command):
    path = BAD[0].parent / f"{stem}.yaml"
    assert_exit_2_with_one_line(run_orch(command, str(path)), path)


@pytest.mark.parametrize(
    ("command", "stem"), [("validate", "yaml-syntax"), ("render", "batch-not-divisible")]
)
def test_the_console_script_exits_2_with_one_line_and_no_traceback(command, stem):
    path = BAD[0].parent / f"{stem}.yaml"
    result = subprocess.run([str(ORCH), command, str(path)], capture_output=True, text=True, timeout=60)
    assert_exit_2_with_one_line(result, path)


def test_render_without_image_names_the_field(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("name: no-image\ntrain: {task: digits}\n")
    result = run_orch("render", str(job))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"error: {job}:") and ": image: required" in result.stderr


def test_bad_override_names_the_flag(tmp_path):
    job = Path(__file__).parents[2] / "examples" / "cpu-minimal.yaml"
    result = run_orch("render", str(job), "--set", "nodes=0")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "error: --set nodes=0: nodes: Input should be greater than 0\n"
