"""Result files that are never half-written: write to a temporary name in the same folder, then rename.

A crash, an interrupt or a full disk leaves either the whole file or none of it; a file that cannot be written
or read is one clear `UsageError` naming it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from attnprof.errors import UsageError


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
    """

    def __init__(self, final: Path, *, keep_partial: bool = False, in_place: bool = False):
        self.final = Path(final)
        if self.final.name in ("", ".", ".."):  # `--out .`: a named folder, so a sibling can be made beside it
            self.final = Path(os.path.abspath(self.final))
        self.keep_partial = keep_partial
        self.made_parents: list[Path] = []
        if self.final.exists() and not self.final.is_dir():
            raise UsageError(f"--out {self.final} exists and is not a folder")
        # in place: a sweep that resumes, or an existing folder whose parent we may not write a sibling into
        self.in_place = self.final.is_dir() and (in_place or not os.access(self.final.parent, os.W_OK))
        self.forced_in_place = self.in_place and not in_place  # nothing there can be undone: a failure stays marked
        parent = self.final.parent
        missing = []
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        if not os.access(parent, os.W_OK) or (self.final.is_dir() and not os.access(self.final, os.W_OK)):
            raise UsageError(f"report folder {self.final} is not writable")
        try:
            for folder in reversed(missing):
                folder.mkdir()
                self.made_parents.append(folder)
            if self.in_place:
                self.work = self.final
                self.was_incomplete = (self.final / INCOMPLETE).exists()
                (self.final / INCOMPLETE).write_text(_incomplete_text("is running"))
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

    def commit(self) -> Path:
        """Everything written: the folder appears under its name (entries replace those of an existing folder)."""
        if self.done:
            return self.final
        self.done = True
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

    def _remove_parents(self) -> None:
        for folder in reversed(self.made_parents):
            try:
                folder.rmdir()  # only when empty
            except OSError:
                break


def _incomplete_text(state: str) -> str:
    return (f"This attnprof run {state}: what is here is partial, not a finished result.\n"
            "The file is removed when the run completes (`attnprof bench --resume` continues a sweep).\n")


_open: list[ReportFolder] = []


def open_folder(final: Path, *, keep_partial: bool = False, in_place: bool = False) -> Path:
    """A `ReportFolder` for this command: returns the folder to write into; `commit_folder` (or the CLI, when the
    command ends without an error) completes it, and the CLI removes it on an exit-2 path or an interrupt."""
    folder = ReportFolder(final, keep_partial=keep_partial, in_place=in_place)
    _open.append(folder)
    return folder.work


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
    while _open:
        folder = _open.pop()
        if ok:
            folder.commit()
        else:
            path = folder.abort(interrupted=interrupted)
            if path is not None:
                kept.append(path)
    return kept
