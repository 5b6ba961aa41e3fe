"""`attnprof serve` as a library call: one model, every implementation, the prefill and decode points and the request
stream, then the price of every token and the answer.

Each prefill or decode point goes through `run.attempt` (a failure is a row with its status and reason, and the
other points still run), so does each stream. `serve(settings, impls)` returns the `attnprof.serve/1` dict;
`errors(data)` the one-line failures that make the command exit 1. Everything it measures is said by one
`serving.settings.ServeSettings`.
"""

from __future__ import annotations

from collections.abc import Callable

from attnprof.serving.loops import KV_SUFFIX, kv_row_name
from attnprof.serving.settings import ServeSettings


def steps(s: ServeSettings, impls) -> int:
    """How many progress steps `serve` reports: one per point and per stream."""
    points = len(s.cells("prefill")) if "prefill" in s.modes else 0
    points += len(s.loops) * len(s.cells("decode")) if "decode" in s.modes else 0
    kv_rows = len(s.cells("decode")) if s.kv_dtype else 0  # production decode over the FP8 cache, per impl
    streams = len(s.loops) * (1 + len(s.stream.sweep)) if s.stream is not None else 0
    return (points + kv_rows + streams) * len(impls)


def serve(s: ServeSettings, impls, *, on_progress: Callable[[str, bool], None] | None = None,
          note: Callable[[str], None] | None = None, checkpoint: Callable[[dict], None] | None = None) -> dict:
    """Measure every mode of `s` for every implementation; price it. `on_progress(description, advance)` reports
    each step, `note(text)` says what is being built, `checkpoint(data)` gets the rows so far after each row (see
    the module docstring)."""
    from attnprof.models import attention_workload, build_model

    progress = on_progress or (lambda description, advance: None)
    modes, device = list(s.modes), s.device
    if note is not None:
        note(f"{s.model} ({s.dtype}, random weights) on {device}; implementations: "
             f"{', '.join(i.name for i in impls)}")
    model = build_model(s.model, attn_implementation="eager", dtype=s.dtype, device=device, seed=s.seed)
    cfg = model.config
    shape = attention_workload(cfg, batch=1, seq=1, dtype=s.dtype, device=device)  # heads, kv heads, head dim
    data = {"schema": "attnprof.serve/1", "modes": modes,
            "model": {"name": s.model, "params": sum(p.numel() for p in model.parameters()),
                      "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "heads": shape.heads,
                      "kv_heads": shape.kv_heads, "head_dim": shape.head_dim,
                      "vocab": cfg.vocab_size, "max_positions": s.max_positions, "dtype": s.dtype,
                      "weights": "random (from config; nothing downloaded)"},
            "gpu_hour_price": s.price,
            "price_note": ("assumed default, not a quote; pass --gpu-hour-price" if s.price_is_default
                           else "given with --gpu-hour-price"),
            "impls": [{"name": i.name, "attn_implementation": i.attn_implementation, "reason": i.rejected}
                      for i in impls],
            "prefill": [], "decode": [], "continuous": {"stream": None, "results": []}}
    loops = list(s.loops)
    data["loops"] = loops
    if "production" in loops:
        data["production"] = {"decode": [], "continuous": {"stream": None, "results": []}}
    where = {"as-shipped": data, "production": data.get("production")}
    order = {impl.name: i for i, impl in enumerate(impls)}
    for mode in ("prefill", "decode"):
        if mode not in modes:
            continue
        for loop in (loops if mode == "decode" else ["as-shipped"]):
            if where[loop] is None or (mode == "prefill" and "as-shipped" not in loops):
                continue
            # cell by cell, every implementation in turn: a run stopped part-way (Ctrl-C, a time limit) leaves
            # whole comparisons in its partial file, not one implementation's rows without the others'
            for batch, context in s.cells(mode):
                for impl in impls:
                    label = f"{mode} {impl.name} ({loop}) batch {batch} context {context}"
                    progress(label, False)
                    point = _static_point(model, impl, mode, batch, context, s, loop)
                    where[loop][mode].append(point.to_json())
                    if checkpoint is not None:
                        checkpoint(data)
                    progress(label, True)
                if mode == "decode" and loop == "production" and s.kv_dtype:
                    for impl in impls:  # the same cell over the FP8 static cache
                        label = f"decode {kv_row_name(impl.name, s.kv_dtype)} (production) batch {batch} " \
                                f"context {context}"
                        progress(label, False)
                        point = _static_point(model, impl, mode, batch, context, s, loop, kv_dtype=s.kv_dtype)
                        where[loop][mode].append(point.to_json())
                        if checkpoint is not None:
                            checkpoint(data)
                        progress(label, True)
            # the tables list each implementation's rows, each one's FP8-cache rows after its own
            where[loop][mode].sort(key=lambda r: (order[r["impl"].split(KV_SUFFIX)[0]], KV_SUFFIX in r["impl"]))
    if s.stream is not None:
        for loop in loops:
            where[loop]["continuous"]["stream"] = s.stream.to_json()
            for impl in impls:
                res = _stream(model, impl, loop, s, progress)
                where[loop]["continuous"]["results"].append(res.to_json())
                if checkpoint is not None:
                    checkpoint(data)
                progress(f"continuous {impl.name} ({loop})", True)
            if s.stream.sweep:
                where[loop]["continuous"]["sweep"] = _sweep(model, impls, loop, s, progress)
                if checkpoint is not None:
                    checkpoint(data)
    _price(data, s.price)
    if "as-shipped" not in loops:
        data["answer"] = "the as-shipped loop was not asked for (--loop); see the production loop."
    if "production" in loops:
        prod = data["production"]
        _price(prod, s.price, "production")
        if not prod["answer"]:  # nothing of this loop ran: say why, never leave it blank
            rows = prod["decode"] + prod["continuous"]["results"]
            why = list(dict.fromkeys(r["reason"] for r in rows if r.get("reason")))
            prod["answer"] = "not measured: " + ("; ".join(why) if why else "no mode of this loop was asked for")
    return data


