"""Two bench result files side by side: a ratio per matching cell, and regressions beyond the run-to-run spread.

A cell is matched by its key (variant + workload), so results from two machines, two torch versions or two
commits compare cell by cell. Each side brings its own spread: the p20–p80 band of its repetitions, and its relative
width `(p80 - p20) / p50`. A cell whose spread exceeds `max_spread` in either run is `too-noisy` (too noisy to
judge: a loaded machine, say; re-run it quieter). Otherwise a cell counts as slower only when the bands do not
overlap (B's p20 above A's p80) *and* the medians differ by more than `min_change` *and* by more than either run's
relative spread; the same rule the other way is an improvement. Anything in between is noise, and called so (an
identical re-run is `same`). A cell that ran in A and fails in B (oom, error, rejected, failed) is a regression too.

When either file spans several GPU kinds (a Ray sweep across a fleet), cells are matched by key *and* GPU kind, so
each kind is compared with itself; two single-kind files (yesterday's H100 run, today's H200 run) still match by key
alone, which is how two machines are compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from attnprof.bench.results import gpu_kind

Verdict = Literal["regression", "improvement", "same", "too-noisy", "status-change", "only-in-a", "only-in-b",
                  "not-comparable"]

MAX_SPREAD = 0.5  # default `--max-spread`: a run whose p20–p80 band is wider than half its median is too noisy


@dataclass(frozen=True)
class Pair:
    key: str
    variant: str
    label: str
    a: dict[str, Any] | None
    b: dict[str, Any] | None
    ratio: float | None  # B p50 / A p50: > 1 means B is slower
    verdict: Verdict
    why: str
    kind: str | None = None  # the GPU kind both sides ran on, when the files were matched per kind

    def to_json(self) -> dict:
        lat = lambda r: (r or {}).get("latency_ms")  # noqa: E731
        return {"key": self.key, "variant": self.variant, "workload": self.label, "gpu_kind": self.kind,
                "ratio_b_over_a": self.ratio,
                "verdict": self.verdict, "why": self.why, "a_status": (self.a or {}).get("status"),
                "b_status": (self.b or {}).get("status"), "a_latency_ms": lat(self.a), "b_latency_ms": lat(self.b)}


def spread(latency: dict[str, float]) -> float:
    """The relative width of a run's p20–p80 band: `(p80 - p20) / p50`."""
    return (latency["p80"] - latency["p20"]) / latency["p50"] if latency["p50"] > 0 else float("inf")


def judge(a: dict[str, Any], b: dict[str, Any], min_change: float,
          max_spread: float = MAX_SPREAD) -> tuple[float | None, Verdict, str]:
    if a["status"] != "ok" or b["status"] != "ok":
        if a["status"] == "ok":
            return None, "regression", f"ran in A, {b['status']} in B: {b.get('reason')}"
        if b["status"] == "ok":
            return None, "improvement", f"{a['status']} in A, runs in B"
        return None, "not-comparable", f"{a['status']} in A, {b['status']} in B"
    la, lb = a["latency_ms"], b["latency_ms"]
    ratio = lb["p50"] / la["p50"]
    sa, sb = spread(la), spread(lb)
    if max(sa, sb) > max_spread:
        side = " and ".join(f"{n} {s:.0%}" for n, s in (("A", sa), ("B", sb)) if s > max_spread)
        return ratio, "too-noisy", (f"too noisy to judge: p20–p80 spread {side} of the median "
                                    f"(--max-spread {max_spread:g})")
    need = max(min_change, sa, sb)  # a change must exceed the threshold and both runs' own spread
    if lb["p20"] > la["p80"] and ratio > 1 + need:
        return ratio, "regression", (f"B p20 {lb['p20']:.4g} ms > A p80 {la['p80']:.4g} ms; "
                                     f"median {(ratio - 1) * 100:.0f}% slower (spread A {sa:.0%}, B {sb:.0%})")
    if lb["p80"] < la["p20"] and ratio < 1 - need:
        return ratio, "improvement", (f"B p80 {lb['p80']:.4g} ms < A p20 {la['p20']:.4g} ms; "
                                      f"median {(1 - ratio) * 100:.0f}% faster (spread A {sa:.0%}, B {sb:.0%})")
    return ratio, "same", f"within the run-to-run spread (A {sa:.0%}, B {sb:.0%})"


def compare(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], *, min_change: float = 0.05,
            max_spread: float = MAX_SPREAD) -> list[Pair]:
    """Every cell of A (in A's order), then those only in B; per GPU kind when either file spans several."""
    per_kind = len({gpu_kind(r) for r in rows_a}) > 1 or len({gpu_kind(r) for r in rows_b}) > 1
    ref = (lambda r: (r["key"], gpu_kind(r))) if per_kind else (lambda r: (r["key"], None))  # noqa: E731
    a = {ref(r): r for r in rows_a}
    b = {ref(r): r for r in rows_b}
    out: list[Pair] = []
    for (key, kind), ra in a.items():
        rb = b.get((key, kind))
        if rb is None:
            out.append(Pair(key, ra["variant"], ra.get("label", ""), ra, None, None, "only-in-a", "no such cell in B",
                            kind))
            continue
        ratio, verdict, why = judge(ra, rb, min_change, max_spread)
        out.append(Pair(key, ra["variant"], ra.get("label", ""), ra, rb, ratio, verdict, why, kind))
    for (key, kind), rb in b.items():
        if (key, kind) not in a:
            out.append(Pair(key, rb["variant"], rb.get("label", ""), None, rb, None, "only-in-b", "no such cell in A",
                            kind))
    return out
