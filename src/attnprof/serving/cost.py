"""What a token costs: dollars per million tokens and GPU-hours per billion, from a price per GPU-hour.

A GPU-hour is paid whether it computes attention or waits; so the cost of a token is the price of the hour divided
by the tokens that hour produced at the measured rate. Which tokens carry the hour depends on the mode: a prefill
run is charged to its input (prompt) tokens, a decode run to its output tokens, and a continuous-batching run to its
output tokens (the usual way a serving bill is read; the prompt work is inside that price), with $/1M of all tokens
processed (input + output) given next to it for comparison.

The default price is an assumed round number for one rented H200, not a quote: pass your own `--gpu-hour-price`.
"""

from __future__ import annotations

import math

from attnprof.errors import UsageError
from attnprof.serving.lost_time import where_time_was_lost

DEFAULT_GPU_HOUR_PRICE = 3.50  # USD per GPU-hour; an assumption, stated wherever it is used


def check_price(price: float) -> float:
    if not isinstance(price, (int, float)) or not math.isfinite(price) or price <= 0:
        raise UsageError(f"--gpu-hour-price must be a positive number of dollars per GPU-hour, got {price}")
    return float(price)


def usd_per_million(tokens_per_s: float, price: float) -> float | None:
    """Dollars per 1M tokens at `tokens_per_s` on one GPU costing `price` per hour; None when nothing was made."""
    if tokens_per_s <= 0:
        return None
    return price / (tokens_per_s * 3600.0) * 1e6


def gpu_hours_per_billion(tokens_per_s: float) -> float | None:
    if tokens_per_s <= 0:
        return None
    return 1e9 / (tokens_per_s * 3600.0)


def cost_block(mode: str, price: float, *, tokens_per_s: float = 0.0, output_tokens_per_s: float = 0.0,
               total_tokens_per_s: float = 0.0) -> dict:
    """The cost fields for one measured point of `mode` ("prefill", "decode" or "continuous")."""
    if mode == "prefill":
        return {"charged_to": "input", "usd_per_m_input": usd_per_million(tokens_per_s, price),
                "gpu_hours_per_b_input": gpu_hours_per_billion(tokens_per_s)}
    if mode == "decode":
        return {"charged_to": "output", "usd_per_m_output": usd_per_million(tokens_per_s, price),
                "gpu_hours_per_b_output": gpu_hours_per_billion(tokens_per_s)}
    if mode == "continuous":
        return {"charged_to": "output", "usd_per_m_output": usd_per_million(output_tokens_per_s, price),
                "gpu_hours_per_b_output": gpu_hours_per_billion(output_tokens_per_s),
                "usd_per_m_total": usd_per_million(total_tokens_per_s, price),
                "gpu_hours_per_b_total": gpu_hours_per_billion(total_tokens_per_s)}
    raise ValueError(f"unknown mode {mode!r}")


def gain(rate: float, baseline_rate: float) -> float | None:
    """How many times the baseline's tokens/s (so also how many times cheaper per token); None without both."""
    if rate <= 0 or baseline_rate <= 0:
        return None
    return rate / baseline_rate


# ---------------------------------------------------------------------------------------- gains and the answer --

def annotate_static(rows: list[dict], mode: str, price: float, baseline: str = "eager") -> list[dict]:
    """Add cost, gain over `baseline` at the same (batch, context) and the Amdahl prediction to prefill/decode rows."""
    from attnprof.serving.throughput import amdahl

    base = {(r["batch"], r["context"]): r for r in rows if r["impl"] == baseline and r["status"] == "ok"}
    for r in rows:
        r["cost"] = cost_block(mode, price, tokens_per_s=r["tokens_per_s"]) if r["status"] == "ok" else None
        b = base.get((r["batch"], r["context"]))
        r["gain_over_eager"] = gain(r["tokens_per_s"], b["tokens_per_s"]) if b and r["status"] == "ok" else None
        r["amdahl_predicted"] = None
        if r["impl"] != baseline and r["gain_over_eager"] is not None and b.get("share") and r.get("share") and b["attention_share"]:
            r["amdahl_predicted"] = amdahl(b["attention_share"], b["share"]["attention_ms"],
                                           r["share"]["attention_ms"])
    return rows


