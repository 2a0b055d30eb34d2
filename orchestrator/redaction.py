"""Credentials out of everything orch prints or stores: URLs with a password, and known secrets in text.

One place for it, so that every message, warning, log line and annotation goes through the same rule.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable

# scheme://user:password@host or scheme://token@host inside any text; the credential ends at '@'.
_URL_CREDENTIALS = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s@?#]+)@")

MIN_SECRET_LENGTH = 4


def redact_url(url: str) -> str:
    """The URL with any password in it replaced by ***: http://admin:***@host:6443 (a user alone, often a
    token, is replaced too: https://***@host)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(an unreadable URL)"
    if parts.password is None and parts.username is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{user}:***@{host}" if parts.password is not None and user else f"***@{host}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def redact(text: str) -> str:
    """`text` with the credentials of every URL in it replaced by *** (as redact_url does)."""

    def hide(match: re.Match[str]) -> str:
        user, colon, _ = match["userinfo"].partition(":")
        return f"{match['scheme']}{user}:***@" if colon and user else f"{match['scheme']}***@"

    return _URL_CREDENTIALS.sub(hide, text)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret replaced by ***, and URL credentials redacted. A secret is replaced where it
    stands whole, not inside a longer run of letters and digits; one shorter than MIN_SECRET_LENGTH only as
    a URL's credential (by structure): matched in prose, `a` would star every article of the message, and a
    secret that short protects nothing anyway."""
    for secret in sorted((s for s in secrets if len(s) >= MIN_SECRET_LENGTH), key=len, reverse=True):
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", "***", text)
    return redact(text)


def shown(text: str) -> str:
    """`text` as orch may print it on one line of a terminal: URL credentials redacted, and control characters
    (a newline from a job's free text, ESC) escaped, so that nothing a job or a server says can forge a line
    of orch's output or move the cursor."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in redact(text))
