"""FLOPs and the fewest bytes of an attention forward: the two numbers every speed is placed against.

FLOPs follow the convention of the FlashAttention benchmarks so our TFLOP/s compare with published ones:
4·B·Hq·Sq·Sk·D (two matmuls of 2·Sq·Sk·D each per head), halved when causal — even when Sq != Sk, where the
exact count of visible pairs differs; `visible_fraction` gives the exact share for those who want it.
Minimum bytes: q, k, v read once and the output written once (a fused kernel's floor; naive moves far more).
"""

from __future__ import annotations

from attnprof.workload import Workload


def flops(w: Workload) -> float:
    """Forward FLOPs: 4·B·Hq·Sq·Sk·D, halved when causal."""
    total = 4.0 * w.batch * w.heads * w.seq * w.kv_seq * w.head_dim
    return total / 2 if w.causal else total


def visible_fraction(w: Workload) -> float:
    """Exact share of (query, key) pairs a bottom-right causal mask keeps (1.0 when not causal)."""
    if not w.causal:
        return 1.0
    sq, sk = w.seq, w.kv_seq
    kept = sum(max(0, min(sk, i + sk - sq + 1)) for i in range(sq))
    return kept / (sq * sk)


def min_bytes(w: Workload) -> int:
    """q, k, v read once and the output written once."""
    return w.input_bytes()


def tflops(w: Workload, seconds: float) -> float:
    return flops(w) / seconds / 1e12 if seconds > 0 else float("nan")


def gbps(w: Workload, seconds: float) -> float:
    return min_bytes(w) / seconds / 1e9 if seconds > 0 else float("nan")