def _sweep(model, impls, loop: str, s: ServeSettings, progress) -> dict:
    """The same requests closed-loop at each concurrency, per implementation: `serving.sweep.Sweep` as JSON, plus
    the rows that could not run with their reasons."""
    from attnprof.serving.cost import usd_per_million
    from attnprof.serving.sweep import Sweep, SweepPoint

    points, skipped = [], []
    for impl in impls:
        for level in s.stream.sweep:
            res = _stream(model, impl, loop, s, progress, concurrency=level)
            progress(f"sweep {impl.name} ({loop}) concurrency {level}", True)
            m = res.metrics
            if res.status != "ok" or not m or not m["completed"]:
                skipped.append({"impl": impl.name, "concurrency": level, "status": res.status,
                                "reason": res.reason or (res.failures[0]["error"] if res.failures else "no request "
                                                         "completed")})
                continue
            out_tps = m["throughput"]["output_throughput"]
            tpot = (m["latency"]["tpot_ms"] or {}).get("p50")
            ttft = (m["latency"]["ttft_ms"] or {}).get("p50")
            points.append(SweepPoint(impl.name, level, out_tps, 1e3 / tpot if tpot else None,
                                     usd_per_million(out_tps, s.price), ttft, tpot, m["completed"], m["failed"]))
    return {**Sweep("concurrency", 1, s.price, tuple(points)).to_json(), "not_run": skipped}


def _stream(model, impl, loop: str, s: ServeSettings, progress, concurrency: int | None = None):
    """One implementation serving the stream in one loop, through `run.attempt` (a failure is a row)."""
    from attnprof.run import attempt
    from attnprof.serving.continuous import StreamResult, serve_stream
    from attnprof.serving.loops import on_masked_path, unavailable

    stream, device = s.stream, s.device
    reqs = list(stream.requests)
    progress(f"continuous {impl.name} ({loop}): {len(reqs)} requests", False)
    impl = on_masked_path(impl, model, device)  # CB always passes SDPA a mask: K/V repeated, no GQA
    why = impl.rejected or unavailable(loop, "continuous", device)
    attach = None
    if why is None and impl.name == "kernel":
        from attnprof.serving.flash_registration import hub_attention

        hub = hub_attention()
        why = hub.rejected
        attach = lambda m, hub=hub: hub.apply(m, paged=True)  # noqa: E731
    if why:
        return StreamResult(impl=impl.name, loop=loop, status="rejected", reason=why, requests=len(reqs))
    done = [0]

    def on_done():
        done[0] += 1
        progress(f"continuous {impl.name} ({loop}): {done[0]}/{len(reqs)} requests done", False)

    def go():
        if loop == "production" and device.startswith("cuda"):  # drop compiled generate's graphs and their pool
            import torch

            torch._dynamo.reset()
            model.__dict__.pop("_compiled_call", None)
        with impl.context():  # sdpa-<backend>: SDPA's flags are process-wide, the generation thread sees them
            return serve_stream(model, impl.name, reqs, device=device, seed=s.seed, timeout_s=stream.timeout_s,
                                num_blocks=stream.num_blocks, max_batch_tokens=stream.max_batch_tokens,
                                on_done=on_done, loop=loop, attach=attach, slo=stream.slo,
                                warmup_requests=stream.warmup_requests, concurrency=concurrency)

    got = attempt(go, device=device)  # a failure is a row with its reason; the command exits 1 after the report
    return got.value or StreamResult(impl=impl.name, loop=loop, status=got.status.value, reason=got.reason,
                                     requests=len(reqs))


