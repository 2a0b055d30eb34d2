""".dockerignore rules as Docker applies them: reading an ignore file, and whether a path is left out.

A port of moby/patternmatcher (ignorefile.ReadAll, PatternMatcher.MatchesOrParentMatches and Pattern.compile),
the matcher docker's and buildkit's clients use for a build context. Why not a library: pathspec matches
.gitignore's rules (`foo` at any depth where Docker means only `./foo`; `foo/` only a folder), and docker-py's
port lowercases both the path and the pattern (`data` leaves out `Data/`), always keeps `Dockerfile` and
`.dockerignore`, and has no `\\` escape.

The rules (docs.docker.com, "dockerignore file"): a line starting with `#` is a comment; each other line is
trimmed and cleaned as a path (`./a`, `a/`, `/a` all mean `a`); `*` and `?` do not cross `/`, `**` matches any
number of folders (none included), `[a-c]`, `[^a]` and `\\` escapes as Go's filepath.Match; a pattern that
matches a folder leaves out everything in it; `!` makes an exception; the last pattern that matches decides.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

_BOM = "\ufeff"
_ESCAPED = set(".+()|{}$")  # regex metacharacters a pattern means literally (patternmatcher's shouldEscape)


class BadPattern(ValueError):
    """A pattern Go's filepath.Match refuses (an unclosed `[`, a lone `!`)."""


def read(path: Path) -> list[str]:
    """The patterns of an ignore file, as ignorefile.ReadAll gives them: cleaned, `!` kept in front."""
    return [pattern for _, pattern in numbered(path)]


def load(path: Path) -> Matcher:
    """The matcher of an ignore file; BadPattern names the file and the line."""
    patterns = []
    for number, pattern in numbered(path):
        try:
            patterns.append(compile_pattern(pattern))
        except BadPattern as error:
            raise BadPattern(f"{path}:{number}: {error}") from None
    return Matcher(patterns)


def numbered(path: Path) -> list[tuple[int, str]]:
    """(line number, pattern) for each pattern of an ignore file."""
    patterns = []
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    for number, line in enumerate(text.split("\n"), start=1):
        if number == 1:
            line = line.removeprefix(_BOM)
        if line.startswith("#"):  # only in column 1: " #x" is the pattern "#x", as in Docker
            continue
        pattern = line.strip()
        if not pattern:
            continue
        invert = pattern.startswith("!")
        if invert:
            pattern = pattern[1:].strip()
        if pattern:
            pattern = go_clean(pattern)
            if len(pattern) > 1 and pattern.startswith("/"):
                pattern = pattern[1:]
        patterns.append((number, "!" + pattern if invert else pattern))
    return patterns


def go_clean(path: str) -> str:
    """Go's filepath.Clean on a slash path: posixpath.normpath, but a leading `//` is one `/` and "" is "."."""
    cleaned = posixpath.normpath(path) if path else "."
    return "/" + cleaned.lstrip("/") if cleaned.startswith("//") else cleaned


def go_dir(path: str) -> str:
    """Go's filepath.Dir: everything before the last `/`, cleaned ("." when there is none)."""
    cut = path.rfind("/")
    return go_clean(path[: cut + 1]) if cut >= 0 else "."


@dataclass(frozen=True)
class Pattern:
    text: str  # cleaned, without the `!`
    exclusion: bool  # a `!` exception: matching it puts the path back in
    kind: str  # exact | prefix | suffix | regexp (patternmatcher's matchType)
    regex: re.Pattern[str] | None

    @property
    def dirs(self) -> list[str]:
        return self.text.split("/")

    def match(self, path: str) -> bool:
        if self.kind == "exact":
            return path == self.text
        if self.kind == "prefix":
            return path.startswith(self.text[:-2])
        if self.kind == "suffix":
            suffix = self.text[2:]
            return path.endswith(suffix) or (suffix.startswith("/") and path == suffix[1:])
        assert self.regex is not None
        return self.regex.match(path) is not None


