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
    try:
        return int(args.handler(args) or 0)
    except UsageError as exc:
        print(f"attnprof: error: {exc}", file=sys.stderr)
        return UsageError.exit_code
    except CheckFailed as exc:
        print(f"attnprof: check failed: {exc}", file=sys.stderr)
        return CheckFailed.exit_code
    except KeyboardInterrupt:
        print("attnprof: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
