"""The bench report as one self-contained HTML page (pictures inlined as data URIs) and a markdown page.

The HTML page needs nothing beside it: mail it, attach it to an issue, open it offline. Every piece of text that
came from a run (variant names, `package.module:function` specs, kernel names like `flash_fwd_kernel<Flash_fwd_
kernel_traits<128, 64, ...>>`, error messages, the command line) goes through `html.escape`, so a `<` in a name
is shown, never parsed. The markdown page carries the same tables and links the PNG files next to it.
A results file that spans several GPU kinds (a Ray sweep across a fleet) adds a section with the same cell on each
kind side by side, a GPU column to the table of every cell, and one line of claims per kind.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from attnprof.files import write_atomic
from attnprof.report import bench_tables as T
from attnprof.report.plots import PLOTS, render
from attnprof.report.render import md_escape, md_table

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#1d1d1f;
padding:0 16px}
.warn{color:#a15c00}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.meta{color:#555;font-size:12px}.meta code{background:#f3f3f3;padding:1px 4px;border-radius:3px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:16px}
figure{margin:0;border:1px solid #e3e3e3;border-radius:6px;padding:8px;background:#fff}
figure img{width:100%;height:auto;display:block}figcaption{font-size:12px;color:#555;margin-top:4px}
table{border-collapse:collapse;font-size:12px;width:100%}th,td{border-bottom:1px solid #eee;padding:3px 6px;
text-align:left;vertical-align:top}th{background:#fafafa;position:sticky;top:0}td.num{text-align:right;
font-variant-numeric:tabular-nums}tr.oom td,tr.error td,tr.failed td{background:#fff1f1}tr.rejected td{background:#f6f6f6;color:#666}
ul.claims li{margin:2px 0}
"""

