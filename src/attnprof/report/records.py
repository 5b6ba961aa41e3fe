"""Provenance on every number, and files that are never half-written.

Every result file carries `schema` (`attnprof.<command>/<version>`) and a `provenance` block: the device and the
versions that produced it, the git sha, the seed and the command line. Files are written to a temporary name and
renamed into place, so a crash or a full disk never leaves a file that looks complete.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from attnprof.errors import UsageError


@functools.cache
def _git_sha() -> str | None:
    """The checkout's commit (`-dirty` with uncommitted changes), or ATTNPROF_GIT_SHA where there is no .git."""
    if os.environ.get("ATTNPROF_GIT_SHA"):
        return os.environ["ATTNPROF_GIT_SHA"]
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True,
                           text=True, timeout=5, check=False).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def _command_line(argv: list[str] | None) -> list[str]:
    """The command as the user typed it: `attnprof …`, whether run as a script or `python -m attnprof`."""
    args = list(sys.argv if argv is None else argv)
    if args and (args[0].endswith(("__main__.py", "/attnprof")) or args[0] == "attnprof"):
        args[0] = "attnprof"
    return args


def _version(distribution: str) -> str | None:
    """Installed version from package metadata: no import (importing transformers alone costs seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


# Environment variables that change what attention does or how it is timed: recorded whenever set.
_ENV_PREFIXES = ("TORCH_CUDNN", "TORCH_SDPA", "TORCHINDUCTOR_", "PYTORCH_", "TRITON_", "CUDA_LAUNCH_BLOCKING",
                 "CUBLAS_", "NVIDIA_TF32_OVERRIDE", "LOCAL_KERNELS")


def attention_env() -> dict[str, str]:
    """The set environment variables among `_ENV_PREFIXES` (e.g. TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1); cache and
    output folders (`*_DIR`) change no number and are left out."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES) and not k.endswith("_DIR")}


def env_note(prov: dict[str, Any]) -> str:
    """One markdown line naming the recorded environment, or "" when nothing relevant was set."""
    env = prov.get("env") or {}
    return ("Environment: " + ", ".join(f"`{k}={v}`" for k, v in env.items()) + ".") if env else ""


def provenance(device: str, seed: int | None = None, argv: list[str] | None = None) -> dict[str, Any]:
    """The block that travels with every number."""
    cuda = device.startswith("cuda") and torch.cuda.is_available()
    block: dict[str, Any] = {
        "device": device_name(device),
        "device_kind": "cuda" if cuda else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "kernels": _version("kernels"),
        "python": platform.python_version(),
        "git_sha": _git_sha(),
        "seed": seed,
        "argv": _command_line(argv),
        "env": attention_env(),
        "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if cuda:
        props = torch.cuda.get_device_properties(torch.device(device))
        block["compute_capability"] = f"{props.major}.{props.minor}"
        block["sm_count"] = props.multi_processor_count
    return block


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
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "to_json"):
        return value.to_json()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def read_json(path: Path, schema_prefix: str | None = None) -> dict:
    """Read a result file; a missing, unparsable or foreign file is a UsageError naming it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a readable JSON result file ({exc})") from None
    if schema_prefix is not None:
        schema = data.get("schema") if isinstance(data, dict) else None
        if not isinstance(schema, str) or not schema.startswith(schema_prefix):
            raise UsageError(f"{path}: schema {schema!r} is not {schema_prefix}*")
    return data
