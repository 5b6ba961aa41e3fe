"""Bench rows as table cells, formatted one way for the terminal, the markdown page and the HTML page.

Every speed sits beside its ceiling: TFLOP/s with its % of the measured matmul peak, GB/s with its % of the
measured copy bandwidth; "unknown" where the ceiling was never measured.

A file that spans several GPU kinds (a sweep on a Ray cluster) gets a GPU column, claims per kind, and a side-by-side
table: the same cell on each kind in one row.
"""

from __future__ import annotations

from typing import Any

from attnprof.bench.results import gpu_kind
from attnprof.report.render import compact_table, cut, fit_columns, fmt, left_out, out, say

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


def kinds(rows: list[dict[str, Any]]) -> list[str]:
    """The GPU kinds of the rows, in order of first appearance."""
    return list(dict.fromkeys(gpu_kind(r) for r in rows))


def table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and one row of cells per result; a leading GPU column when the rows span several kinds."""
    if len(kinds(rows)) < 2:
        return list(HEADERS), [cells(r) for r in rows]
    return ["GPU", *HEADERS], [[gpu_kind(r), *cells(r)] for r in rows]


def _brief(row: dict[str, Any] | None) -> str:
    if row is None:
        return "–"
    if row["status"] != "ok":
        return row["status"]
    p50, tf, pct = (row.get("latency_ms") or {}).get("p50"), row.get("tflops"), row.get("pct_matmul_peak")
    return f"{fmt(p50, '.4g')} ms · {fmt(tf, '.3g')} TF/s" + (f" ({pct:.3g}%)" if pct is not None else "")


def side_by_side(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]] | None:
    """The same cell (variant + workload) on each GPU kind in one row; None when the rows have one kind."""
    names = kinds(rows)
    if len(names) < 2:
        return None
    grid: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        grid.setdefault(r["key"], {})[gpu_kind(r)] = r
    body = []
    for per_kind in grid.values():
        first = next(iter(per_kind.values()))
        body.append([first["variant"], first.get("label", ""), *(_brief(per_kind.get(k)) for k in names)])
    return ["variant", "workload", *names], body


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


def headline(rows: list[dict[str, Any]], unreliable: str | None = None) -> list[str]:
    """The seed's claims, answered from the rows: fused-vs-naive speedup range and peak-memory ratio per variant
    (per GPU kind, each line naming it, when the rows span several). `unreliable` (`bench.stability`) follows every
    speedup: a number timed on a busy machine never stands alone."""
    names = kinds(rows)
    if len(names) > 1:
        lines = [f"{k}: {line}" for k in names for line in _headline([r for r in rows if gpu_kind(r) == k])]
    else:
        lines = _headline(rows)
    return [f"{line} [{unreliable}]" if unreliable and "speedup" in line else line for line in lines]


def _headline(rows: list[dict[str, Any]]) -> list[str]:
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


# the compact terminal table: short headers, most important first (the rest: --wide, report.md, results.jsonl)
SHORT = {"% matmul peak": "% peak", "GB/s (min bytes)": "GB/s", "% copy peak": "% copy", "p20–p80 ms": "p20–p80"}
COMPACT = ["GPU", "variant", "workload", "status", "p50 ms", "× naive", "× sdpa", "TFLOP/s", "% peak", "p20–p80",
           "GB/s", "peak MiB"]


def print_terminal(rows: list[dict], where: str, *, wide: bool = False, machine=None) -> None:
    """`attnprof bench`'s table (every speed beside its ceiling; a GPU column when the rows span several kinds) and
    its headline claims. `where`: the device, e.g. "cuda" or "cuda via Ray". By default it fits 80 columns (short
    names, the reasons below the table); `wide` prints every column."""
    from rich.table import Table

    headers, body = table(rows)
    style = {"oom": "red", "error": "red", "failed": "red", "rejected": "yellow"}
    if wide:
        grid = Table(title=f"attnprof bench on {where}", caption=ceilings_line(rows), caption_justify="left")
        for h in headers:
            grid.add_column(h, overflow="fold")
        for r, cells_ in zip(rows, body):
            grid.add_row(*cells_, style=style.get(r["status"]))
        out.print(grid)
    else:
        short = [SHORT.get(h, h) for h in headers]
        names, compact, hidden = fit_columns(short, [c[:-1] + [""] for c in body], COMPACT,
                                             cuts={"variant": 16, "workload": 26, "GPU": 10})
        out.print(compact_table(f"attnprof bench on {where}", names, compact,
                                styles=[style.get(r["status"]) for r in rows],
                                right=("p50 ms", "× naive", "× sdpa", "TFLOP/s", "% peak", "GB/s", "peak MiB")))
        say(ceilings_line(rows), style="dim")
        for r in rows:
            why = r.get("reason") or (r.get("peak_mib_note") if r["status"] == "ok" else "")
            if why:
                say(f"{cut(r['variant'], 20)} on {r.get('label', '')}: {r['status']}: {why}", indent="",
                    style=style.get(r["status"]))
        left_out([h for h in hidden if h != "reason"], "--wide, attnprof report")
    if machine is not None and machine.reason:  # `bench.stability`: the machine was too busy to time on
        say(machine.reason, wide=wide, style="bold yellow")
    for line in headline(rows, machine.short if machine is not None else None):
        say(line, wide=wide)


def print_pairs(pairs, path_a, path_b, rows_a: list[dict], rows_b: list[dict], *, wide: bool = False) -> None:
    """`attnprof compare`'s table: each cell's p50 (p20–p80) in A and B, the ratio and the verdict with its why; a
    GPU column when a file spans several GPU kinds (each kind compared with itself). By default it fits 80 columns:
    p50s only, and the why of every verdict but "same" below the table; `wide` prints every column."""
    from rich.table import Table

    dev = lambda rows: ", ".join(dict.fromkeys(gpu_kind(r) for r in rows)) or None  # noqa: E731
    per_kind = any(p.kind for p in pairs)
    style = {"regression": "bold red", "improvement": "green", "status-change": "yellow"}
    title = f"A = {path_a} ({dev(rows_a)})   B = {path_b} ({dev(rows_b)})"
    if wide:
        grid = Table(title=title)
        for h in (("GPU",) if per_kind else ()) + ("variant", "workload", "A p50 ms (p20–p80)", "B p50 ms (p20–p80)",
                                                  "B / A", "verdict", "why"):
            grid.add_column(h, overflow="fold")
        for p in pairs:
            grid.add_row(*((p.kind,) if per_kind else ()), p.variant, p.label, _lat(p.a, fmt), _lat(p.b, fmt),
                         fmt(p.ratio, ".3f"), p.verdict, p.why, style=style.get(p.verdict))
        out.print(grid)
        return
    headers = ["GPU", "variant", "workload", "A p50 ms", "B p50 ms", "B / A", "verdict"]
    body = [[p.kind or "", p.variant, p.label, _p50(p.a), _p50(p.b), fmt(p.ratio, ".3f"), p.verdict] for p in pairs]
    keep = (["GPU"] if per_kind else []) + ["variant", "verdict", "B / A", "workload", "A p50 ms", "B p50 ms"]
    names, compact, hidden = fit_columns(headers, body, keep, cuts={"variant": 16, "workload": 24, "GPU": 10})
    say(f"A = {path_a} ({dev(rows_a)})", style="bold")
    say(f"B = {path_b} ({dev(rows_b)})", style="bold")
    out.print(compact_table("", names, compact, styles=[style.get(p.verdict) for p in pairs],
                            right=("A p50 ms", "B p50 ms", "B / A")))
    for p in pairs:
        if p.verdict != "same" and p.why:
            say(f"{cut(p.variant, 20)} on {p.label}: {p.verdict}: {p.why}", style=style.get(p.verdict))
    hidden = [h for h in hidden if h != "GPU"]
    say(f"(not shown: {', '.join(hidden + ['p20–p80'])}; see --wide, compare.json)", style="dim")


def _p50(row) -> str:
    if row is None:
        return "–"
    if row["status"] != "ok":
        return row["status"]
    return fmt(row["latency_ms"]["p50"], ".4g")


def _lat(row, fmt) -> str:
    if row is None:
        return "–"
    if row["status"] != "ok":
        return row["status"]
    lat = row["latency_ms"]
    return f"{fmt(lat['p50'], '.4g')} ({fmt(lat['p20'], '.3g')}–{fmt(lat['p80'], '.3g')})"
