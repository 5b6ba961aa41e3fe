"""The bench pictures (matplotlib, Agg, PNG): every speed drawn against the ceiling this machine measured.

1. TFLOP/s against sequence length, one line per variant, the measured matmul peak drawn in.
2. Speedup over `naive` on the same workload (log scale; 1× marked).
3. Peak extra memory against sequence length (log scale).
4. A roofline: each cell placed by its arithmetic intensity (FLOPs / minimum bytes) under the measured matmul
   and copy ceilings. Naive moves far more than the minimum bytes, which is exactly why it sits far below its roof.

Curves are grouped by variant and by whatever else varies in the sweep (heads, head dim, dtype, causal, batch),
so one sweep over several configurations still gives readable lines; a sweep over several GPU kinds draws one
line per variant and kind. Ceilings that are unknown are not drawn, and the picture says so.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from attnprof.bench.results import gpu_kind
from attnprof.files import write_atomic

PLOTS = (("tflops.png", "TFLOP/s against sequence length, with the measured matmul ceiling"),
         ("speedup.png", "Speedup over naive on the same workload"),
         ("memory.png", "Peak extra memory per call against sequence length"),
         ("roofline.png", "Roofline: each cell by arithmetic intensity under the measured ceilings"))


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _config(row: dict[str, Any], varying: list[str]) -> str:
    w = row["workload"]
    names = {"heads": lambda: f"H={w['heads']}", "head_dim": lambda: f"D={w['head_dim']}", "dtype": lambda: w["dtype"],
             "causal": lambda: "causal" if w["causal"] else "full",
             "batch": lambda: f"B·S={row['tokens']}" if row.get("tokens") else f"B={w['batch']}"}
    return " ".join(names[k]() for k in varying)


def series(rows: list[dict[str, Any]], value) -> dict[str, list[tuple[int, float]]]:
    """label → [(seq, value)] over ok rows with a value, sorted by seq."""
    ok = [r for r in rows if r["status"] == "ok"]
    varying = [k for k in ("heads", "head_dim", "dtype", "causal", "batch")
               if len({(r["workload"][k] if k != "batch" or not r.get("tokens") else r["tokens"]) for r in ok}) > 1]
    fleet = len({gpu_kind(r) for r in ok}) > 1  # one results file over several GPU kinds: a line per kind
    out: dict[str, list[tuple[int, float]]] = {}
    for r in ok:
        v = value(r)
        if v is None:
            continue
        label = " ".join(x for x in (r["variant"], _config(r, varying), f"on {gpu_kind(r)}" if fleet else "") if x)
        out.setdefault(label, []).append((r["workload"]["seq"], v))
    return {k: sorted(v) for k, v in out.items()}


def _ceilings(rows: list[dict[str, Any]]) -> tuple[dict[str, float], float | None]:
    matmul: dict[str, float] = {}
    copy = None
    for r in rows:
        c = r.get("ceilings") or {}
        if c.get("matmul_tflops"):
            matmul[r["workload"]["dtype"]] = c["matmul_tflops"]
        copy = copy or c.get("copy_gbps")
    return matmul, copy


def _seq_axis(ax, data: dict[str, list[tuple[int, float]]]) -> None:
    seqs = sorted({s for pts in data.values() for s, _ in pts})
    ax.set_xscale("log", base=2)
    if seqs:
        ax.set_xticks(seqs)
        ax.set_xticklabels([f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s) for s in seqs])
    ax.set_xlabel("sequence length")


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_STYLES = ("-", "--", "-.", ":")


def _lines(ax, data: dict[str, list[tuple[int, float]]], palette: dict[str, int]) -> None:
    """One colour and marker per variant in every picture; the dash tells configurations apart."""
    configs: dict[str, int] = {}
    for label, pts in data.items():
        variant, _, config = label.partition(" ")
        i = palette.get(variant, len(palette))
        dash = _STYLES[configs.setdefault(config, len(configs)) % len(_STYLES)]
        ax.plot([s for s, _ in pts], [v for _, v in pts], color=f"C{i % 10}", marker=_MARKERS[i % len(_MARKERS)],
                markersize=8 - 1.5 * (i % 3), linestyle=dash, label=label, alpha=0.85)  # overlaps stay visible
    if not data:
        ax.text(0.5, 0.5, "no cell ran successfully", transform=ax.transAxes, ha="center", va="center")


def _finish(fig, ax, title: str, subtitle: str) -> bytes:
    ax.set_title(title, loc="left", fontsize=11)
    fig.text(0.01, 0.01, subtitle, fontsize=7, color="#555555")
    ax.grid(True, which="both", alpha=0.25)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")
    buf = io.BytesIO()
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(buf, format="png", dpi=110)
    _plt().close(fig)
    return buf.getvalue()


def render(rows: list[dict[str, Any]], subtitle: str = "") -> dict[str, bytes]:
    """File name → PNG bytes for the four pictures."""
    plt = _plt()
    matmul, copy = _ceilings(rows)
    palette = {v: i for i, v in enumerate(dict.fromkeys(r["variant"] for r in rows))}
    pngs: dict[str, bytes] = {}

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    data = series(rows, lambda r: r.get("tflops"))
    _lines(ax, data, palette)
    for dtype, peak in sorted(matmul.items()):
        ax.axhline(peak, linestyle="--", color="black", linewidth=1)
        ax.annotate(f"measured {dtype} matmul peak {peak:.4g} TFLOP/s", (0.01, peak), xycoords=("axes fraction", "data"),
                    va="bottom", fontsize=8)
    if not matmul:
        ax.text(0.99, 0.98, "matmul ceiling unknown (run `attnprof ceilings`)", transform=ax.transAxes, ha="right",
                va="top", fontsize=8, color="#aa3333")
    _seq_axis(ax, data)
    ax.set_ylabel("TFLOP/s (4·B·H·Sq·Sk·D, ½ if causal)")
    ax.set_ylim(bottom=0)
    pngs["tflops.png"] = _finish(fig, ax, "Attention throughput against the measured matmul ceiling", subtitle)

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    data = series([r for r in rows if r["variant"] != "naive"], lambda r: (r.get("speedup") or {}).get("vs_naive"))
    _lines(ax, data, palette)
    ax.axhline(1.0, color="black", linewidth=1)
    _seq_axis(ax, data)
    ax.set_yscale("log")
    ax.set_ylabel("× faster than naive (p50 latency ratio)")
    pngs["speedup.png"] = _finish(fig, ax, "Speedup over naive attention", subtitle)

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    data = series(rows, lambda r: r.get("peak_mib") if r.get("peak_mib") and r["peak_mib"] > 0 else None)
    _lines(ax, data, palette)
    _seq_axis(ax, data)
    ax.set_yscale("log")
    ax.set_ylabel("peak extra memory per call (MiB)")
    pngs["memory.png"] = _finish(fig, ax, "Peak memory above the inputs", subtitle)

    pngs["roofline.png"] = _roofline(rows, matmul, copy, subtitle, palette)
    return pngs


def _roofline(rows: list[dict[str, Any]], matmul: dict[str, float], copy: float | None, subtitle: str,
              palette: dict[str, int]) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    ok = [r for r in rows if r["status"] == "ok" and r.get("tflops")]
    xs = [r["intensity"] for r in ok] or [1.0]
    lo, hi = min(xs) / 4, max(xs) * 4
    if copy:
        for dtype, peak in sorted(matmul.items()) or [("", None)]:
            grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
            roof = [min(peak, x * copy / 1e3) if peak else x * copy / 1e3 for x in grid]
            ax.plot(grid, roof, color="black", linewidth=1.2, linestyle="--",
                    label=f"roof: {dtype} matmul {peak:.4g} TFLOP/s, copy {copy / 1e3:.3g} TB/s" if peak
                    else f"roof: copy {copy / 1e3:.3g} TB/s (matmul ceiling unknown)")
    else:
        ax.text(0.99, 0.02, "copy ceiling unknown: no roof drawn (run `attnprof ceilings`)", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=8, color="#aa3333")
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for r in ok:
        by_variant.setdefault(r["variant"], []).append(r)
    for name, rs in by_variant.items():
        i = palette.get(name, 0)
        ax.scatter([r["intensity"] for r in rs], [r["tflops"] for r in rs], label=name, s=30, color=f"C{i % 10}",
                   marker=_MARKERS[i % len(_MARKERS)], alpha=0.85)
    if not ok:
        ax.text(0.5, 0.5, "no cell ran successfully", transform=ax.transAxes, ha="center", va="center")
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("arithmetic intensity (FLOPs / minimum bytes: q, k, v read once, out written once)")
    ax.set_ylabel("TFLOP/s")
    return _finish(fig, ax, "Roofline of each cell", subtitle)


def write_plots(rows: list[dict[str, Any]], folder: Path, subtitle: str = "") -> list[Path]:
    """Render and write the four PNGs atomically; returns their paths."""
    return [write_atomic(Path(folder) / name, data) for name, data in render(rows, subtitle).items()]