def _static_point(model, impl, mode: str, batch: int, context: int, s: ServeSettings, loop: str = "as-shipped",
                  kv_dtype: str | None = None):
    """One prefill or decode measurement through `run.attempt`: a failure is a row with its status and reason.
    `kv_dtype` (production decode only): over an FP8 static cache, in a row named `kv_row_name`."""
    import dataclasses

    from attnprof.models.attention import fp8_cache_refusal
    from attnprof.models.features import refusal_on_forward, switch
    from attnprof.run import attempt
    from attnprof.serving.loops import measure_static_decode, on_masked_path, repeats_kv, unavailable
    from attnprof.serving.throughput import Point, measure_decode, measure_prefill

    device = s.device
    if loop == "production":  # the static cache always passes SDPA a mask: K/V repeated, no GQA
        impl = on_masked_path(impl, model, device)
    why = None
    if kv_dtype:
        why = fp8_cache_refusal(impl)
        impl = dataclasses.replace(impl, name=kv_row_name(impl.name, kv_dtype))


    def row(status: str, reason: str, **kw) -> Point:
        return Point(impl=impl.name, mode=mode, batch=batch, context=context, status=status, reason=reason, loop=loop,
                     kv_dtype=kv_dtype, **kw)

    why = why or impl.rejected or unavailable(loop, mode, device)
    if why:
        return row("rejected", why)
    from attnprof.memory_fit import model_point_misfit, prefill_chunk

    seq = context + (s.new_tokens if mode == "decode" else 0)
    misfit = model_point_misfit(model.config, s.dtype, device, batch, seq, prefill=mode == "prefill",
                                repeated_kv=repeats_kv(impl, loop))
    if misfit:  # a grid's cell past the device's memory: said, not attempted (`settings.check_memory` took the smallest)
        return row("oom", f"not run: {mode} on {batch}x{seq} tokens {misfit}")

    def measure():
        refused = switch(model, impl.attn_implementation)  # the model class refusing it: transformers' words
        if refused is not None:
            return row("rejected", f"{impl.name}: {refused}")
        with impl.context(), refusal_on_forward() as said:  # transformers' attention integration refusing a call
            if loop == "production":  # a prompt batch whose one-shot prefill would not fit: in chunks
                chunk = prefill_chunk(model.config, s.dtype, device, batch, context, s.new_tokens)
                return measure_static_decode(model, impl.name, batch=batch, context=context,
                                             new_tokens=s.new_tokens, device=device, seed=s.seed,
                                             prefill_chunk=chunk, kv_dtype=kv_dtype, share=s.share)
            if mode == "prefill":
                return measure_prefill(model, impl.name, batch=batch, context=context, device=device, seed=s.seed,
                                       reps=s.reps, share=s.share)
            return measure_decode(model, impl.name, batch=batch, context=context, new_tokens=s.new_tokens,
                                  device=device, seed=s.seed, share=s.share)
        return row("rejected", f"{impl.name}: {said[0]}")

    got = attempt(measure, device=device)
    if got.value is not None:
        return got.value
    return row(got.status.value, got.reason, new_tokens=s.new_tokens if mode == "decode" else 0)


def _price(data: dict, price: float, loop: str = "as-shipped") -> None:
    """$ per 1M tokens and the gain over eager on every row, then the answer (`serving.cost`) with each
    implementation's gain over eager and over sdpa in this loop (`serving.loops.comparisons`)."""
    from attnprof.serving.cost import annotate_static, annotate_stream, answer
    from attnprof.serving.loops import comparisons

    prefill = data.get("prefill", [])
    annotate_static(prefill, "prefill", price)
    annotate_static(data["decode"], "decode", price)
    annotate_stream(data["continuous"]["results"], price)
    stream = data["continuous"]["stream"]
    data["answer"] = answer(prefill, data["decode"], data["continuous"]["results"], price,
                            span_s=stream["span_s"] if stream else None)
    extra = comparisons(loop, data["decode"], data["continuous"]["results"])
    if extra:
        data["answer"] = (data["answer"] + " " + extra).strip()


def errors(data: dict) -> list[str]:
    """`impl mode: reason` for every row that ended in an error (the command exits 1 on any)."""
    out = []
    for loop, d in (("", data), (" (production)", data.get("production"))):
        if d is None:
            continue
        out += [f"{r['impl']} {m}{loop}: {r['reason']}" for m in ("prefill", "decode") for r in d.get(m, [])
                if r["status"] == "error"]
        out += [f"{r['impl']} continuous{loop}: {r['reason']}" for r in d["continuous"]["results"]
                if r["status"] == "error"]
    return out
