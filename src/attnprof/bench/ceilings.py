"""This machine's own limits: the matmul rate and the copy bandwidth it really reaches, measured, never guessed.

A datasheet peak is a promise made under conditions nobody runs at (boost clocks, sparsity, an ideal tile). So
every "% of peak" this tool prints is against what *this* device measured: a large square matmul per dtype (FP8
too, where the GPU has FP8 tensor cores) and a large device-to-device copy, each on buffers rotated between
repetitions (so no rep is served from cache), median of many. The result is cached per device name and software
versions (a new driver or torch can move both), in `$ATTNPROF_CACHE_DIR` or `$XDG_CACHE_HOME/attnprof`
(`~/.cache/attnprof`). A device with no cached measurement has *unknown* ceilings: commands print "unknown", never a
number from a table.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnprof.errors import UsageError, first_line
from attnprof.files import write_json
from attnprof.measure.timing import time_call
from attnprof.provenance import device_name, provenance
from attnprof.workload import DTYPES

SCHEMA = "attnprof.ceilings/1"

# Square matmul side per dtype and copy size per device kind: large enough to reach the plateau, small enough to be
# quick (a CPU without bf16/fp16 units runs those matmuls ~100x slower than fp32, hence the smaller side there).
# No fp8 side on the CPU: it is refused there before any size is read (`fp8_refusal`).
SIZES = {"cuda": {"matmul": {"bf16": 8192, "fp16": 8192, "fp32": 8192, "fp8": 8192}, "copy_mib": 1024},
         "cpu": {"matmul": {"bf16": 512, "fp16": 512, "fp32": 1024}, "copy_mib": 64}}
ROTATE = 3  # buffer sets cycled between repetitions
MATMUL_DTYPES = ("bf16", "fp16", "fp32", "fp8")  # fp8: e4m3 × e4m3 → bf16 through torch._scaled_mm
FP8_CAPABILITY = (8, 9)  # Ada and Hopper (9.0) onwards: the first GPUs with FP8 tensor cores
FP8_METHOD = ("e4m3 × e4m3 → bf16 through torch._scaled_mm, per-tensor scales 1.0, fp32 accumulation "
              "(use_fast_accum off), the second operand column-major as cuBLASLt needs")


@dataclass(frozen=True)
class Ceilings:
    """Measured limits of one device under one software stack."""

    device: str
    key: str
    matmul_tflops: dict[str, float]  # dtype name → TFLOP/s of a large square matmul
    copy_gbps: float | None  # bytes read + written per second / 1e9
    unknown: dict[str, str] = field(default_factory=dict)  # what could not be measured, and why
    method: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    def matmul(self, dtype: str) -> float | None:
        return self.matmul_tflops.get(dtype)

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "device": self.device, "key": self.key, "matmul_tflops": self.matmul_tflops,
                "copy_gbps": self.copy_gbps, "unknown": self.unknown, "method": self.method,
                "provenance": self.provenance}

    @classmethod
    def from_json(cls, d: dict) -> Ceilings:
        return cls(device=d["device"], key=d["key"], matmul_tflops=dict(d.get("matmul_tflops") or {}),
                   copy_gbps=d.get("copy_gbps"), unknown=dict(d.get("unknown") or {}),
                   method=dict(d.get("method") or {}), provenance=dict(d.get("provenance") or {}))


def cache_path() -> Path:
    """`$ATTNPROF_CACHE_DIR/ceilings.json`, else `$XDG_CACHE_HOME/attnprof/ceilings.json` (~/.cache by default)."""
    if os.environ.get("ATTNPROF_CACHE_DIR"):
        return Path(os.environ["ATTNPROF_CACHE_DIR"]) / "ceilings.json"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attnprof" / "ceilings.json"


def cache_key(device: str) -> str:
    """Device name and the software that decides its speed: a new torch or CUDA is a new measurement."""
    cuda = device.startswith("cuda")
    parts = [device_name(device), f"torch {torch.__version__}"]
    if cuda:
        parts += [f"cuda {torch.version.cuda}", f"cudnn {torch.backends.cudnn.version()}"]
    else:
        parts.append(f"threads {torch.get_num_threads()}")
    return " | ".join(parts)


def _read_cache(path: Path) -> dict[str, dict]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"ceilings cache {path} is unreadable ({exc}); delete it and run `attnprof ceilings`") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise UsageError(f"ceilings cache {path} has schema {data.get('schema') if isinstance(data, dict) else None!r}, "
                         f"not {SCHEMA}; delete it and run `attnprof ceilings`")
    return dict(data.get("entries") or {})


def get_ceilings(device: str, measure: bool = False) -> Ceilings | None:
    """The cached ceilings of `device` under this software, measuring them first when `measure`; else None."""
    path = cache_path()
    key = cache_key(device)
    entry = _read_cache(path).get(key)
    if entry is not None and not measure:
        return Ceilings.from_json(entry)
    if not measure:
        return None
    found = measure_ceilings(device)
    store(found)
    return found


def store(ceilings: Ceilings) -> Path:
    """Add or replace this device's entry in the cache file (atomically)."""
    path = cache_path()
    entries = _read_cache(path)
    entries[ceilings.key] = ceilings.to_json()
    return write_json(path, {"schema": SCHEMA, "entries": entries})


