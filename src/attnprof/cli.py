"""`attnprof`: a thin argparse front. Each subcommand lives in `attnprof.commands.<name>` with `register(sub)`.

Exit codes: 0 fine, 1 a check the user asked for failed (`CheckFailed`), 2 bad input (`UsageError`): one line on
stderr (wrapped to the terminal's width when stderr is one: `stderr.say_error`), never a traceback; 130
after Ctrl-C, 143 after SIGTERM (partial results kept as the command documents).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from attnprof.errors import CheckFailed, UsageError
from attnprof.interrupts import Terminated
from attnprof.stderr import say_error

# One module per subcommand, in the order `--help` lists them.
COMMANDS = ("stages", "variants", "audit", "trace", "ceilings", "bench", "compare", "report", "serve", "verify")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (`attnprof stages: error: ...`) and exit 2, not a usage block."""

    def error(self, message: str):  # type: ignore[override]
        say_error(f"{self.prog}: error: {message.splitlines()[0] if message else message} (see {self.prog} --help)")
        self.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="attnprof", description="What your attention layers really do on the GPU.")
    parser.add_argument("--version", action="version", version=f"attnprof {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"attnprof.commands.{name}").register(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnprof")
    except PackageNotFoundError:
        return "0+unknown"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from attnprof.interrupts import stop_on_signals
    from attnprof.stderr import silence_exit_chatter

    if argv is None:
        silence_exit_chatter()  # a real process: no `nanobind: leaked …` after our last line
    with stop_on_signals():  # SIGTERM (timeout, SLURM, Kubernetes) stops a run as Ctrl-C does
        return _main(args)


def _main(args) -> int:
    from attnprof.files import finish_folders

    try:
        _check_lists(args)
        code = _handle(args)
        finish_folders(ok=True)  # a report folder is complete only now: renamed from its temporary name
        return code
    except UsageError as exc:
        finish_folders(ok=False)  # bad input: no folder is left behind
        say_error(f"attnprof: error: {exc}")
        return UsageError.exit_code
    except CheckFailed as exc:
        finish_folders(ok=True)  # the report was written before the check failed; it is the evidence
        say_error(f"attnprof: check failed: {exc}")
        return CheckFailed.exit_code
    except KeyboardInterrupt as exc:
        kept = finish_folders(ok=False, interrupted=True)
        how = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        print(f"attnprof: {how}" + "".join(f"; partial results kept in {p} (marked INCOMPLETE)" for p in kept),
              file=sys.stderr)
        return Terminated.exit_code if isinstance(exc, Terminated) else 130
    except BaseException:
        finish_folders(ok=False)  # our bug: the traceback stays, the half-written folder does not
        raise


def _check_lists(args: argparse.Namespace) -> None:
    """`--variants ""` or `--impls ""` (an unset shell variable, mostly) names nothing: one line and exit 2, never
    the defaults, which only leaving the flag out asks for."""
    for dest in ("variants", "impls"):
        value = getattr(args, dest, None)
        if value is not None and not value.replace(",", " ").strip():
            where = "attnprof variants" if dest == "variants" else f"attnprof {args.command} --help"
            raise UsageError(f"--{dest} {value!r} names nothing: leave the flag out for the defaults, or name at "
                             f"least one (`{where}` lists them)")


def _handle(args) -> int:
    """The command, with known third-party warnings captured (the informative ones summed up at the end, and in
    the report of the commands that write one) instead of printed raw."""
    from attnprof.stderr import summary_lines, third_party_noise

    try:
        with third_party_noise():
            return int(args.handler(args) or 0)
    finally:
        for line in summary_lines():
            print(line, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
