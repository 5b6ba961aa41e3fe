"""Read what C++ code prints on file descriptor 2 during a block: Python's `warnings` never sees it; and print our
own one-line errors so that a terminal can read them (`say_error`).

Two things need this. Kineto prints `USDT: … profiler_start` chatter at every profiler start and stop. And
`torch.backends.cuda.can_use_*(params, debug=True)` is a pybind function with no Python warning handler around
it, so PyTorch's `TORCH_WARN` reasons ("Flash attention requires … head dim less than or equal to 256") go
through c10's default handler straight to stderr instead of to `warnings`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator


@contextlib.contextmanager
def capture_fd2() -> Iterator[list[str]]:
    """Lines written to fd 2 inside the block (filled in when the block ends); nothing reaches the terminal."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode(errors="replace").splitlines())


# c10's default handler: "[W1202 12:07:01.123456789 sdp_utils.cpp:123] Warning: <text> (function <name>)"
_C10_WARNING = re.compile(r"^\[W\d{4} [\d:.]+ (?:\d+ )?\S+:\d+\] Warning: (?P<text>.*?)(?: \(function \S+\))?$")


def c10_warnings(lines: list[str]) -> list[str]:
    """The texts of the c10 `TORCH_WARN` lines among `lines`."""
    return [m.group("text").strip() for m in map(_C10_WARNING.match, lines) if m]


# --- third-party noise: known warnings captured (into the report where they say something), not printed raw -------

# (pattern, what it means for a reader of the report — None: nothing, it is dropped)
KNOWN: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (re.compile(r"Cannot get memory breakdown on CPU without psutil"), None),
    (re.compile(r"^(USDT|STAGE):\S+ \S+ \d+:\d+ \S+\.cpp:\d+\]"), None),
    (re.compile(r"Profiler clears events"), None),
    (re.compile(r"Memory block of unknown size was allocated before the profiling started"), None),
    (re.compile(r"Lower right causal bias will produce NaNs"),
     "torch: a lower-right causal bias with Sq > Sk: rows that see no key are NaN"),
    (re.compile(r"recompile_limit|cache_size_limit"),
     "dynamo: recompile limit hit: the function ran unfused from then on"),
    (re.compile(r"flex_attention called without torch\.compile"),
     "flex_attention ran without torch.compile: unfused, the scores materialised"),
    (re.compile(r"nanobind: leaked"), None),
)

_captured: dict[str, dict] = {}


def _known(text: str) -> tuple[bool, str | None]:
    for pattern, meaning in KNOWN:
        if pattern.search(text):
            return True, meaning
    return False, None


def _record(source: str, text: str, meaning: str | None) -> None:
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")[:300]
    key = meaning or first
    entry = _captured.setdefault(key, {"source": source, "text": first, "meaning": meaning, "count": 0,
                                       "kept": meaning is not None})
    entry["count"] += 1
    if meaning and "function:" in text and "function" not in entry["text"]:
        m = re.search(r"function: '([^']+)'", text)
        if m:
            entry["text"] = f"{first} (function {m.group(1)!r})"


def noise_line(line: str, source: str = "fd2") -> bool:
    """True (and captured) when a line some C++ printed on fd 2 is known third-party noise."""
    known, meaning = _known(line)
    if known:
        _record(source, line, meaning)
    return known


def captured() -> list[dict]:
    """The informative third-party warnings captured so far in this command (for its report), oldest first."""
    return [{k: e[k] for k in ("source", "text", "meaning", "count")} for e in _captured.values() if e["kept"]]


def _noise_record(record) -> bool:
    """True when a log record is known third-party noise (captured once per record, however many handlers)."""
    seen = getattr(record, "_attnprof_noise", None)
    if seen is not None:
        return seen
    try:
        text = record.getMessage()
    except Exception:  # a malformed record is not ours to judge
        return False
    known, meaning = _known(text)
    if known:
        _record(record.name.split(".")[0], text, meaning)
    record._attnprof_noise = known
    return known


@contextlib.contextmanager
def third_party_noise() -> Iterator[None]:
    """Inside: Python warnings and log records that match `KNOWN` are captured (see `captured()`: the informative ones,
    for the report), everything else prints as usual."""
    import logging
    import warnings

    _captured.clear()
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        known, meaning = _known(str(message))
        if known:
            _record(category.__name__, str(message), meaning)
        else:
            shown(message, category, filename, lineno, file, line)

    handle = logging.Handler.handle

    def quiet_handle(self, record):  # every handler, including those torch and transformers add later
        if getattr(self, "attnprof_listener", False):  # attnprof's own listeners (run.recompile_limit_hits) hear all
            return handle(self, record)
        return False if _noise_record(record) else handle(self, record)

    logging.Handler.handle = quiet_handle  # type: ignore[method-assign]
    warnings.showwarning = showwarning
    try:
        yield
    finally:
        warnings.showwarning = shown
        logging.Handler.handle = handle  # type: ignore[method-assign]


def summary_lines(width: int = 80) -> list[str]:
    """The informative captured warnings, one wrapped line each with its count, for the end of a command."""
    import textwrap

    found = captured()
    if not found:
        return []
    out = ["third-party warnings (captured; in the report as third_party_warnings):"]
    for e in found:
        where = re.search(r"\(function '([^']+)'\)", e["text"])
        text = f"{e['count']}× {e['meaning']}" + (f" ({where.group(1)})" if where else "")
        out += textwrap.wrap(text, width, initial_indent="  ", subsequent_indent="    ")
    return out


def silence_exit_chatter() -> None:
    """At exit, Triton's nanobind prints `nanobind: leaked N instances` (after atexit, while the interpreter shuts
    down): point fd 2 elsewhere once everything of ours is written. Only for a real CLI process."""
    import atexit

    def quiet() -> None:
        if "triton" not in sys.modules:
            return
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)

    atexit.register(quiet)  # registered first, so it runs after every handler registered later


# --- our own error lines -------------------------------------------------------------------------------------------

def error_lines(text: str, width: int | None) -> list[str]:
    """An error message as lines of about `width` columns (None: the one line as it is, for a pipe or a log, where
    `grep` and `tail -1` read it whole). The first line keeps the `attnprof: error:` prefix and ends where a clause
    ends ("; ") when one falls in its second half, so it reads as a sentence of its own, else at a word; the rest is
    indented by two. Words longer than the width (paths) are kept whole, so they can be copied."""
    if width is None or len(text) <= width:
        return [text]
    at = text.rfind("; ", width // 2, width)
    cut = at + 1 if at >= 0 else len(textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)[0])
    rest = textwrap.wrap(text[cut:].strip(), width, initial_indent="  ", subsequent_indent="  ",
                         break_long_words=False, break_on_hyphens=False)
    return [text[:cut].rstrip(), *rest]


def terminal_width() -> int | None:
    """stderr's width when it is a terminal (`COLUMNS` wins, as everywhere), else None: a pipe keeps one line."""
    isatty = getattr(sys.stderr, "isatty", None)
    return shutil.get_terminal_size().columns if isatty is not None and isatty() else None


def say_error(text: str) -> None:
    """Print one of our error lines (`attnprof: error: …`) on stderr, wrapped to the terminal when it is one."""
    print("\n".join(error_lines(text, terminal_width())), file=sys.stderr)
