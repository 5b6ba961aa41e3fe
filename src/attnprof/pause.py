"""Named points where the fault-injection tests pause a real run, so they can kill it exactly there.

A kill that must land "inside a row's write" or "while the pictures are drawn" cannot be timed from outside
reliably. With `ATTNPROF_PAUSE_AT=POINT` (or `POINT#N`: the N-th time the run gets there) the run prints one line,
`attnprof: paused at POINT (pid P)`, to stderr and sleeps `ATTNPROF_PAUSE_S` seconds (default 30; a SIGTERM held
until the step ends cuts it short) before it goes on, doing exactly what it does without the variable. The points:

- `row-write`: inside one row's append to `results.jsonl`, its first half written and `fsync`ed (what a kill or a
  power loss in the middle of the write leaves on disk);
- `commit`: a sweep's rows all written, its folder not yet under `--out`;
- `pictures`: `attnprof report` has read the rows and is about to draw.

Without the variable (always, outside the tests) `pause_at` only reads the environment.
"""

from __future__ import annotations

import os
import sys
import time

from attnprof.interrupts import held

POINTS = ("row-write", "commit", "pictures")
_seen: dict[str, int] = {}


def armed(point: str) -> bool:
    """Whether this arrival at `point` is the one `ATTNPROF_PAUSE_AT` names (counts the arrival)."""
    spec = os.environ.get("ATTNPROF_PAUSE_AT")
    if not spec:
        return False
    name, _, nth = spec.partition("#")
    if name != point:
        return False
    _seen[point] = _seen.get(point, 0) + 1
    return _seen[point] == (int(nth) if nth.isdigit() else 1)


def pause() -> None:
    """Say where, then sleep (the test kills the process meanwhile)."""
    point = os.environ.get("ATTNPROF_PAUSE_AT", "")
    print(f"attnprof: paused at {point} (pid {os.getpid()})", file=sys.stderr, flush=True)
    end = time.monotonic() + float(os.environ.get("ATTNPROF_PAUSE_S", "30"))
    while time.monotonic() < end and not held():  # a SIGTERM held by a critical step ends the pause
        time.sleep(0.02)


def pause_at(point: str) -> None:
    if armed(point):
        pause()
