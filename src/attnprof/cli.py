"""`attnprof`: a thin argparse front. Each subcommand lives in `attnprof.commands.<name>` with `register(sub)`.

Exit codes: 0 fine, 1 a check the user asked for failed (`CheckFailed`), 2 bad input (`UsageError`): one line on
stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from attnprof.errors import CheckFailed, UsageError

# One module per subcommand, in the order `--help` lists them.
COMMANDS = ("stages", "variants", "audit", "trace", "ceilings", "bench", "compare", "report", "serve", "verify")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (`attnprof stages: error: ...`) and exit 2, not a usage block."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message.splitlines()[0] if message else message} "
                     f"(see {self.prog} --help)\n")


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
    from attnprof.files import finish_folders

    try:
        code = int(args.handler(args) or 0)
        finish_folders(ok=True)  # a report folder is complete only now: renamed from its temporary name
        return code
    except UsageError as exc:
        finish_folders(ok=False)  # bad input: no folder is left behind
        print(f"attnprof: error: {exc}", file=sys.stderr)
        return UsageError.exit_code
    except CheckFailed as exc:
        finish_folders(ok=True)  # the report was written before the check failed; it is the evidence
        print(f"attnprof: check failed: {exc}", file=sys.stderr)
        return CheckFailed.exit_code
    except KeyboardInterrupt:
        kept = finish_folders(ok=False, interrupted=True)
        print("attnprof: interrupted" + "".join(f"; partial results kept in {p} (marked INCOMPLETE)" for p in kept),
              file=sys.stderr)
        return 130
    except BaseException:
        finish_folders(ok=False)  # our bug: the traceback stays, the half-written folder does not
        raise


if __name__ == "__main__":
    sys.exit(main())