def compile_pattern(raw: str) -> Pattern:
    """One pattern, compiled as Pattern.compile does (the same regex, the same shortcut kinds)."""
    text = go_clean(raw.strip())
    exclusion = text.startswith("!")
    if exclusion:
        if len(text) == 1:
            raise BadPattern('illegal exclusion pattern: "!"')
        text = text[1:]
    if problem := _glob_problem(text):
        raise BadPattern(f"bad pattern {raw!r}: {problem}")
    regex, kind, i, position = "^", "exact", 0, 0
    while position < len(text):
        ch = text[position]
        position += 1
        if ch == "*":
            if position < len(text) and text[position] == "*":  # some flavour of **
                position += 1
                if position < len(text) and text[position] == "/":  # **/ is **
                    position += 1
                if position == len(text):  # ** at the end matches everything below
                    if kind == "exact":
                        kind = "prefix"
                    else:
                        regex, kind = regex + ".*", "regexp"
                else:
                    regex, kind = regex + "(.*/)?", "regexp"
                if i == 0:
                    kind = "suffix"
            else:
                regex, kind = regex + "[^/]*", "regexp"
        elif ch == "?":
            regex, kind = regex + "[^/]", "regexp"
        elif ch in _ESCAPED:
            regex += "\\" + ch
        elif ch == "\\":
            if position < len(text):
                regex, kind = regex + re.escape(text[position]), "regexp"
                position += 1
            else:
                regex += "\\\\"
        elif ch in "[]":
            regex, kind = regex + ch, "regexp"
        else:
            regex += ch
        i += 1
    compiled = None
    if kind == "regexp":
        try:
            compiled = re.compile(regex + r"\Z")  # Go's `$` without the multi-line flag: the end of the text
        except re.error as error:
            raise BadPattern(f"bad pattern {raw!r}: {error}") from error
    return Pattern(text, exclusion, kind, compiled)


def _glob_problem(pattern: str) -> str | None:
    """What Go's filepath.Match refuses in a pattern (patternmatcher.New asks it), or None: a `\\` at the end, an
    unclosed `[`, a class that is empty, starts with `-`/`]` or has a range without its ends."""
    position = 0

    def class_char() -> bool:  # Go's getEsc: one character of a class, `\\x` escaping
        nonlocal position
        if position >= len(pattern) or pattern[position] in "-]":
            return False
        if pattern[position] == "\\":
            position += 1
            if position >= len(pattern):
                return False
        position += 1
        return True

    while position < len(pattern):
        ch = pattern[position]
        position += 1
        if ch == "\\":
            if position >= len(pattern):
                return "a \\ at the end escapes nothing"
            position += 1
        elif ch == "[":
            if position < len(pattern) and pattern[position] == "^":
                position += 1
            ranges = 0
            while True:
                if position < len(pattern) and pattern[position] == "]" and ranges > 0:
                    position += 1
                    break
                if not class_char():
                    return "a [class] that is unclosed, empty, or starts or ends a range with - or ]"
                if position < len(pattern) and pattern[position] == "-":
                    position += 1
                    if not class_char():
                        return "a [class] that is unclosed, empty, or starts or ends a range with - or ]"
                ranges += 1
    return None


class Matcher:
    """The patterns of one ignore file, in order."""

    def __init__(self, patterns: Sequence[str | Pattern]) -> None:
        self.patterns = [p if isinstance(p, Pattern) else compile_pattern(p) for p in patterns
                         if isinstance(p, Pattern) or p.strip()]  # fmt: skip

    @property
    def exclusions(self) -> list[Pattern]:
        return [p for p in self.patterns if p.exclusion]

    def matches(self, path: str) -> bool:
        """Whether `path` (relative, with /) is left out: MatchesOrParentMatches, so a pattern that matches
        one of its folders counts as matching it."""
        matched = False
        parent = go_dir(path)
        parents = parent.split("/")
        for pattern in self.patterns:
            if pattern.exclusion != matched:  # cannot change the outcome
                continue
            match = pattern.match(path)
            if not match and parent != ".":
                match = any(pattern.match("/".join(parents[: i + 1])) for i in range(len(parents)))
            if match:
                matched = not pattern.exclusion
        return matched

    def may_bring_back_below(self, folder: str) -> bool:
        """Whether an exception could put back something below a left-out `folder`, so it must be walked.
        Errs on the side of walking: a `**` or a component that might match counts."""
        parts = folder.split("/")
        for pattern in self.exclusions:
            for own, theirs in zip(parts, pattern.dirs, strict=False):  # as deep as both go
                if "**" in theirs:
                    return True
                try:
                    if not compile_pattern(theirs).match(own):
                        break
                except BadPattern:
                    return True
            else:
                return True
        return False


def walk(
    root: str | Path, matcher: Matcher, *, skip: Callable[[os.DirEntry[str]], bool] = lambda entry: False
) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """(relative path with /, entry) of every file, symlink or other non-folder under `root` that `matcher`
    keeps, in sorted order; symlinks are never followed. `skip(entry)`: leave out a path (and all below it)
    whatever the patterns say."""

    def visit(relative_dir: str) -> Iterator[tuple[str, os.DirEntry[str]]]:
        with os.scandir(os.path.join(root, relative_dir)) as entries:
            found = sorted(entries, key=lambda e: e.name)
        for entry in found:
            relative = f"{relative_dir}/{entry.name}" if relative_dir else entry.name
            if skip(entry):
                continue
            if entry.is_dir(follow_symlinks=False):
                if not matcher.matches(relative) or matcher.may_bring_back_below(relative):
                    yield from visit(relative)
            elif not matcher.matches(relative):
                yield relative, entry

    return visit("")
