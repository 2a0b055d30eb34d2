"""orch's own errors. The CLI turns each into one line on stderr and its `exit_code`; no tracebacks.

Library code raises these (chained `from e` where there is a cause); only `orchestrator.cli` prints them.
"""

from __future__ import annotations

from collections.abc import Sequence


class OrchError(Exception):
    """Base of every error orch reports to a user. `str(error)` is the whole one-line message."""

    exit_code = 1


class SpecError(OrchError):
    """The job file (or a `--set` override) is invalid: `job.yaml:LINE:COL: field.path: what is wrong`.

    `errors` holds every problem found in one pass, in file order (`several`); the error's own attributes
    and `str()` are the first's. The CLI prints one `error:` line for each."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: str = "",
        line: int | None = None,
        column: int | None = None,
        field: str = "",
    ) -> None:
        self.file, self.line, self.column, self.field, self.reason = file, line, column, field, message
        where = file
        if file and line is not None:
            where = f"{file}:{line}" + (f":{column}" if column is not None else "")
        parts = [p for p in (where, field) if p]
        super().__init__(": ".join([*parts, message]))
        self.errors: tuple[SpecError, ...] = (self,)

    @classmethod
    def several(cls, errors: Sequence[SpecError]) -> SpecError:
        """One error to raise for `errors` (at least one): the first, with `errors` listing them all."""
        first = errors[0]
        together = cls(first.reason, file=first.file, line=first.line, column=first.column, field=first.field)
        together.errors = tuple(errors)
        return together


class UsageError(OrchError):
    """A command was called in a way that cannot work (bad flag combination, missing file)."""

    exit_code = 2
