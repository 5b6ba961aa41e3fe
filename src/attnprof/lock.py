"""One writer per output: a second run into the same `--out` is refused while the first one lives.

Two sweeps appending to one `results.jsonl` would interleave their rows and each redo the other's cells; two new
sweeps would each rename their folder onto the same name. So a run that writes an output first takes its lock:
`.NAME.lock` beside it (inside it, when the output is an existing folder whose parent we may not write). The lock
is an exclusive `flock` on that file, which the kernel drops when the process dies however it dies, and the file
holds the holder's pid, host and start time for the message. A lock file nobody holds is a run that was killed:
it is taken over, with a note naming the pid that left it.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

from attnprof.errors import UsageError

try:
    import fcntl
except ImportError:  # Windows: no flock; a run goes on unlocked and says so
    fcntl = None


def make_parents(path: Path, made: list[Path]) -> None:
    """Create the folders missing above `path`, outermost first, appending each to `made` as it is made (so a caller
    whose later step fails removes exactly what it created, also when a mkdir here is what failed)."""
    missing = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for folder in reversed(missing):
        folder.mkdir()
        made.append(folder)


def lock_path(output: Path) -> Path:
    output = Path(os.path.realpath(output))
    if output.is_dir() and not os.access(output.parent, os.W_OK):
        return output / ".attnprof.lock"
    return output.parent / f".{output.name}.lock"


@dataclass
class OutputLock:
    """Held from `acquire()` to `release()`. `note`: what acquiring it found (a stale lock taken over), or None."""

    output: Path
    path: Path = field(init=False)
    note: str | None = None
    _fd: int | None = None
    _made: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.path = lock_path(self.output)

    def acquire(self) -> OutputLock:
        if fcntl is None:
            self.note = f"no lock on this platform: nothing stops a second run writing into {self.output}"
            return self
        try:
            make_parents(self.path, self._made)
            while True:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _read(fd) or "pid unknown"
                    os.close(fd)
                    self._remove_made()
                    raise UsageError(f"{self.output} is being written by another attnprof run ({holder}; lock "
                                     f"{self.path}): wait for it to end, or choose another --out") from None
                if _same_file(fd, self.path):
                    break
                os.close(fd)  # the holder removed the file as we opened it: lock the one now there
            left = _read(fd)
            if left:
                self.note = f"took over the lock of an attnprof run that is gone ({left}; {self.path})"
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {platform.node()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                     .encode())
            self._fd = fd
        except OSError as exc:
            self._remove_made()
            raise UsageError(f"cannot lock {self.output} ({self.path}): {exc.strerror or exc}") from None
        return self

    def release(self) -> None:
        """Remove the file while still holding it (a run waiting on it then locks a fresh file), then unlock."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass  # an unwritable folder now: the next run finds the file unheld and takes it over
        os.close(self._fd)
        self._fd = None
        self._remove_made()

    def _remove_made(self) -> None:
        for folder in reversed(self._made):
            try:
                folder.rmdir()  # only when empty: parents made for an output that never appeared
            except OSError:
                break
        self._made.clear()


def _read(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 4096).decode(errors="replace").strip()


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
