"""SIGTERM ends a run the way Ctrl-C does, and neither cuts a row or a rename in half.

`timeout`, SLURM and Kubernetes stop a job with SIGTERM (then SIGKILL after a grace period). Python's default for
SIGTERM is to die on the spot, which leaves a sweep's finished rows in a hidden temporary folder; so the CLI turns
SIGTERM into `Terminated`, a `KeyboardInterrupt`, and every place that handles Ctrl-C (keep the rows, write
`INCOMPLETE`, cancel Ray tasks) handles it too. The CLI exits 130 after Ctrl-C and 143 (128 + 15) after SIGTERM,
the codes a shell gives a process those signals kill.

`critical()` marks the few steps that must not stop half-way (one row's append and `fsync`, a folder's rename, a
lock's hand-over): a signal that arrives inside one is held and raised as soon as the step is done.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """The process got SIGTERM: stop as after Ctrl-C, exit 143."""

    exit_code = 143


_depth = 0  # how many critical() blocks are open in the main thread
_held: list[type[BaseException]] = []  # a signal that arrived inside one, raised when the outermost one ends


def _raise(kind: type[BaseException]) -> None:
    if _depth:
        if not _held:
            _held.append(kind)
        return
    raise kind


def _on_sigterm(signum, frame) -> None:
    _raise(Terminated)


def _on_sigint(signum, frame) -> None:
    _raise(KeyboardInterrupt)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM → `Terminated`, SIGINT → `KeyboardInterrupt`, both held while a `critical()` step runs; the previous
    handlers are back afterwards. Outside the main thread (where handlers cannot be set) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, handler)
              for sig, handler in ((signal.SIGTERM, _on_sigterm), (signal.SIGINT, _on_sigint))}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        _held.clear()


def take_sigterm_back() -> None:
    """Set our SIGTERM handler again: `ray.init` replaces it with `sys.exit(15)`, which would throw a sweep's rows
    away as if it had crashed. A no-op unless `stop_on_signals` is active in the main thread."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is _on_sigint:
        signal.signal(signal.SIGTERM, _on_sigterm)


def held() -> bool:
    """Whether a signal is waiting for the current critical step to end (a pause can cut its sleep short)."""
    return bool(_held)


@contextmanager
def critical() -> Iterator[None]:
    """A step that must finish once begun: SIGTERM / SIGINT inside it are raised when it ends (not inside it)."""
    global _depth
    _depth += 1
    try:
        yield
    except BaseException:
        _depth -= 1
        if not _depth:
            _held.clear()  # the step failed: its own error is what the user sees
        raise
    _depth -= 1
    if not _depth and _held:
        raise _held.pop()()


@contextmanager
def finishing() -> Iterator[None]:
    """The run is ending (its folders being made final): a Ctrl-C or SIGTERM now is dropped, not raised."""
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if not _depth:
            _held.clear()