def annotate_stream(rows: list[dict], price: float, baseline: str = "eager") -> list[dict]:
    base = next((r for r in rows if r["impl"] == baseline and r["status"] == "ok" and r["completed"]), None)
    for r in rows:
        ok = r["status"] == "ok" and r["completed"] > 0
        r["cost"] = cost_block("continuous", price, output_tokens_per_s=r["output_tokens_per_s"],
                               total_tokens_per_s=r["total_tokens_per_s"]) if ok else None
        r["gain_over_eager"] = gain(r["output_tokens_per_s"], base["output_tokens_per_s"]) if ok and base else None
    return rows


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}×" if abs(hi - lo) < 0.005 else f"{lo:.2f}–{hi:.2f}×"


def _best(rows: list[dict]) -> str | None:
    """The non-eager implementation with the highest median gain."""
    by: dict[str, list[float]] = {}
    for r in rows:
        if r["impl"] != "eager" and r.get("gain_over_eager"):
            by.setdefault(r["impl"], []).append(r["gain_over_eager"])
    if not by:
        return None
    return max(by, key=lambda k: sorted(by[k])[len(by[k]) // 2])


def answer(prefill: list[dict], decode: list[dict], stream: list[dict], price: float,
           span_s: float | None = None) -> str:
    """A plain answer to "does the attention gain survive a real serving loop, and what does a token cost?",
    computed from the rows (never pre-written). The verdict uses the same gains the answer prints: "Yes" needs the
    stream's gain ≥ 1.1×; when the stream's gain and the same implementation's static prefill/decode gains straddle
    1.0× (faster in one, slower in another) the answer is "Inconclusive", never "Yes" (one stream has no spread)."""
    parts: list[str] = []
    static_gains: dict[str, list[float]] = {}  # impl → its gains over eager in prefill and decode
    for rows in (prefill, decode):
        for r in rows:
            if r["impl"] != "eager" and r.get("gain_over_eager"):
                static_gains.setdefault(r["impl"], []).append(r["gain_over_eager"])
    for mode, rows in (("prefill", prefill), ("decode", decode)):
        impl = _best(rows)
        if impl is None:
            continue
        mine = [r for r in rows if r["impl"] == impl and r.get("gain_over_eager")]
        gains = [r["gain_over_eager"] for r in mine]
        shares = [r["attention_share"] for r in rows if r["impl"] == "eager" and r.get("attention_share") is not None]
        pred = [r["amdahl_predicted"] for r in mine if r.get("amdahl_predicted")]
        text = f"{mode}: {impl} runs at {_span(gains)} eager's tokens/s"
        ooms = [f"{r['impl']} at batch {r['batch']} context {r['context']}" for r in rows if r["status"] == "oom"]
        if ooms:
            text += f" (out of memory: {', '.join(ooms)})"
        if shares:
            lo, hi = f"{min(shares):.0%}", f"{max(shares):.0%}"
            text += f"; attention was {lo if lo == hi else f'{lo}–{hi}'} of eager's step"
        if pred:
            text += f", so Amdahl's law predicts {_span(pred)}"
        parts.append(text + ".")
        lost = where_time_was_lost(rows)
        if lost:
            parts.append(lost)
    verdict, text = _stream_verdict(stream, static_gains, span_s)
    if text:
        parts.append(text)
    if verdict is None and static_gains:
        every = [g for gains in static_gains.values() for g in gains]
        verdict = (f"In static batches the gain is {_span(every)}; the continuous-batching loop was not run "
                   "or no implementation completed it, so this run cannot say whether it survives.")
    costs = _cost_sentence(prefill, decode, stream, price)
    head = [verdict] if verdict else []
    return " ".join(head + parts + ([costs] if costs else []))


def _stream_verdict(stream: list[dict], static_gains: dict[str, list[float]], span_s: float | None):
    """(verdict, description) for the continuous-batching rows; (None, "") when there is nothing to compare."""
    e = next((r for r in stream if r["impl"] == "eager"), None)
    others = [r for r in stream if r["impl"] != "eager" and r["status"] == "ok" and r["completed"]]
    if e is None or not others:
        return None, ""
    fails = [f"{r['impl']} {r['failed']}/{r['requests']}" for r in stream if r.get("failed")]
    failed = f"failed requests: {', '.join(fails) if fails else 'none'}"
    def against(impl: str) -> str:
        return f", against {_span(static_gains[impl])} in static prefill/decode" if static_gains.get(impl) else ""

    if e["status"] != "ok" or not e["completed"]:
        best = max(others, key=lambda r: r["output_tokens_per_s"])
        why = (e.get("failures") or [{}])[0].get("error") or e.get("reason") or "no request completed"
        return (f"Eager could not serve the stream at all ({why}); {best['impl']} served it at "
                f"{best['output_tokens_per_s']:.0f} output tokens/s, so in this loop the fused attention is the "
                f"difference between serving and not{against(best['impl'])}.", f"continuous batching: {failed}.")
    s = max(others, key=lambda r: r.get("gain_over_eager") or 0.0)
    g = s["gain_over_eager"]
    text = (f"continuous batching ({s['requests']} requests): {s['impl']} serves {s['output_tokens_per_s']:.0f} "
            f"output tokens/s, {g:.2f}× eager's {e['output_tokens_per_s']:.0f}")
    if s["ttft_ms"] and e["ttft_ms"]:
        text += (f"; TTFT p50 {s['ttft_ms']['p50']:.0f} ms vs {e['ttft_ms']['p50']:.0f} ms, ITL p50 "
                 f"{s['itl_ms']['p50']:.1f} ms vs {e['itl_ms']['p50']:.1f} ms")
    text += f"; {failed}."
    # A stream lighter than the server finishes right after its last arrival whatever the kernel: then tokens/s is
    # the arrival rate, and the inter-token latency is what the implementation changed.
    arrival_bound = bool(span_s) and all(r["seconds"] < 1.2 * span_s for r in (s, e))
    measure = "in output tokens/s"
    if arrival_bound and s["itl_ms"] and e["itl_ms"]:
        text += (f" Both finished within 20% of the {span_s:.1f} s arrival span, so tokens/s is set by the arrivals; "
                 "the inter-token latency is the measure here.")
        g, measure = e["itl_ms"]["p50"] / s["itl_ms"]["p50"], "in inter-token latency (p50)"
    static = static_gains.get(s["impl"]) or []
    if static and min(g, *static) < 1.0 < max(g, *static):
        # the numbers this answer prints point both ways: one stream has no spread of its own to break the tie
        return (f"Inconclusive: {s['impl']} runs at {g:.2f}× eager {measure} in the serving loop but at "
                f"{_span(static)} eager in static prefill/decode; these measurements straddle 1.0× (one stream per "
                "implementation has no spread of its own): re-run on a quiet machine, with more requests."), text
    if g >= 1.1:
        verdict = f"Yes: the attention gain survives the serving loop ({s['impl']} {g:.2f}× eager {measure}"
    elif g > 0.95:
        verdict = f"Mostly not: in the serving loop the gain shrinks to {g:.2f}× {measure} (within noise of eager"
    else:
        verdict = f"No: in the serving loop {s['impl']} is slower than eager ({g:.2f}× {measure}"
    if e.get("failed"):
        verdict += f"; eager also failed {e['failed']} of {e['requests']} requests"
    return verdict + against(s["impl"]) + ").", text


def _cost_sentence(prefill: list[dict], decode: list[dict], stream: list[dict], price: float) -> str:
    """Each implementation's $/1M tokens: under continuous batching, and in decode / prefill at the largest cell."""
    bits = []
    stream_ok = [r for r in stream if r.get("cost") and r["cost"]["usd_per_m_output"]]
    if stream_ok:
        bits.append("under continuous batching " + ", ".join(
            f"${r['cost']['usd_per_m_output']:.3g} ({r['impl']})" for r in stream_ok) + " per 1M output tokens")
    for mode, rows, key, tok, axes in (("decode", decode, "usd_per_m_output", "output", ("batch", "context")),
                                       ("prefill", prefill, "usd_per_m_input", "input", ("context", "batch"))):
        ok = [r for r in rows if r.get("cost")]
        if not ok:
            continue
        top = max((r[axes[0]], r[axes[1]]) for r in ok)  # the largest cell: one row per implementation
        cell = [r for r in ok if (r[axes[0]], r[axes[1]]) == top]
        where = f"{axes[0]} {top[0]}" + (f", {axes[1]} {top[1]}" if len({r[axes[1]] for r in ok}) > 1 else "")
        bits.append(f"in {mode} at {where} " + ", ".join(f"${r['cost'][key]:.3g} ({r['impl']})" for r in cell)
                    + f" per 1M {tok} tokens")
    if not bits:
        return ""
    return f"A token costs, at ${price:.2f} per GPU-hour: " + "; ".join(bits) + "."