def fp8_refusal(device: str) -> str | None:
    """Why no FP8 matmul ceiling can be measured on `device`, or None when it can. Decided from the device, before
    any fp8 work: the CPU's `torch._scaled_mm` is a slow emulation (no rate of FP8 hardware, and seconds to find out),
    and a GPU older than 8.9 has no FP8 tensor cores for it to reach."""
    if not device.startswith("cuda"):
        return f"FP8 matmul needs a CUDA GPU of compute capability 8.9 or newer (torch._scaled_mm); this is {device}"
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"FP8 matmul needs torch._scaled_mm and torch.float8_e4m3fn; torch {torch.__version__} lacks them"
    major, minor = torch.cuda.get_device_capability(torch.device(device))
    if (major, minor) < FP8_CAPABILITY:
        return (f"FP8 matmul needs a CUDA GPU of compute capability 8.9 or newer (torch._scaled_mm); "
                f"this one is {major}.{minor}")
    return None


def measure_matmul(device: str, dtype: str, n: int, *, reps: int, warmup: int) -> float:
    """TFLOP/s of `n×n @ n×n` (2·n³ FLOPs), median over `reps`, cycling `ROTATE` input pairs. `fp8` is `FP8_METHOD`
    (`fp8_refusal` says where that cannot run; this does not ask, it tries)."""
    # random normal, made on the device (zeros would draw less power and flatter the clock)
    if dtype == "fp8":
        e4m3, one = torch.float8_e4m3fn, torch.tensor(1.0, device=device)
        # b = x.t() of a contiguous x: the column-major second operand _scaled_mm takes
        pairs = [(torch.randn(n, n, device=device).to(e4m3), torch.randn(n, n, device=device).to(e4m3).t())
                 for _ in range(ROTATE)]
        outs = [torch.empty(n, n, dtype=torch.bfloat16, device=device) for _ in range(ROTATE)]

        def mul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
            torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=False, out=out)
    else:
        dt = DTYPES[dtype]
        pairs = [(torch.randn(n, n, device=device, dtype=dt), torch.randn(n, n, device=device, dtype=dt))
                 for _ in range(ROTATE)]
        outs = [torch.empty(n, n, dtype=dt, device=device) for _ in range(ROTATE)]

        def mul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
            torch.matmul(a, b, out=out)
    step = [0]

    def call() -> None:
        i = step[0] % ROTATE
        step[0] += 1
        mul(pairs[i][0], pairs[i][1], outs[i])

    timing = time_call(call, device, warmup=warmup, reps=reps)
    return 2.0 * n ** 3 / (timing.p50 * 1e-3) / 1e12


def measure_copy(device: str, mib: int, *, reps: int, warmup: int) -> float:
    """GB/s of a `mib`-MiB copy counted as bytes read + written, median over `reps`, buffers rotated."""
    nbytes = mib * 2 ** 20
    bufs = [(torch.ones(nbytes, dtype=torch.uint8, device=device), torch.empty(nbytes, dtype=torch.uint8,
                                                                              device=device)) for _ in range(ROTATE)]
    step = [0]

    def call() -> None:
        src, dst = bufs[step[0] % ROTATE]
        step[0] += 1
        dst.copy_(src)

    timing = time_call(call, device, warmup=warmup, reps=reps)
    return 2.0 * nbytes / (timing.p50 * 1e-3) / 1e9


def measure_ceilings(device: str, *, matmul_n: int | None = None, copy_mib: int | None = None,
                     reps: int | None = None, progress=None) -> Ceilings:
    """Measure this device now. Sizes default to `SIZES[kind]`; a dtype that cannot multiply here is `unknown`."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    mib = copy_mib or SIZES[kind]["copy_mib"]
    reps = reps or (30 if kind == "cuda" else 5)
    warmup = 5 if kind == "cuda" else 1
    rates: dict[str, float] = {}
    unknown: dict[str, str] = {}
    sides: dict[str, int] = {}
    for dtype in MATMUL_DTYPES:
        refused = fp8_refusal(device) if dtype == "fp8" else None
        if refused:
            unknown[f"matmul_{dtype}"] = refused
            continue
        n = sides[dtype] = matmul_n or SIZES[kind]["matmul"][dtype]
        if progress:
            progress(f"matmul {n}³ {dtype}")
        try:
            rates[dtype] = measure_matmul(device, dtype, n, reps=reps, warmup=warmup)
        # e.g. no fp16 matmul in this CPU build, no bf16 on an old GPU, a torch whose _scaled_mm wants other arguments
        except (RuntimeError, TypeError, ValueError) as exc:
            unknown[f"matmul_{dtype}"] = first_line(exc, typed=False)
        finally:
            if kind == "cuda":
                torch.cuda.empty_cache()
    if progress:
        progress(f"copy {mib} MiB")
    copy = measure_copy(device, mib, reps=reps, warmup=warmup)
    method = {"matmul": f"n×n @ n×n with n = {sides}, 2·n³ FLOPs, {ROTATE} rotated buffer pairs, median of {reps} "
                        f"after {warmup} warm-up",
              "copy": f"{mib} MiB device-to-device copy_, bytes read + written, {ROTATE} rotated buffer pairs, "
                      f"median of {reps}",
              "fp32": "TF32 off" if kind == "cuda" and not torch.backends.cuda.matmul.allow_tf32 else
                      ("TF32 on" if kind == "cuda" else "plain fp32"),
              "fp8": FP8_METHOD}
    return Ceilings(device=device_name(device), key=cache_key(device), matmul_tflops=rates, copy_gbps=copy,
                    unknown=unknown, method=method, provenance=provenance(device))


def percent(value: float | None, ceiling: float | None) -> float | None:
    """`value` as % of `ceiling`; None when either is unknown."""
    if value is None or ceiling is None or ceiling <= 0 or value != value:
        return None
    return 100.0 * value / ceiling
