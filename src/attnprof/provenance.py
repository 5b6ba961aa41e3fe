"""Provenance: the block that travels with every number (device, versions, git sha, seed, command line, and the
set environment variables that change attention), so a figure can always say where it came from.

Versions are read from package metadata, never by importing (importing transformers alone costs seconds); the git
sha falls back to `ATTNPROF_GIT_SHA` on machines where `.git` does not travel.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch


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
