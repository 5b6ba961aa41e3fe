"""`attnprof serve` in the terminal: tables that fit 80 columns, the reasons below them; `--wide` for every column.

The compact tables keep what a person compares across implementations: tokens/s, the attention share, the gain over
eager and the price (prefill and decode); output tokens/s, TTFT and ITL p50, the gain and the price (continuous
batching). A row that did not run says its status in the table and its reason below it, once per implementation and
reason. The answer is wrapped to 80 columns. `--wide` prints the full tables (serve.md has them too).
"""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from attnprof.report.render import compact_table, fit_columns, fmt, left_out, out, say
from attnprof.report.serve_report import STREAM_HEAD, _pct, _static_rows, _stream_rows, _x, chunked_prefill, static_head

STYLE = {"rejected": "yellow", "error": "red", "oom": "red"}
STATIC = ["impl", "batch", "context", "status", "tok/s", "attn %", "× eager", "$/1M"]
STREAM = ["impl", "ran as", "done", "status", "out tok/s", "TTFT p50", "ITL p50", "× eager", "$/1M out"]
# most important first: what fit_columns drops last
KEEP = {"static": STATIC, "stream": ["impl", "status", "out tok/s", "× eager", "$/1M out", "TTFT p50", "ITL p50",
                                     "ran as", "done"]}


def _static(rows: list[dict], mode: str) -> list[list[str]]:
    key = "usd_per_m_input" if mode == "prefill" else "usd_per_m_output"
    return [[r["impl"], str(r["batch"]), str(r["context"]), r["status"]]
            + ([f"{r['tokens_per_s']:,.0f}", _pct(r.get("attention_share")), _x(r.get("gain_over_eager")),
                fmt((r.get("cost") or {}).get(key), ".3g")] if r["status"] == "ok" else [""] * 4) for r in rows]


def _stream(rows: list[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        head = [r["impl"], r.get("ran_as") or "–", f"{r.get('completed', 0)}/{r['requests']}", r["status"]]
        if r["status"] != "ok":
            out.append(head + [""] * 5)
            continue
        t, i = r.get("ttft_ms") or {}, r.get("itl_ms") or {}
        out.append(head + [f"{r['output_tokens_per_s']:,.0f}", fmt(t.get("p50"), ".4g"), fmt(i.get("p50"), ".3g"),
                           _x(r.get("gain_over_eager")), fmt((r.get("cost") or {}).get("usd_per_m_output"), ".3g")])
    return out


def _compact(title: str, headers: list[str], body: list[list[str]], rows: list[dict], keep: list[str]) -> None:
    body = [[escape(c) for c in row] for row in body]  # cells are markup: "paged|sdpa" is not, "[x]" would be
    names, body, hidden = fit_columns(headers, body, keep, cuts={"impl": 16, "ran as": 14})
    say(title, style="bold")
    out.print(compact_table("", names, body, styles=[STYLE.get(r["status"]) for r in rows],
                            right=tuple(h for h in headers if h not in ("impl", "ran as", "status"))))
    reasons: dict[tuple[str, str], list[str]] = {}  # (status, reason) → the implementations it stopped
    for r in rows:
        if r["status"] != "ok" and r.get("reason"):
            names_ = reasons.setdefault((r["status"], r["reason"]), [])
            names_ += [r["impl"]] if r["impl"] not in names_ else []
    for (status, why), impls in reasons.items():
        say(f"{', '.join(impls)} {status}: {why}", style=STYLE.get(status))
    left_out(hidden, "--wide, serve.md")


def _wide(title: str, headers: list[str], body: list[list]) -> None:
    table = Table(title=title)
    for h in headers:
        table.add_column(h)
    for row in body:
        table.add_row(*[escape(str(c)) for c in row])
    out.print(table)


def print_terminal(data: dict, *, wide: bool = False) -> None:
    """Every mode's table, per loop, and the answer (see the module docstring)."""
    name = f"{data['model']['name']}, {data['model']['dtype']}"
    loops = [("", data)] + ([(" [production]", data["production"])] if data.get("production") else [])
    for tag, part in loops:
        for mode in ("prefill", "decode"):
            rows = part.get(mode) or []
            if not rows:
                continue
            title = f"{mode}{tag} ({name})"
            if wide:
                _wide(title, static_head(mode), _static_rows(rows, mode))
            else:
                _compact(title, STATIC, _static(rows, mode), rows, KEEP["static"])
            if chunked := chunked_prefill(rows):
                say(chunked, wide=wide)
        rows = part["continuous"]["results"]
        if rows:
            title = f"continuous batching{tag}"
            if wide:
                _wide(title, STREAM_HEAD, _stream_rows(rows))
            else:
                _compact(title, STREAM, _stream(rows), rows, KEEP["stream"])
        say(("production loop: " if tag else "") + part["answer"], wide=wide)
