"""Is this machine steady enough to time on? A reference measurement at the start and end of a run, and the cores.

A timing taken while other processes hold the cores is not the implementation's: on a loaded 2-core CPU a sweep can
time naive 1×4×128×64 at 112 ms and 2×4×128×64 at 0.3 ms, and print a 775× speedup. Nothing in the rows shows
it, so the run watches the machine itself, for well under 0.2 s:

- **drift**: a fixed matmul (the reference), timed at the start and at the end of the run (`measure.timing`, p50 of a
  few calls). Its p50 moving by more than `DRIFT` × means the machine changed under the run.
- **waiting** (Linux, CPU runs): the share of the run's wall time this process's main thread spent runnable but
  waiting for a core (`/proc/self/schedstat`): other processes holding the cores. Above `WAITING` it is flagged.
- **load** (CPU runs): the 1-minute load average against the core count at the start (`os.getloadavg`); a load
  above `LOAD` × the cores means the run starts on a machine already busy.

The verdict travels with the results (`machine` block) and every headline number (`reason`), instead of a silent
"775×". GPU runs check the drift only (a GPU matmul on CUDA events): the host's load does not time the GPU.
Cost: 16 calls of a 192×192 fp32 matmul, ~5 ms on a quiet CPU; on a machine busy enough to stall each call for a
time slice, up to ~1 s, and that run is flagged. On CUDA ~0.1 s a check: the reference is warmed from idle clocks
first, or an idle GPU would read as a drift.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

import torch

from attnprof.measure.timing import time_call

DRIFT = 1.5  # reference p50, end vs start (either way)
WAITING = 0.25  # share of the run's wall time spent waiting for a core
LOAD = 1.5  # 1-minute load average per core at the start
_SIZE = {"cpu": 192, "cuda": 4096}  # the reference matmul's n: ~0.1-0.5 ms a call on either
# A GPU that sat idle (the run's report being written, a cold start) runs its first kernels at idle clocks: a reference
# timed then reads up to ~1.7× slow against the same GPU warm (2048³ bf16 on an H100: 0.029 → 0.048 ms). So on CUDA
# the reference runs back to back for this long before it is timed; the clocks ramp within a few milliseconds.
_GPU_WARM_S = 0.1


@dataclass(frozen=True)
class Stability:
    """The machine's steadiness over one run; `reason` is None when nothing was flagged."""

    device: str
    reference_ms: tuple[float, ...]  # the reference's p50 at each check (start, …, end)
    drift: float  # max / min of those
    waiting: float | None  # share of the wall time spent waiting for a core (None: not Linux, or a GPU run)
    load: float | None  # 1-minute load average at the start (None where unknown)
    cores: int
    wall_s: float
    causes: tuple[str, ...]  # what was flagged, each in a few words; empty when the machine was steady

    @property
    def reason(self) -> str | None:
        """The whole verdict in one line, None when nothing was flagged."""
        if not self.causes:
            return None
        return ("timings unreliable: " + "; ".join(self.causes) + " (other processes hold the cores, or the clock or "
                "power state changed; rerun on a quiet machine)")

    @property
    def short(self) -> str | None:
        """The first cause, to sit beside a headline number: "timings unreliable: the reference matmul drifted 3.4×"."""
        return None if not self.causes else "timings unreliable: " + self.causes[0].split(" (")[0]

    @property
    def reliable(self) -> bool:
        return self.reason is None

    def to_json(self) -> dict:
        return {"reliable": self.reliable, "reason": self.reason, "short": self.short, "device": self.device,
                "reference": f"{_n(self.device)}×{_n(self.device)} matmul, p50 of {_reps(self.device)} calls",
                "reference_ms": list(self.reference_ms), "drift": self.drift, "waiting": self.waiting,
                "load": self.load, "cores": self.cores, "wall_s": self.wall_s,
                "thresholds": {"drift": DRIFT, "waiting": WAITING, "load_per_core": LOAD}}


def _n(device: str) -> int:
    return _SIZE["cuda" if device.startswith("cuda") else "cpu"]


def _reps(device: str) -> int:
    return 15 if device.startswith("cuda") else 7


@functools.cache
def _operands(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's inputs, made once per device (a check then costs only the matmuls)."""
    n = _n(device)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(n, n, generator=gen).to(device=device, dtype=dtype) for _ in range(2))


def reference_ms(device: str) -> float:
    """p50 ms of a fixed matmul on `device`: fp32 on one CPU thread, 7 calls after 1 (with the pool's threads, a
    loaded 2-core machine flips one call between 0.13 and 16 ms, and a run stalled at both ends reads as steady);
    bf16 on CUDA, 15 calls after `_GPU_WARM_S` of back-to-back calls (the GPU's clocks up from idle)."""
    a, b = _operands(device)
    if device.startswith("cuda"):
        end = time.perf_counter() + _GPU_WARM_S
        while time.perf_counter() < end:
            for _ in range(8):
                a @ b
            torch.cuda.synchronize(device)
        return time_call(lambda: a @ b, device, warmup=1, reps=_reps(device)).p50
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return time_call(lambda: a @ b, device, warmup=1, reps=_reps(device)).p50
    finally:
        torch.set_num_threads(threads)


def _waited_s() -> float | None:
    """Seconds the main thread has spent runnable but not running (Linux); None elsewhere."""
    try:
        with open("/proc/self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


class Watch:
    """`Watch(device)` at the start of a run, `.check()` whenever there is a pause, `.finish()` at the end."""

    def __init__(self, device: str):
        self.device = device
        self.cpu = not device.startswith("cuda")
        self.cores = os.cpu_count() or 1
        self.load = _load() if self.cpu else None
        self.t0, self.waited0 = time.perf_counter(), _waited_s() if self.cpu else None
        self.samples = [reference_ms(device)]

    def check(self) -> None:
        self.samples.append(reference_ms(self.device))

    def finish(self) -> Stability:
        self.check()
        wall = time.perf_counter() - self.t0
        waited1 = _waited_s() if self.cpu else None
        waiting = None if self.waited0 is None or waited1 is None or wall <= 0 else (waited1 - self.waited0) / wall
        drift = max(self.samples) / min(self.samples) if min(self.samples) > 0 else float("inf")
        why = []
        if drift > DRIFT:
            first, last = self.samples[0], self.samples[-1]
            why.append(f"the reference matmul drifted {drift:.3g}× ({first:.3g} → {last:.3g} ms"
                       + (f", {len(self.samples)} checks" if len(self.samples) > 2 else "") + ")")
        if waiting is not None and waiting > WAITING:
            why.append(f"this process waited for a core {100 * waiting:.0f} % of the run")
        if self.load is not None and self.load > LOAD * self.cores:
            why.append(f"the load was {self.load:.3g} on {self.cores} cores at the start")
        return Stability(self.device, tuple(self.samples), drift, waiting, self.load, self.cores, round(wall, 3),
                         tuple(why))
