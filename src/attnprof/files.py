"""Result files that are never half-written: write to a temporary name in the same folder, then rename.

A crash, an interrupt or a full disk leaves either the whole file or none of it; a file that cannot be written
or read is one clear `UsageError` naming it.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from attnprof.errors import UsageError
from attnprof.interrupts import critical, finishing
from attnprof.lock import OutputLock, make_parents


def write_atomic(path: Path, text: str | bytes) -> Path:
    """Write to a temporary file in the same folder, then rename: readers see all of it or none of it."""
    path = Path(path)
    mode = "wb" if isinstance(text, bytes) else "w"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
        try:
            with os.fdopen(fd, mode) as fh:
                fh.write(text)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a report is as readable as any file the user makes
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def write_json(path: Path, obj: Any) -> Path:
    return write_atomic(path, json.dumps(obj, indent=2, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path) or type(value).__module__ == "torch":  # torch.dtype, torch.device
        return str(value)
    if hasattr(value, "to_json"):
        return value.to_json()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def read_json(path: Path, schema_prefix: str | None = None, *, what: str = "JSON result file",
              missing: str = "file") -> Any:
    """Read a JSON file (a result file unless `what` says otherwise); a missing ("no such `missing`") or unparsable
    file, or one of another schema than `schema_prefix`, is a UsageError naming it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such {missing}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a readable {what} ({exc})") from None
    if schema_prefix is not None:
        schema = data.get("schema") if isinstance(data, dict) else None
        if not isinstance(schema, str) or not schema.startswith(schema_prefix):
            raise UsageError(f"{path}: schema {schema!r} is not {schema_prefix}*")
    return data


# --- report folders: made only when there is something to write, completed by one rename ---------------------------

INCOMPLETE = "INCOMPLETE"  # the file an interrupted run leaves in a folder it keeps


