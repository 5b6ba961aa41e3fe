"""`attnprof serve` as a library call: one model, every implementation, the prefill and decode points and the request
stream, then the price of every token and the answer.

Each prefill or decode point goes through `run.attempt` (a failure is a row with its status and reason, and the
other points still run), so does each stream. `serve(plan, impls, device, flags)` returns the `attnprof.serve/1`
dict; `errors(data)` the one-line failures that make the command exit 1.
"""

from __future__ import annotations

from collections.abc import Callable

from attnprof.serving.plan import stream_json


def steps(plan: dict, impls) -> int:
    """How many progress steps `serve` reports: one per point and per stream."""
    modes = plan["modes"]
    points = len(plan.get("context", [])) * len(plan.get("batch", [])) if "prefill" in modes else 0
    points += len(plan.get("decode_batch", [])) if "decode" in modes else 0
    return (points + (1 if "continuous" in modes else 0)) * len(impls)


def serve(plan: dict, impls, device: str, args, *, on_progress: Callable[[str, bool], None] | None = None,
          note: Callable[[str], None] | None = None) -> dict:
    """Measure every mode of `plan` for every implementation; price it. `on_progress(description, advance)` reports
    each step, `note(text)` says what is being built (see the module docstring)."""
    from attnprof.models import attention_workload, build_model
    from attnprof.run import attempt
    from attnprof.serving.continuous import StreamResult, serve_stream

    progress = on_progress or (lambda description, advance: None)
    modes = plan["modes"]
    cells = {"prefill": [(b, c) for c in plan.get("context", []) for b in plan.get("batch", [])],
             "decode": [(b, plan.get("decode_context")) for b in plan.get("decode_batch", [])]}
    if note is not None:
        note(f"{plan['model']} ({plan['dtype']}, random weights) on {device}; implementations: "
             f"{', '.join(i.name for i in impls)}")
    model = build_model(plan["model"], attn_implementation="eager", dtype=plan["dtype"], device=device,
                        seed=args.seed)
    cfg = model.config
    shape = attention_workload(cfg, batch=1, seq=1, dtype=plan["dtype"], device=device)  # heads, kv heads, head dim
    data = {"schema": "attnprof.serve/1", "modes": modes,
            "model": {"name": plan["model"], "params": sum(p.numel() for p in model.parameters()),
                      "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "heads": shape.heads,
                      "kv_heads": shape.kv_heads, "head_dim": shape.head_dim,
                      "vocab": cfg.vocab_size, "max_positions": plan["max_positions"], "dtype": plan["dtype"],
                      "weights": "random (from config; nothing downloaded)"},
            "gpu_hour_price": plan["price"],
            "price_note": ("assumed default, not a quote; pass --gpu-hour-price" if plan["price_is_default"]
                           else "given with --gpu-hour-price"),
            "impls": [{"name": i.name, "attn_implementation": i.attn_implementation, "reason": i.rejected}
                      for i in impls],
            "prefill": [], "decode": [], "continuous": {"stream": None, "results": []}}
    for impl in impls:
        for mode in ("prefill", "decode"):
            if mode not in modes:
                continue
            for batch, context in cells[mode]:
                progress(f"{mode} {impl.name} batch {batch} context {context}", False)
                point = _static_point(model, impl, mode, batch, context, plan, args, device)
                data[mode].append(point.to_json())
                progress(f"{mode} {impl.name} batch {batch} context {context}", True)
    if "continuous" in modes:
        reqs = plan["requests"]
        data["continuous"]["stream"] = stream_json(plan, args)
        for impl in impls:
            progress(f"continuous {impl.name}: {len(reqs)} requests", False)
            if impl.rejected:
                res = StreamResult(impl=impl.name, status="rejected", reason=impl.rejected, requests=len(reqs))
            else:
                done = [0]

                def on_done(name=impl.name, done=done):
                    done[0] += 1
                    progress(f"continuous {name}: {done[0]}/{len(reqs)} requests done", False)

                got = attempt(lambda impl=impl, on_done=on_done: serve_stream(
                    model, impl.name, reqs, device=device, seed=args.seed, timeout_s=args.stream_timeout,
                    num_blocks=args.num_blocks, max_batch_tokens=args.max_batch_tokens, on_done=on_done),
                    device=device)  # a failure is a row with its reason; the command exits 1 after the report
                res = got.value or StreamResult(impl=impl.name, status=got.status.value, reason=got.reason,
                                                requests=len(reqs))
            data["continuous"]["results"].append(res.to_json())
            progress(f"continuous {impl.name}", True)
    _price(data, plan["price"])
    return data


def _static_point(model, impl, mode: str, batch: int, context: int, plan: dict, args, device: str):
    """One prefill or decode measurement through `run.attempt`: a failure is a row with its status and reason."""
    from attnprof.run import attempt
    from attnprof.serving.throughput import Point, measure_decode, measure_prefill

    if impl.rejected:
        return Point(impl=impl.name, mode=mode, batch=batch, context=context, status="rejected", reason=impl.rejected)

    def measure():
        model.set_attn_implementation(impl.attn_implementation)
        with impl.context():
            if mode == "prefill":
                return measure_prefill(model, impl.name, batch=batch, context=context, device=device, seed=args.seed,
                                       reps=args.reps, share=not args.no_share)
            return measure_decode(model, impl.name, batch=batch, context=context, new_tokens=plan["new_tokens"],
                                  device=device, seed=args.seed, share=not args.no_share)

    got = attempt(measure, device=device)
    if got.value is not None:
        return got.value
    return Point(impl=impl.name, mode=mode, batch=batch, context=context, status=got.status.value, reason=got.reason,
                 new_tokens=plan.get("new_tokens", 0) if mode == "decode" else 0)


def _price(data: dict, price: float) -> None:
    """$ per 1M tokens and the gain over eager on every row, then the answer (`serving.cost`)."""
    from attnprof.serving.cost import annotate_static, annotate_stream, answer

    annotate_static(data["prefill"], "prefill", price)
    annotate_static(data["decode"], "decode", price)
    annotate_stream(data["continuous"]["results"], price)
    stream = data["continuous"]["stream"]
    data["answer"] = answer(data["prefill"], data["decode"], data["continuous"]["results"], price,
                            span_s=stream["span_s"] if stream else None)


def errors(data: dict) -> list[str]:
    """`impl mode: reason` for every row that ended in an error (the command exits 1 on any)."""
    out = [f"{r['impl']} {m}: {r['reason']}" for m in ("prefill", "decode") for r in data[m] if r["status"] == "error"]
    out += [f"{r['impl']} continuous: {r['reason']}" for r in data["continuous"]["results"] if r["status"] == "error"]
    return out
