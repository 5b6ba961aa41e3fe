"""A load sweep: throughput per GPU against tokens/s per user, the curve fleet operators compare kernels and hardware on.

One serving run answers "how fast at this load". Raising the load (more requests in flight, or a higher arrival rate)
buys throughput per GPU and costs each user speed; the whole trade-off is the curve of output tokens/s per GPU (y)
against tokens/s per user (x), one point per load, each with its $/1M output tokens. A better kernel moves the curve
up and to the right. Operators read it at an interactivity floor ("at >= 50 tokens/s per user, who serves more per
GPU?"), which `best_at` answers, and only its Pareto front matters (`pareto`: points no other point of the same
implementation beats on both axes).

Tokens/s per user is 1000 / TPOT p50 (ms): how fast one user's text streams once it has started, the usual
interactivity axis. Throughput per GPU is the run's output tokens/s divided by the GPUs serving it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

from attnprof.errors import UsageError
from attnprof.serving.metrics import ServeMetrics, token_cost

Axis = Literal["concurrency", "rate"]  # requests in flight (closed loop) or arrivals per second (open loop)
AXES: tuple[str, ...] = ("concurrency", "rate")


@dataclass(frozen=True)
class SweepPoint:
    """One implementation at one load, reduced to what the curve needs."""

    impl: str
    load: float
    output_tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float | None  # None when no request had two tokens (no TPOT)
    usd_per_m_output: float | None
    ttft_p50_ms: float | None
    tpot_p50_ms: float | None
    completed: int
    failed: int

    @classmethod
    def from_metrics(cls, impl: str, load: float, m: ServeMetrics, *, gpus: int, gpu_hour_price: float) -> SweepPoint:
        cost = token_cost(m.throughput, gpu_hour_price, gpus=gpus)
        tpot = m.latency.tpot_ms.p50 if m.latency.tpot_ms else None
        return cls(impl, load, m.throughput.output_throughput / gpus,
                   1e3 / tpot if tpot else None, cost.usd_per_m_output,
                   m.latency.ttft_ms.p50 if m.latency.ttft_ms else None, tpot, m.completed, m.failed)


@dataclass(frozen=True)
class Sweep:
    """Points of every implementation over one load axis, on `gpus` GPUs at `gpu_hour_price` each."""

    axis: Axis
    gpus: int
    gpu_hour_price: float
    points: tuple[SweepPoint, ...]

    def __post_init__(self) -> None:
        if self.axis not in AXES:
            raise UsageError(f"the sweep axis must be one of {', '.join(AXES)}, got {self.axis!r}")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise UsageError(f"--gpus must be a whole number >= 1, got {self.gpus}")
        seen = set()
        for p in self.points:
            if not (isinstance(p.load, (int, float)) and p.load > 0 and not math.isnan(p.load)):
                raise UsageError(f"a sweep {self.axis} must be positive, got {p.load}")
            if self.axis == "concurrency" and p.load != int(p.load):
                raise UsageError(f"a concurrency is a whole number of requests, got {p.load}")
            if (p.impl, p.load) in seen:
                raise ValueError(f"{p.impl} appears twice at {self.axis} {p.load:g}")
            seen.add((p.impl, p.load))

    def impls(self) -> list[str]:
        return list(dict.fromkeys(p.impl for p in self.points))

    def curve(self, impl: str) -> list[SweepPoint]:
        """`impl`'s points in load order (the order they were measured in a sweep)."""
        return sorted((p for p in self.points if p.impl == impl), key=lambda p: p.load)

    def pareto(self, impl: str) -> list[SweepPoint]:
        """The points of `impl` that no other of its points beats on both axes, fastest per user first."""
        pts = [p for p in self.curve(impl) if p.tokens_per_s_per_user is not None]

        def beaten(p: SweepPoint) -> bool:
            return any(q is not p and q.tokens_per_s_per_user >= p.tokens_per_s_per_user
                       and q.output_tokens_per_s_per_gpu >= p.output_tokens_per_s_per_gpu
                       and (q.tokens_per_s_per_user, q.output_tokens_per_s_per_gpu)
                       != (p.tokens_per_s_per_user, p.output_tokens_per_s_per_gpu) for q in pts)

        return sorted((p for p in pts if not beaten(p)), key=lambda p: -p.tokens_per_s_per_user)

    def best_at(self, min_tokens_per_s_per_user: float) -> dict[str, SweepPoint | None]:
        """Per implementation, its highest throughput per GPU among points at least that fast per user (else None).

        A point where any request failed is not an operating point and is never chosen."""
        out: dict[str, SweepPoint | None] = {}
        for impl in self.impls():
            ok = [p for p in self.curve(impl) if p.failed == 0 and p.tokens_per_s_per_user is not None
                  and p.tokens_per_s_per_user >= min_tokens_per_s_per_user]
            out[impl] = max(ok, key=lambda p: p.output_tokens_per_s_per_gpu) if ok else None
        return out

    def to_json(self) -> dict:
        return {"axis": self.axis, "gpus": self.gpus, "gpu_hour_price": self.gpu_hour_price,
                "points": [asdict(p) for p in self.points],
                "pareto": {impl: [p.load for p in self.pareto(impl)] for impl in self.impls()}}
