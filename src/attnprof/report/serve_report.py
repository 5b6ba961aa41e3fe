"""The `serve` report: a markdown summary that opens with the answer and two pictures (the terminal's tables are
`serve_terminal.py`).

Everything here reads the `attnprof.serve/1` dict the command wrote, so a report can be re-rendered from a saved
file. Pictures: tokens/s against batch (decode) and context (prefill) per implementation; the continuous-batching
latency percentiles (TTFT, ITL at p50 and p99) per implementation.
"""

from __future__ import annotations

import io
from pathlib import Path

from attnprof.files import write_atomic
from attnprof.report.render import env_note, fmt, md_table


def _pct(x) -> str:
    return "–" if x is None else f"{x:.0%}"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n:,}"


def _x(x) -> str:
    return "–" if x is None else f"{x:.2f}×"


def _roles(share: dict | None) -> str:
    if not share or not share.get("roles"):
        return "–"
    roles = sorted(share["roles"].items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{k} {v:.3g}" for k, v in roles[:4])
    return text + (f" [{'/'.join(share['backends'])}]" if share.get("backends") else "")


def _attention_ms(share: dict) -> str:
    """GPU kernel time / host time of the attention calls per step (one number on the CPU, where they are one)."""
    gpu, host = share.get("attention_ms"), share.get("attention_host_ms")
    if share.get("basis") == "cpu-ops" or host is None:
        return fmt(gpu, ".3g")
    return f"{fmt(gpu, '.3g')} / {fmt(host, '.3g')}"


def _p50_p99(q: dict | None) -> str:
    q = q or {}
    return "–" if not q else f"{fmt(q.get('p50'), '.3g')} / {fmt(q.get('p99'), '.3g')}"


def _cold_step(share: dict | None) -> str:
    """A cold profiled decode step: its wall time / the host time inside its attention calls (ms)."""
    if not share:
        return "–"
    return f"{fmt(share.get('step_wall_ms'), '.3g')} / {fmt(share.get('attention_host_ms'), '.3g')}"


def _static_rows(rows: list[dict], mode: str) -> list[list]:
    """One table row per point; decode rows carry two more cells (see `static_head`)."""
    key = "usd_per_m_input" if mode == "prefill" else "usd_per_m_output"
    hkey = "gpu_hours_per_b_input" if mode == "prefill" else "gpu_hours_per_b_output"
    decode = mode == "decode"
    out = []
    for r in rows:
        if r["status"] != "ok":
            out.append([r["impl"], r["batch"], r["context"], r["status"], r["reason"] or ""]
                       + ["–"] * (10 if decode else 8))
            continue
        share = r.get("share") or {}
        cost = r.get("cost") or {}
        lat = [_p50_p99(r["itl_ms"]), _p50_p99(r.get("itl_repeat_ms"))] if decode else [fmt(r["step_ms"], ".3g")]
        attn = [_attention_ms(share)] + ([_cold_step(r.get("cold_share"))] if decode else [])
        out.append([r["impl"], r["batch"], r["context"], f"{r['tokens_per_s']:,.0f}", *lat,
                    _pct(r.get("attention_share")), *attn, _roles(share),
                    _x(r.get("gain_over_eager")), _x(r.get("amdahl_predicted")), fmt(cost.get(key), ".3g"),
                    fmt(cost.get(hkey), ".3g"), fmt(r.get("peak_mib"), ".0f")])
    return out


def _stream_rows(rows: list[dict]) -> list[list]:
    out = []
    for r in rows:
        if r["status"] != "ok":
            out.append([r["impl"], "–", f"0/{r['requests']}", "–", r["reason"] or ""] + ["–"] * 7)
            continue
        cost = r.get("cost") or {}
        t, i = r.get("ttft_ms") or {}, r.get("itl_ms") or {}
        out.append([r["impl"], r["ran_as"], f"{r['completed']}/{r['requests']}", r["failed"],
                    f"{r['output_tokens_per_s']:,.0f}", f"{r['total_tokens_per_s']:,.0f}",
                    f"{fmt(t.get('p50'), '.4g')} / {fmt(t.get('p99'), '.4g')}",
                    f"{fmt(i.get('p50'), '.3g')} / {fmt(i.get('p99'), '.3g')}", _x(r.get("gain_over_eager")),
                    fmt(cost.get("usd_per_m_output"), ".3g"), fmt(cost.get("usd_per_m_total"), ".3g"),
                    fmt(cost.get("gpu_hours_per_b_output"), ".3g")])
    return out


STATIC_HEAD = ["impl", "batch", "context", "tokens/s", "{lat}", "attention share", "attention ms/step (GPU / host)",
               "attention kernels by role (ms)", "gain over eager", "Amdahl predicts", "$/1M {tok}",
               "GPU-h/1B {tok}", "peak MiB"]
DECODE_LAT = ["ITL p50 / p99 ms, first pass", "ITL p50 / p99 ms, repeat pass"]
COLD_STEP = "cold step ms (wall / attention host)"


def static_head(mode: str) -> list[str]:
    """The prefill / decode table's columns: decode times the first and the repeat pass and adds the cold step."""
    if mode == "prefill":
        return [h.format(lat="step ms", tok="input") for h in STATIC_HEAD]
    head = [h.format(tok="output") for h in STATIC_HEAD if h != "{lat}"]
    head[4:4] = DECODE_LAT
    head.insert(head.index("attention ms/step (GPU / host)") + 1, COLD_STEP)
    return head
STREAM_HEAD = ["impl", "ran as", "completed", "failed", "output tok/s", "all tok/s", "TTFT p50 / p99 ms",
               "ITL p50 / p99 ms", "gain over eager", "$/1M output", "$/1M all", "GPU-h/1B output"]


def _ran_somewhere(data: dict) -> set[str]:
    """Implementations with at least one `ok` row in any loop and mode (so a static-batch refusal is not "not run")."""
    names: set[str] = set()
    for part in (data, data.get("production") or {}):
        rows = [*(part.get("prefill") or []), *(part.get("decode") or [])]
        stream = part.get("continuous") or {}
        rows += stream.get("results", []) if isinstance(stream, dict) else list(stream)
        names |= {r.get("impl") for r in rows if isinstance(r, dict) and r.get("status") == "ok"}
    return names


def markdown(data: dict) -> str:
    m, prov = data["model"], data["provenance"]
    lines = [f"# Serving {m['name']} on {prov['device']}: attention implementations end to end", "",
             "**Does the attention gain survive a real serving loop, and what does a token cost?** "
             + ("As-shipped loop: " if data.get("production") else "") + data["answer"]
             + (f" Production loop: {data['production']['answer']}" if data.get("production") else ""),
             "", f"Command: `{data['command']}`", "",
             f"Model: {m['name']}, {_count(m['params'])} parameters, {m['layers']} layers, {m['heads']} query / "
             f"{m['kv_heads']} KV heads of dim {m['head_dim']}, {m['dtype']}, {m['weights']}.  ",
             f"Price: ${data['gpu_hour_price']:.2f} per GPU-hour ({data['price_note']})."]
    if env_note(prov):
        lines += ["", env_note(prov)]
    rejected = [i for i in data["impls"] if i["reason"]]
    ran = _ran_somewhere(data)
    not_run = [i["reason"] for i in rejected if i["name"] not in ran]
    static_only = [i["reason"] for i in rejected if i["name"] in ran]
    if not_run:
        lines += ["", "Not run: " + "; ".join(not_run) + "."]
    if static_only:  # e.g. SDPA pinned to mem-efficient refuses GQA in a static batch, runs paged with K/V repeated
        lines += ["", "Refused in static batches, ran in continuous batching: " + "; ".join(static_only) + "."]
    if "as-shipped" in data.get("loops", ["as-shipped"]):
        lines += _loop_sections(data, "as-shipped")
    if data.get("production"):
        lines += _loop_sections(data["production"], "production")
    lines += ["", "## How to read this", "",
              "- Tokens are counted from what the model returned (the KV cache length for prefill, the output ids "
              "for decode, each request's generated tokens in continuous batching), never from what was asked.",
              "- Attention share: time of the kernels launched inside the model's attention function (profiler, "
              "classified by role) over the wall time of the step. Amdahl predicts the end-to-end gain from that "
              "share and the attention time alone: 1 / (1 − share · (1 − t_impl / t_eager)). A measured gain below "
              "the prediction means the rest of the step (launches, sync, the loop) did not shrink with it. On a GPU the "
              "attention column also gives the host time spent inside the attention calls (under the profiler); "
              "when an implementation is slower than eager, the answer compares that host time, the GPU's busy "
              "time and the profiled step's wall time with eager's to say where the lost time went.",
              "- Decode is timed twice with the same `generate` call: the first pass meets its KV lengths for the "
              "first time (tokens/s, cost and gains come from it), the repeat pass meets them again. The attention "
              "columns are profiled warm (KV lengths already seen); the cold step is profiled on a prompt whose KV "
              "lengths this point had not used. A first pass much slower than the repeat, with a cold step whose "
              "attention calls take far more host time than warm ones, is a cost paid once per new shape inside "
              "attention.",
              "- Cost: price per GPU-hour ÷ tokens made in that hour. Prefill is charged to input tokens, decode and "
              "continuous batching to output tokens ($/1M all counts input + output, for comparison).",
              "", "## Provenance", "", "```",
              *(f"{k}: {v}" for k, v in prov.items() if k != "argv"), "```", ""]
    if data.get("pictures"):
        lines[-1:-1] = [""] + [f"![{p}]({p})" for p in data["pictures"]]
    return "\n".join(lines)


def chunked_prefill(rows: list[dict]) -> str | None:
    """The sentence naming the decode rows whose prompt was prefilled in chunks (`memory_fit.prefill_chunk`), or None:
    under the table in serve.md and in the terminal."""
    cells = [f"{r['impl']} {r['batch']} x {r['context']}: {r['prefill_chunk']}" for r in rows if r.get("prefill_chunk")]
    if not cells:
        return None
    return ("Prefilled in chunks of N tokens (the whole batch's prompt at once would not fit in memory beside its "
            "cache; ms/token is a difference of two calls, so the prefill's cost cancels): " + ", ".join(cells) + ".")


LOOP_TITLES = {
    "as-shipped": "as-shipped loop (transformers' defaults: dynamic cache, continuous batching without CUDA graphs)",
    "production": "production loop (decode in CUDA graphs: static cache + torch.compile reduce-overhead; continuous "
                  "batching with use_cuda_graph and its paged cache)",
}


def _loop_sections(data: dict, loop: str) -> list[str]:
    """The decode/prefill tables and the stream of one loop (`data` is the report or its `production` part)."""
    lines = ["", f"# The {LOOP_TITLES[loop]}"]
    if loop == "production" and data.get("answer"):
        lines += ["", "**Production loop:** " + data["answer"]]
    for mode, title in (("prefill", "Prefill: one forward over the prompt that fills the KV cache"),
                        ("decode", "Decode: `generate` with the KV cache, timed from the first to the last new token")):
        if data.get(mode):
            if loop == "production":
                title = ("Decode: `generate` with a static cache + torch.compile(mode=\"reduce-overhead\"), ms/token = "
                         "(t(N2) − t(N1)) / (N2 − N1) over whole calls, median of 3 pairs")
            lines += ["", f"## {title} [{loop}]", "", md_table(static_head(mode), _static_rows(data[mode], mode))]
            colds = [f"{r['impl']} {r['cold_s']:.2f} s" for r in data[mode] if r.get("cold_s") is not None]
            if colds:
                lines += ["", "Cold part, reported apart (the first call: compile, CUDA-graph capture, cuDNN plans "
                              "for the lengths met): " + ", ".join(colds) + "."]
            if chunked := chunked_prefill(data[mode]):
                lines += ["", chunked]
    stream = data["continuous"]
    if stream["stream"]:
        s = stream["stream"]
        src = (f"Poisson arrivals at {s['rate_per_s']:g}/s" if s["source"] == "poisson" else f"replayed from "
               f"{s['source']}")
        lines += ["", f"## Continuous batching: transformers' `init_continuous_batching` (paged KV cache) [{loop}]", "",
                  f"{s['requests']} requests, {src} over {s['span_s']:.1f} s; prompts p50 {s['prompt_tokens']['p50']}"
                  f" (max {s['prompt_tokens']['max']}, {s['prompt_tokens']['total']} in all), outputs p50 "
                  f"{s['output_tokens']['p50']} (max {s['output_tokens']['max']}, {s['output_tokens']['total']} "
                  f"in all); unfinished after {s['timeout_s']:g} s counts as failed.", "",
                  md_table(STREAM_HEAD, _stream_rows(stream["results"]))]
        vllm = _vllm_rows(stream["results"])
        if vllm:
            slo = s.get("slo") or {}
            said = ", ".join(f"{k[:-3].upper()} ≤ {v:g} ms" for k, v in slo.items() if v is not None)
            lines += ["", f"`vllm bench serve`'s metrics [{loop}] (vLLM's definitions, from the loop's per-token "
                          f"timestamps; ms as p50 / p90 / p99; goodput = requests/s meeting "
                          f"{said or 'an SLO: none given (--slo-ttft-ms, --slo-tpot-ms)'}):", "",
                      md_table(VLLM_HEAD, vllm)]
            lines += [""] + [_steady_line(r) for r in stream["results"] if r.get("metrics")]
        sweep = stream.get("sweep")
        if sweep:
            lines += ["", f"### Concurrency sweep [{loop}]: throughput per GPU against tokens/s per user", "",
                      "The same requests served closed-loop (the next one sent as soon as fewer than N are in flight); "
                      "tokens/s per user = 1000 / TPOT p50; * = on the implementation's Pareto front.", "",
                      md_table(SWEEP_HEAD, _sweep_rows(sweep))]
            lines += [f"- not run: {x['impl']} at concurrency {x['concurrency']}: {x['reason']}"
                      for x in sweep.get("not_run", [])]
        for r in stream["results"]:
            if r.get("failures"):
                first = r["failures"][0]
                lines += ["", f"{r['impl']}: {r['failed']} of {r['requests']} requests failed; first: request "
                              f"{first['request']}: {first['error']}"]
            if r.get("log_errors"):
                lines += [f"{r['impl']}: transformers logged: " + " / ".join(r["log_errors"][:3])]
            if r.get("short"):
                lines += [f"{r['impl']}: {r['short']} requests returned fewer tokens than asked."]
    return lines


VLLM_HEAD = ["impl", "completed / failed", "requests/s", "output tok/s", "total tok/s", "TTFT", "TPOT", "ITL", "E2EL",
             "goodput req/s", "peak output tok/s (1 s)", "peak concurrency", "CUDA graphs (asked / held)"]


def _dist(d: dict | None) -> str:
    return "–" if not d else f"{d['p50']:.3g} / {d['p90']:.3g} / {d['p99']:.3g}"


def _vllm_rows(rows: list[dict]) -> list[list]:
    out = []
    for r in rows:
        m = r.get("metrics")
        if not m:
            continue
        t, lat = m["throughput"], m["latency"]
        out.append([r["impl"], f"{m['completed']} / {m['failed']}", fmt(t["request_throughput"], ".3g"),
                    fmt(t["output_throughput"], ",.0f"), fmt(t["total_token_throughput"], ",.0f"),
                    _dist(lat["ttft_ms"]), _dist(lat["tpot_ms"]), _dist(lat["itl_ms"]), _dist(lat["e2el_ms"]),
                    fmt(t["request_goodput"], ".3g"), fmt(m["max_output_tokens_per_s"], ",.0f"),
                    m["max_concurrent_requests"],
                    f"{fmt((r.get('resolved') or {}).get('use_cuda_graph'))} / {fmt(r.get('graphs_captured'))}"])
    return out


SWEEP_HEAD = ["impl", "concurrency", "output tok/s per GPU", "tok/s per user", "$/1M output", "TTFT p50 ms",
              "TPOT p50 ms", "completed / failed"]


def _sweep_rows(sweep: dict) -> list[list]:
    front = sweep.get("pareto", {})
    return [[p["impl"], f"{p['load']:g}" + (" *" if p["load"] in front.get(p["impl"], []) else ""),
             fmt(p["output_tokens_per_s_per_gpu"], ",.0f"), fmt(p["tokens_per_s_per_user"], ".3g"),
             fmt(p["usd_per_m_output"], ".3g"), fmt(p["ttft_p50_ms"], ".3g"), fmt(p["tpot_p50_ms"], ".3g"),
             f"{p['completed']} / {p['failed']}"] for p in sweep["points"]]


def _steady_line(r: dict) -> str:
    """Steady state and the cold part, reported apart (ms as p50 / p90 / p99)."""
    st = r.get("steady")
    if not st:
        return f"- {r['impl']}: no steady part ({r.get('steady_note') or 'not computed'})."
    lat, thr = st["steady_latency"], st["steady_throughput"]
    text = (f"- {r['impl']}, steady (after the first {st['warmup']}, window {st['window_s'][1] - st['window_s'][0]:.3g} s):"
            f" {fmt(thr['output_throughput'], ',.0f')} output tok/s, TTFT {_dist(lat['ttft_ms'])}, TPOT "
            f"{_dist(lat['tpot_ms'])}")
    cold = st.get("cold")
    if cold:
        c = cold["latency"]
        text += f"; cold part apart: TTFT {_dist(c['ttft_ms'])}, TPOT {_dist(c['tpot_ms'])}"
    return text + "."


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    _plt().close(fig)
    return buf.getvalue()


def write_plots(data: dict, folder: Path, stem: str) -> list[Path]:
    plt = _plt()
    written: list[Path] = []
    panels = [(mode, key) for mode, key in (("decode", "batch"), ("prefill", "context"))
              if any(r["status"] == "ok" for r in data[mode])]
    sub = f"{data['model']['name']} {data['model']['dtype']} on {data['provenance']['device']}"
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
        for ax, (mode, key) in zip(axes[0], panels):
            other = "context" if key == "batch" else "batch"
            series: dict[str, list[tuple[int, float]]] = {}
            for r in data[mode]:
                if r["status"] == "ok":
                    series.setdefault(f"{r['impl']} ({other} {r[other]})", []).append((r[key], r["tokens_per_s"]))
            for label, pts in sorted(series.items()):
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
            ax.set_xscale("log", base=2)
            ax.set_xlabel(key)
            ax.set_ylabel(f"{mode} tokens/s")
            ax.set_title(f"{mode} tokens/s against {key}", loc="left", fontsize=10)
            ax.grid(True, which="both", alpha=0.25)
            ax.legend(fontsize=8)
        fig.suptitle(sub, fontsize=8, x=0.01, ha="left")
        written.append(write_atomic(folder / f"{stem}-throughput.png", _png(fig)))
    ok = [r for r in data["continuous"]["results"] if r["status"] == "ok" and r.get("ttft_ms")]
    if ok:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, key, title in ((axes[0], "ttft_ms", "time to first token"), (axes[1], "itl_ms", "inter-token")):
            xs = range(len(ok))
            for j, q in enumerate(("p50", "p99")):
                ax.bar([x + 0.4 * j for x in xs], [r[key].get(q, 0) for r in ok], width=0.4, label=q)
            ax.set_xticks([x + 0.2 for x in xs], [r["impl"] for r in ok])
            ax.set_ylabel("ms")
            ax.set_title(f"continuous batching: {title} latency", loc="left", fontsize=10)
            ax.legend(fontsize=8)
        fig.suptitle(sub, fontsize=8, x=0.01, ha="left")
        written.append(write_atomic(folder / f"{stem}-latency.png", _png(fig)))
    return written


def json_line(data: dict, folder) -> dict:
    """The `--json` line: the answer and every row as serve.json has it, so a reader of stdout gets every metric the
    report has (tokens/s, attention share, cost, gains, TTFT, TPOT, ITL, E2EL, goodput under the SLO, the steady
    state, the load sweep), not a subset to keep in step with it."""
    line = {"schema": data["schema"], "out": str(folder), "answer": data["answer"], "loops": data.get("loops"),
            "prefill": data["prefill"], "decode": data["decode"], "continuous": data["continuous"]["results"]}
    if data["continuous"].get("sweep"):
        line["sweep"] = data["continuous"]["sweep"]
    prod = data.get("production")
    if prod:
        line["production"] = {"answer": prod["answer"], "decode": prod["decode"],
                              "continuous": prod["continuous"]["results"]}
        if prod["continuous"].get("sweep"):
            line["production"]["sweep"] = prod["continuous"]["sweep"]
    return line