_NUMERIC = {3, 4, 5, 6, 7, 8, 9, 10, 11}


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _prov(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return next((r.get("provenance") or {} for r in rows if r.get("provenance")), {})


def _devices(rows: list[dict[str, Any]]) -> str:
    return ", ".join(dict.fromkeys(str((r.get("provenance") or {}).get("device")) for r in rows)) or "unknown"


def subtitle(rows: list[dict[str, Any]]) -> str:
    p = _prov(rows)
    parts = [_devices(rows)] + [f"{k} {p[v]}" for k, v in (("torch", "torch"), ("CUDA", "cuda"), ("cuDNN", "cudnn"),
                                                            ("git", "git_sha")) if p.get(v)]
    return " · ".join(parts + ["attnprof.bench/1"])


def page(rows: list[dict[str, Any]], pngs: dict[str, bytes], source: str, machine: dict | None = None) -> str:
    """The whole HTML document as a string."""
    p = _prov(rows)
    argv = " ".join(str(a) for a in p.get("argv") or [])
    meta = [("device", _devices(rows)), ("torch", p.get("torch")), ("CUDA", p.get("cuda")), ("cuDNN", p.get("cudnn")),
            ("Triton", p.get("triton")), ("git", p.get("git_sha")), ("seed", p.get("seed")),
            ("measured", p.get("time_utc")), ("results", source), ("command", argv)]
    out = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{_e('attnprof bench: ' + _devices(rows))}</title>", f"<style>{_CSS}</style></head><body>",
           "<h1>attnprof bench</h1>",
           '<p class="meta">' + " · ".join(f"{_e(k)} <code>{_e(v)}</code>" for k, v in meta if v not in (None, ""))
           + "</p>",
           f"<p>{_e(T.ceilings_line(rows))}</p>"]
    if (machine or {}).get("reason"):
        out.append(f'<p class="warn"><strong>{_e(machine["reason"])}</strong></p>')
    claims = T.headline(rows, (machine or {}).get("short"))
    if claims:
        out.append('<h2>What this machine shows</h2><ul class="claims">'
                   + "".join(f"<li>{_e(c)}</li>" for c in claims) + "</ul>")
    out.append('<h2>Pictures</h2><div class="grid">')
    for name, caption in PLOTS:
        if name in pngs:
            data = base64.b64encode(pngs[name]).decode("ascii")
            out.append(f'<figure><img alt="{_e(caption)}" src="data:image/png;base64,{data}">'
                       f"<figcaption>{_e(caption)}</figcaption></figure>")
    out.append("</div>")
    both = T.side_by_side(rows)
    if both is not None:
        heads, body = both
        out.append(f"<h2>The same cell on each GPU kind ({len(heads) - 2} kinds)</h2><table><thead><tr>"
                   + "".join(f"<th>{_e(h)}</th>" for h in heads) + "</tr></thead><tbody>")
        out.extend("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in line) + "</tr>" for line in body)
        out.append("</tbody></table>")
    heads, body = T.table(rows)
    shift = len(heads) - len(T.HEADERS)  # the GPU column, when there is one
    out.append(f"<h2>Every cell ({len(rows)})</h2><table><thead><tr>"
               + "".join(f"<th>{_e(h)}</th>" for h in heads) + "</tr></thead><tbody>")
    for r, line in zip(rows, body):
        tds = "".join(f'<td class="num">{_e(c)}</td>' if i - shift in _NUMERIC else f"<td>{_e(c)}</td>"
                      for i, c in enumerate(line))
        out.append(f'<tr class="{_e(r["status"])}">{tds}</tr>')
    out.append("</tbody></table>")
    out.append('<p class="meta">FLOPs: 4·B·H·Sq·Sk·D, halved when causal (the FlashAttention benchmarks\' '
               "convention). Minimum bytes: q, k, v read once and the output written once. Latency: device events "
               "(CUDA) or perf_counter (CPU), p50 of the reps with p20–p80 beside it, L2 flushed between reps on CUDA. "
               "Peak memory: the most allocated during one call above the inputs. Ceilings: measured on this device "
               "by <code>attnprof ceilings</code>, never taken from a datasheet.</p>")
    out.append("</body></html>\n")
    return "\n".join(out)


def markdown(rows: list[dict[str, Any]], source: str, machine: dict | None = None) -> str:
    p = _prov(rows)
    argv = " ".join(str(a) for a in p.get("argv") or [])
    lines = ["# attnprof bench", "", f"{md_escape(subtitle(rows))}", "", f"Results: `{source}`  ",
             f"Command: `{argv}`", "", md_escape(T.ceilings_line(rows)), ""]
    if (machine or {}).get("reason"):
        lines += [f"**{md_escape(machine['reason'])}**", ""]
    claims = T.headline(rows, (machine or {}).get("short"))
    if claims:
        lines += ["## What this machine shows", ""] + [f"- {md_escape(c)}" for c in claims] + [""]
    lines += ["## Pictures", ""] + [f"![{md_escape(cap)}]({name})" for name, cap in PLOTS] + [""]
    both = T.side_by_side(rows)
    if both is not None:
        lines += [f"## The same cell on each GPU kind ({len(both[0]) - 2} kinds)", "", md_table(*both), ""]
    lines += [f"## Every cell ({len(rows)})", "", md_table(*T.table(rows)), ""]
    return "\n".join(lines)


def write_report(rows: list[dict[str, Any]], folder: Path, source: str, machine: dict | None = None) -> list[Path]:
    """PNGs, report.html and report.md into `folder` (each written atomically); returns the paths. `machine` is the
    sweep's `bench.stability` verdict (`results.machine.json`): when it flagged the machine, both pages say so and
    every speedup carries it."""
    folder = Path(folder)
    pngs = render(rows, subtitle(rows))
    paths = [write_atomic(folder / name, data) for name, data in pngs.items()]
    paths.append(write_atomic(folder / "report.html", page(rows, pngs, source, machine)))
    paths.append(write_atomic(folder / "report.md", markdown(rows, source, machine)))
    return paths
