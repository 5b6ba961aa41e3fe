"""Read what C++ code prints on file descriptor 2 during a block: Python's `warnings` never sees it.

Two things need this. Kineto prints `USDT: … profiler_start` chatter at every profiler start and stop. And
`torch.backends.cuda.can_use_*(params, debug=True)` is a pybind function with no Python warning handler around
it, so PyTorch's `TORCH_WARN` reasons ("Flash attention requires … head dim less than or equal to 256") go
through c10's default handler straight to stderr instead of to `warnings`.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
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
