"""Result files that are never half-written: write to a temporary name in the same folder, then rename.

A crash, an interrupt or a full disk leaves either the whole file or none of it; a file that cannot be written
or read is one clear `UsageError` naming it.
"""

from __future__ import annotations

import json
import os
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
