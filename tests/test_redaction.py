"""Credentials never reach what orch prints or stores; job and server text cannot forge lines (#25, class 4)."""

from __future__ import annotations

import pytest

from orchestrator import redaction
from orchestrator.cli import one_line


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://bob:hunter2@mlflow:5000/x", "http://bob:***@mlflow:5000/x"),
        ("at https://ghp_token@github.com/a.git: refused", "at https://***@github.com/a.git: refused"),
        ("a http://u:p@a and postgresql://me:pw@db/x", "a http://u:***@a and postgresql://me:***@db/x"),
        ("no credential: http://host/a@b and mail bob@example.com", None),
    ],
)
def test_every_url_in_a_text_loses_its_credentials(text, expected):
    assert redaction.redact(text) == (expected or text)


def test_a_very_short_secret_does_not_mangle_the_text():
    message = "cannot reach http://admin:a@host:6443: a timeout after a while"
    assert (
        redaction.scrub(message, ["a"]) == "cannot reach http://admin:***@host:6443: a timeout after a while"
    )


def test_a_secret_is_hidden_where_it_stands_whole():
    assert (
        redaction.scrub("token s3cr3t-x refused (s3cr3tive)", ["s3cr3t-x"]) == "token *** refused (s3cr3tive)"
    )


def test_a_printed_line_cannot_forge_lines_or_move_the_cursor():
    assert redaction.shown("exp\nTracking:    fake\x1b[2J") == "exp\\nTracking:    fake\\x1b[2J"


def test_every_error_line_is_redacted():
    assert one_line("--set tracking.mlflow.tracking_uri=http://u:pw@h: bad") == (
        "--set tracking.mlflow.tracking_uri=http://u:***@h: bad"
    )
