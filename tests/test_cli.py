"""The CLI as a whole: every command is wired, teaches with an example, and reports errors in one line."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from orchestrator import __version__
from orchestrator.cli import COMMANDS, cli


def orch(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    """Run the real console entry point in a fresh process (exit codes and stderr as a user sees them)."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_help_lists_every_command():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    listed = [line.split()[0] for line in result.output.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == list(COMMANDS)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_help_has_an_example(name):
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.output, f"`orch {name} --help` should show an example"


def test_version():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.output.strip() == f"orch, version {__version__}"


def test_unknown_command_is_a_usage_error():
    result = orch("frobnicate")
    assert result.returncode == 2
    assert "No such command 'frobnicate'" in result.stderr


def test_spec_error_is_one_line_with_exit_code_2(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("name: Bad_Name\ntrain: {task: digits}\n")
    result = orch("validate", str(job))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {job}:1:1: name: 'Bad_Name' is not a valid job name: "
        "a DNS-1035 label (lowercase letters, digits and '-', "
        "starting with a letter)"
    ]
    assert "Traceback" not in result.stderr


DURATIONS_OK = {"90s": 90, "1h30m": 5400, "1d": 86400, "1w": 604800, "2w1d": 1296000, "600": 600}
DURATIONS_BAD = ["1y", "", "1h\n", "0", "0s", "-5", "1.5h", "h", "99999999999s"]


@pytest.mark.parametrize("text", [*DURATIONS_OK, *DURATIONS_BAD])
def test_job_file_and_cli_durations_agree(text, tmp_path):
    """`deadline:` in job.yaml and `orch wait --timeout` share one parser: same seconds, same refusals."""
    from orchestrator.commands.common import DURATION
    from orchestrator.errors import SpecError
    from orchestrator.job import loading

    job = tmp_path / "job.yaml"
    job.write_text(f"name: d\ntrain: {{task: digits}}\ndeadline: {text!r}\n")
    if text in DURATIONS_OK:
        assert loading.load_job(job).deadline == DURATION.convert(text, None, None) == DURATIONS_OK[text]
    else:
        with pytest.raises(SpecError):
            loading.load_job(job)
        with pytest.raises(click.BadParameter):
            DURATION.convert(text, None, None)


def test_wait_refuses_a_bad_timeout_before_connecting():
    result = CliRunner().invoke(cli, ["wait", "demo", "--timeout", "1y", "--kubeconfig", "/nonexistent"])
    assert result.exit_code == 2 and "'1y' is not a duration" in result.output
