"""Bench rows as table cells, formatted one way for the terminal, the markdown page and the HTML page.

Every speed sits beside its ceiling: TFLOP/s with its % of the measured matmul peak, GB/s with its % of the
measured copy bandwidth; "unknown" where the ceiling was never measured.
"""

from __future__ import annotations

from typing import Any

from attnprof.report.render import fmt

HEADERS = ["variant", "workload", "status", "p50 ms", "p20–p80 ms", "TFLOP/s", "% matmul peak", "GB/s (min bytes)",
           "% copy peak", "peak MiB", "× naive", "× sdpa", "reason"]


def _pct(row: dict[str, Any], key: str, ceiling_key: str) -> str:
    if row.get("status") != "ok":
        return "–"
    if row.get(key) is None:
        known = (row.get("ceilings") or {}).get(ceiling_key)
        return "unknown" if known is None else "–"
    return f"{row[key]:.3g}%"


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}×"


def cells(row: dict[str, Any]) -> list[str]:
    """One row of `HEADERS`, as strings."""
    lat = row.get("latency_ms") or {}
    sp = row.get("speedup") or {}
    spread = f"{lat['p20']:.3g}–{lat['p80']:.3g}" if lat else "–"
    peak = fmt(row.get("peak_mib"), ".4g") if row.get("peak_mib") is not None else (
        "unknown" if row.get("status") == "ok" else "–")
    return [row["variant"], row.get("label", ""), row["status"], fmt(lat.get("p50"), ".4g"), spread,
            fmt(row.get("tflops"), ".3g"), _pct(row, "pct_matmul_peak", "matmul_tflops"), fmt(row.get("gbps"), ".4g"),
            _pct(row, "pct_copy_peak", "copy_gbps"), peak, _x(sp.get("vs_naive")), _x(sp.get("vs_sdpa")),
            row.get("reason") or row.get("peak_mib_note") or ""]


def ceilings_line(rows: list[dict[str, Any]]) -> str:
    """One sentence naming the ceilings the rows were measured against (or saying they are unknown)."""
    blocks = {}
    for r in rows:
        c = r.get("ceilings") or {}
        blocks.setdefault(r["workload"]["dtype"], c)
    if not blocks or not any(c.get("known") for c in blocks.values()):
        return "ceilings: unknown (no measurement for this device; run `attnprof ceilings`): % of peak not shown"
    parts = [f"{d} matmul {fmt(c.get('matmul_tflops'), '.4g', 'unknown')} TFLOP/s" for d, c in sorted(blocks.items())]
    copy = next(iter(blocks.values())).get("copy_gbps")
    return "measured ceilings: " + ", ".join(parts) + f", copy {fmt(copy, '.4g', 'unknown')} GB/s"


def headline(rows: list[dict[str, Any]]) -> list[str]:
    """The seed's claims, answered from the rows: fused-vs-naive speedup range and peak-memory ratio per variant."""
    lines = []
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_variant.setdefault(r["variant"], []).append(r)
    naive = {r["key"].split("|", 1)[1]: r for r in by_variant.get("naive", []) if r["status"] == "ok"}
    for name, rs in by_variant.items():
        if name == "naive":
            continue
        sp = [(r["workload"]["seq"], r["speedup"]["vs_naive"]) for r in rs if (r.get("speedup") or {}).get("vs_naive")]
        if sp:
            lo, hi = min(sp, key=lambda t: t[1]), max(sp, key=lambda t: t[1])
            lines.append(f"{name}: speedup over naive {lo[1]:.3g}× (S={lo[0]}) to {hi[1]:.3g}× (S={hi[0]})")
        mem = []
        for r in rs:
            base = naive.get(r["key"].split("|", 1)[1])
            if base and r["status"] == "ok" and r.get("peak_mib") and base.get("peak_mib"):
                mem.append((r["workload"]["seq"], base["peak_mib"] / r["peak_mib"]))
        if mem:
            lo, hi = min(mem, key=lambda t: t[1]), max(mem, key=lambda t: t[1])
            lines.append(f"{name}: naive's peak memory is {lo[1]:.3g}× (S={lo[0]}) to {hi[1]:.3g}× (S={hi[0]}) this one's")
    return lines


def print_terminal(rows: list[dict], device: str) -> None:
    """`attnprof bench`'s table (every speed beside its ceiling) and its headline claims."""
    from rich.table import Table

    from attnprof.report.render import out

    table = Table(title=f"attnprof bench on {device}", caption=ceilings_line(rows), caption_justify="left")
    for h in HEADERS:
        table.add_column(h, overflow="fold")
    for r in rows:
        table.add_row(*cells(r), style={"oom": "red", "error": "red", "rejected": "yellow"}.get(r["status"]))
    out.print(table)
    for line in headline(rows):
        out.print(line)


def print_pairs(pairs, path_a, path_b, rows_a: list[dict], rows_b: list[dict]) -> None:
    """`attnprof compare`'s table: each cell's p50 (p20–p80) in A and B, the ratio and the verdict with its why."""
    from rich.table import Table

    from attnprof.report.render import out

    dev = lambda rows: (rows[0].get("provenance") or {}).get("device") if rows else None  # noqa: E731
    table = Table(title=f"A = {path_a} ({dev(rows_a)})   B = {path_b} ({dev(rows_b)})")
    for h in ("variant", "workload", "A p50 ms (p20–p80)", "B p50 ms (p20–p80)", "B / A", "verdict", "why"):
        table.add_column(h, overflow="fold")
    style = {"regression": "bold red", "improvement": "green", "status-change": "yellow"}
    for p in pairs:
        table.add_row(p.variant, p.label, _lat(p.a, fmt), _lat(p.b, fmt), fmt(p.ratio, ".3f"), p.verdict, p.why,
                      style=style.get(p.verdict))
    out.print(table)


def _lat(row, fmt) -> str:
    if row is None:
        return "–"
    if row["status"] != "ok":
        return row["status"]
    lat = row["latency_ms"]
    return f"{fmt(lat['p50'], '.4g')} ({fmt(lat['p20'], '.3g')}–{fmt(lat['p80'], '.3g')})"