class ReportFolder:
    """A report folder built under a hidden temporary name beside `final` and renamed to `final` at the end.

    Nothing appears under `final` until `commit()`: an exit-2 path or a crash leaves no folder (parents this made,
    such as the default `attnprof-report/`, are removed again when empty). `keep_partial` keeps the work of an
    interrupted run (bench rows, serve's partial rows) under `final`, with an `INCOMPLETE` file that says so;
    otherwise an interrupted run leaves nothing. `in_place`: when `final` already exists, work in it (a sweep that
    `--resume` appends to), with the `INCOMPLETE` file there until `commit()`.

    `rows`: the file of finished rows (bench: `results.jsonl`). Such a folder is locked for this run (a second run
    into it is refused, see `attnprof.lock`), and once that file holds anything it is never deleted: a run that
    fails leaves it as a SIGKILL does, under its hidden name. `resume`: when `final` does not exist, continue in the
    hidden folder a killed run left (`.NAME.XXXX.part` holding `rows`); without it, such a folder holding rows is
    refused (exit 2) rather than silently started over. A command with no `--resume` (`resumable=False`: serve's
    partial rows) brings such a folder into view instead, as `NAME.killed-YYYYmmdd-HHMMSS` marked `INCOMPLETE`, and
    starts anew. `notes` says what was found and done.
    """

    def __init__(self, final: Path, *, keep_partial: bool = False, in_place: bool = False, rows: str | None = None,
                 resume: bool = False, resumable: bool = True):
        self.final = Path(final)
        if self.final.name in ("", ".", ".."):  # `--out .`: a named folder, so a sibling can be made beside it
            self.final = Path(os.path.abspath(self.final))
        self.keep_partial = keep_partial
        self.made_parents: list[Path] = []
        self.rows = rows
        self.resumable = resumable
        self.notes: list[str] = []
        if self.final.exists() and not self.final.is_dir():
            raise UsageError(f"--out {self.final} exists and is not a folder")
        parent = self.final.parent
        while not parent.exists():
            parent = parent.parent
        if not os.access(parent, os.W_OK) or (self.final.is_dir() and not os.access(self.final, os.W_OK)):
            raise UsageError(f"report folder {self.final} is not writable")
        adopt = None
        if rows is not None:
            lock = lock_output(self.final)  # before anything is looked at: the folder is this run's from here
            if lock.note:
                self.notes.append(lock.note)
            if (self.final / rows).is_file():  # and its rows file, which `bench --results DIR/FILE` locks by name
                lock_output(self.final / rows)
            adopt = self._partial_to_continue(resume)
        # in place: a sweep that resumes, or an existing folder whose parent we may not write a sibling into
        self.in_place = self.final.is_dir() and (in_place or not os.access(self.final.parent, os.W_OK))
        self.forced_in_place = self.in_place and not in_place  # nothing there can be undone: a failure stays marked
        try:
            make_parents(self.final, self.made_parents)
            if self.in_place:
                self.work = self.final
                self.was_incomplete = (self.final / INCOMPLETE).exists()
                (self.final / INCOMPLETE).write_text(_incomplete_text("is running"))
            elif adopt is not None:
                self.work = adopt
            else:
                self.work = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.", suffix=".part",
                                                  dir=self.final.parent))
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(self.work, 0o777 & ~umask)  # mkdtemp makes 0700; a report folder is as open as any other
        except OSError as exc:
            self._remove_parents()
            raise UsageError(f"cannot create report folder {self.final}: {exc.strerror or exc}") from None
        self.done = False

    def _partial_to_continue(self, resume: bool) -> Path | None:
        """The hidden folder of a killed run to continue (with `resume`, when `final` does not exist yet); hidden
        folders that hold no row are removed, being this output's under its lock."""
        found = partial_folders(self.final, self.rows)
        with_rows = [p for p in found if (p / self.rows).stat().st_size > 0]
        if not self.resumable:
            for killed in with_rows:
                try:
                    shown = _reveal(killed, self.final)
                except OSError as exc:
                    raise UsageError(f"{killed} holds the rows of a killed run into {self.final} and cannot be moved "
                                     f"into view ({exc.strerror or exc}): move or remove it") from None
                self.notes.append(f"kept the rows of a killed run into {self.final}: {shown}")
            found = [p for p in found if p not in with_rows]
            with_rows = []
        elif self.final.exists():
            if with_rows:
                self.notes.append(f"{', '.join(map(str, with_rows))}: rows of a killed run into {self.final}, left "
                                  f"alone because {self.final} exists (merge or remove them by hand)")
            return None
        if len(with_rows) > 1:
            raise UsageError(f"{len(with_rows)} killed runs into {self.final} left rows ({', '.join(map(str, with_rows))}"
                             "): keep the one to continue, remove the others, then add --resume")
        if with_rows and not resume:
            raise UsageError(f"{with_rows[0]} holds the rows of a killed run into {self.final}: add --resume to "
                             "continue it, or remove that folder to start over")
        for empty in (p for p in found if p not in with_rows):
            shutil.rmtree(empty, ignore_errors=True)
            self.notes.append(f"removed {empty}: a killed run's folder that held no rows yet")
        if not with_rows:
            return None
        self.notes.append(f"--resume: continuing the run that was killed before {self.final} appeared "
                          f"({with_rows[0].name})")
        return with_rows[0]

    def commit(self) -> Path:
        """Everything written: the folder appears under its name (entries replace those of an existing folder)."""
        if self.done:
            return self.final
        self.done = True
        with critical():  # a SIGTERM now waits until the folder is whole under its name
            return self._commit()

    def _commit(self) -> Path:
        try:
            if self.in_place:
                (self.final / INCOMPLETE).unlink(missing_ok=True)
            elif not any(self.work.iterdir()):
                self.work.rmdir()  # nothing was written: no folder
                self._remove_parents()
            elif not self.final.exists():
                os.replace(self.work, self.final)
            else:
                if not (self.work / INCOMPLETE).exists():
                    (self.final / INCOMPLETE).unlink(missing_ok=True)
                for entry in sorted(self.work.iterdir()):
                    target = self.final / entry.name
                    if target.is_dir() and not target.is_symlink():
                        shutil.rmtree(target)
                    os.replace(entry, target)
                self.work.rmdir()
        except OSError as exc:
            raise UsageError(f"cannot complete report folder {self.final}: {exc.strerror or exc}") from None
        return self.final

    def abort(self, *, interrupted: bool) -> Path | None:
        """The run did not finish. An interrupted `keep_partial` run with something written is kept under `final`
        with an `INCOMPLETE` file (returned); anything else is removed."""
        if self.done:
            return None
        self.done = True
        keep = interrupted and self.keep_partial
        if not keep and not self.in_place and self.rows is not None and self._holds_rows():
            return None  # finished rows are never deleted: left where `--resume` finds them, as after a SIGKILL
        if self.in_place:
            if keep or self.was_incomplete or self.forced_in_place:
                (self.final / INCOMPLETE).write_text(_incomplete_text("did not finish"))
                return self.final if keep else None
            (self.final / INCOMPLETE).unlink(missing_ok=True)
            return None
        if keep and any(self.work.iterdir()):
            (self.work / INCOMPLETE).write_text(_incomplete_text("did not finish (it was interrupted)"))
            self.done = False
            return self.commit()  # under its name (merged into an existing folder), marked INCOMPLETE
        shutil.rmtree(self.work, ignore_errors=True)
        self._remove_parents()
        return None

    def _holds_rows(self) -> bool:
        path = self.work / self.rows
        return path.is_file() and path.stat().st_size > 0

    def _remove_parents(self) -> None:
        for folder in reversed(self.made_parents):
            try:
                folder.rmdir()  # only when empty
            except OSError:
                break


