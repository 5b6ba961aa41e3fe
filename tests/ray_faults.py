"""Planted faults for the Ray tests and docs/results/ray/reproduce.sh: user variants (`ray_faults:NAME`) whose process dies.

They take the public user-variant signature `(q, k, v, *, causal, scale)` in `[B, H, S, D]` and compute SDPA when
they do not die. State that must outlive a killed process (which attempt came first, which cells ran) lives in
files under `$ATTNPROF_FAULT_DIR`, which the Ray executor passes on to every worker (it passes `ATTNPROF_*`).

- `die_once`: the first call for a workload ends its own process with `os._exit` (what a segfault, the kernel's
  OOM killer or a CUDA error that aborts does to a worker); every later call, in whatever process, runs.
- `logged`: SDPA that appends `pid seq` to `calls.log` on every call: what a test counts to prove that a resumed
  sweep ran only the cells it had not finished.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch.nn.functional as F


def fault_dir() -> Path:
    path = os.environ.get("ATTNPROF_FAULT_DIR")
    if not path:
        raise RuntimeError("ATTNPROF_FAULT_DIR is not set: the planted faults keep their state there")
    return Path(path)


def _log(name: str, q) -> None:
    with open(fault_dir() / name, "a") as fh:
        fh.write(f"{os.getpid()} {q.shape[2]}\n")


def _sdpa(q, k, v, causal: bool, scale: float):
    # q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D]; the planted tests use Hq == Hkv and Sq == Sk
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def die_once(q, k, v, *, causal: bool, scale: float):
    """SDPA, except that the first call for this workload kills its own process."""
    _log("die_once.log", q)
    marker = fault_dir() / f"died-{'x'.join(map(str, q.shape))}"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # atomic: exactly one caller creates it
    except FileExistsError:
        return _sdpa(q, k, v, causal, scale)
    os.close(fd)
    os._exit(17)


def logged(q, k, v, *, causal: bool, scale: float):
    """SDPA that records each call (process id, sequence length) in calls.log."""
    _log("calls.log", q)
    return _sdpa(q, k, v, causal, scale)
