"""Named points where the fault-injection tests pause a real run, so they can kill it exactly there.

A kill that must land "inside a row's write" or "while the pictures are drawn" cannot be timed from outside
reliably. With `ATTNPROF_PAUSE_AT=POINT[,POINT…]` (a point as `POINT#N`: the N-th time the run gets there) the run
prints one line, `attnprof: paused at POINT (pid P)`, to stderr and sleeps there, then goes on doing exactly what
it does without the variable. The sleep ends after `ATTNPROF_PAUSE_S` seconds (default 30), at once on SIGUSR1
(the test says "go on"), or when a SIGTERM is held until the step ends. The points:

- `open`: `bench` has read its flags and built its grid; its output is not yet locked or looked at;
- `row-write`: inside one row's append to `results.jsonl`, its first half written and `fsync`ed (what a kill or a
  power loss in the middle of the write leaves on disk);
- `commit`: a sweep's rows all written, its folder not yet under `--out`;
- `pictures`: `attnprof report` has read the rows and is about to draw.

Without the variable (always, outside the tests) `pause_at` only reads the environment.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from attnprof.interrupts import held

POINTS = ("open", "row-write", "commit", "pictures")
_seen: dict[str, int] = {}


def armed(point: str) -> bool:
    """Whether this arrival at `point` is one `ATTNPROF_PAUSE_AT` names (counts the arrival)."""
    spec = os.environ.get("ATTNPROF_PAUSE_AT")
    if not spec:
        return False
    _seen[point] = _seen.get(point, 0) + 1
    for item in spec.split(","):
        name, _, nth = item.strip().partition("#")
        if name == point and _seen[point] == (int(nth) if nth.isdigit() else 1):
            return True
    return False


def pause(point: str) -> None:
    """Say where, then sleep until told to go on (the test may kill the process meanwhile)."""
    go: list[int] = []
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: go.append(signum))
    try:
        print(f"attnprof: paused at {point} (pid {os.getpid()})", file=sys.stderr, flush=True)
        end = time.monotonic() + float(os.environ.get("ATTNPROF_PAUSE_S", "30"))
        while time.monotonic() < end and not go and not held():
            time.sleep(0.01)
    finally:
        signal.signal(signal.SIGUSR1, before)


def pause_at(point: str) -> None:
    if armed(point):
        pause(point)
