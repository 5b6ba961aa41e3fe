"""The two ways a command ends badly, and their exit codes.

`UsageError` is the user's input (a bad shape, an unknown name, a missing device, an unwritable folder): one
line, exit 2. `CheckFailed` is a check the user asked for that did not hold (a forbidden fallback, numbers that
disagree, a regression): exit 1. Anything else is our bug and keeps its traceback.

`VariantFailed` is neither: a variant that ran and misbehaved (returned `None` or the wrong shape, called
`sys.exit`). It is that variant's `error` row with the reason, like any exception it raises, and the run goes on.
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user. The CLI prints `attnprof: error: <message>` and exits 2."""

    exit_code = 2


class VariantFailed(RuntimeError):
    """A variant ran and gave no usable output (wrong shape, None, `sys.exit`): its row is `error`, the run goes on."""


class CheckFailed(Exception):
    """A requested check did not hold. The CLI prints the message and exits 1."""

    exit_code = 1


def first_line(exc: BaseException | str, *, lines: int = 1, typed: bool = True) -> str:
    """An exception in one line: `Type: the first non-empty line of its message` (`Type` alone when it is empty).

    `lines` > 1 joins that many non-empty lines with "; " (multi-line messages such as a metadata parser's);
    `typed=False` leaves the type out. The one way every row, refusal and note quotes an exception.
    """
    said = "; ".join([line.strip() for line in str(exc).splitlines() if line.strip()][:lines])
    name = type(exc).__name__ if isinstance(exc, BaseException) else ""
    if typed and name:
        return f"{name}: {said}" if said else name
    return said or name