def _reveal(killed: Path, final: Path) -> Path:
    """Rename a killed run's hidden folder to `FINAL.killed-<its last write>` (marked INCOMPLETE); the new path."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(killed.stat().st_mtime))
    target, n = final.parent / f"{final.name}.killed-{stamp}", 1
    while target.exists():
        n += 1
        target = final.parent / f"{final.name}.killed-{stamp}-{n}"
    (killed / INCOMPLETE).write_text("This attnprof run was killed before it finished: what is here is partial, not a "
                                     "finished result.\n")
    killed.rename(target)
    return target


def _incomplete_text(state: str) -> str:
    return (f"This attnprof run {state}: what is here is partial, not a finished result.\n"
            "The file is removed when the run completes (`attnprof bench --resume` continues a sweep).\n")


def partial_folders(final: Path, rows: str) -> list[Path]:
    """The hidden work folders (`.NAME.XXXX.part` beside `final`) that hold a `rows` file: runs that were killed
    before their folder appeared under its name. Oldest first."""
    final = Path(os.path.abspath(final))
    if not final.parent.is_dir():
        return []
    own = re.compile(rf"\.{re.escape(final.name)}\.[a-z0-9_]{{8}}\.part")  # mkdtemp's 8 characters: not `.k.v2.….part`
    found = [p for p in final.parent.glob(f".{glob.escape(final.name)}.*.part")
             if own.fullmatch(p.name) and (p / rows).is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime)


_open: list[ReportFolder] = []
_locks: list[OutputLock] = []


def lock_output(output: Path) -> OutputLock:
    """Lock `output` (a folder or a results file) for this command; released when the command ends. Another live
    run holding it is a UsageError; a lock left by a killed run is taken over (`.note` says so)."""
    lock = OutputLock(Path(output)).acquire()
    _locks.append(lock)
    return lock


def open_folder(final: Path, *, keep_partial: bool = False, in_place: bool = False, rows: str | None = None,
                resume: bool = False, resumable: bool = True) -> Path:
    """A `ReportFolder` for this command: returns the folder to write into; `commit_folder` (or the CLI, when the
    command ends without an error) completes it, and the CLI removes it on an exit-2 path or an interrupt."""
    folder = ReportFolder(final, keep_partial=keep_partial, in_place=in_place, rows=rows, resume=resume,
                          resumable=resumable)
    _open.append(folder)
    return folder.work


def folder_notes(work: Path) -> list[str]:
    """What opening the folder `work` found: a stale lock taken over, a killed run's rows continued or refused."""
    return [n for folder in _open if folder.work == Path(work) for n in folder.notes]


def commit_folder(work: Path) -> Path:
    """Complete the folder opened as `work`; its final path (a path not opened here is returned as it is)."""
    for folder in _open:
        if folder.work == Path(work):
            return folder.commit()
    return Path(work)


def final_path(work: Path) -> Path:
    """The name `work` will have once complete (for messages printed before the end)."""
    for folder in _open:
        if folder.work == Path(work):
            return folder.final
    return Path(work)


def finish_folders(*, ok: bool, interrupted: bool = False) -> list[Path]:
    """End of a command: commit every open folder when `ok`, else abort them; the folders kept as INCOMPLETE."""
    kept = []
    with finishing():  # a second Ctrl-C or SIGTERM now changes nothing: the folders are being made final
        try:
            while _open:
                folder = _open.pop()
                if ok:
                    folder.commit()
                else:
                    path = folder.abort(interrupted=interrupted)
                    if path is not None:
                        kept.append(path)
        finally:
            while _locks:
                _locks.pop().release()  # after the folders are final: the next run sees them as they will stay
    return kept
