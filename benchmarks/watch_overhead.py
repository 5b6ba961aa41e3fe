"""How much does `attnprof.dispatch.watch()` cost on a model forward? (target: under 3 % at a realistic shape)

The watcher (default `hook="patch"`) replaces `F.scaled_dot_product_attention` for the block: other torch calls
cost nothing extra; each SDPA call builds its envelope key, reuses the dispatch observed for that envelope (the
first call of an envelope runs under a `TorchDispatchMode`) and reads its call site from the stack. That is CPU
work; on a GPU it only shows when the forward is launch-bound. So we time whole forwards (synchronised), watched
and unwatched, interleaved so drift hits both alike, and report the median of each and the relative overhead,
with the host time to enqueue the forward (`host_ms`): when it is close to the forward time, the forward is
launch-bound and every host microsecond the watcher adds shows up in full.

`--decode`: the same question for generation, where the watcher's cost is paid per token. From one prefilled KV
cache (copied for every block, so every block sees the same lengths: after the first block cuDNN's plans are cached
and the steps are warm), `--steps` decode steps of one token each, blocks watched and plain interleaved; each step is
timed alone (synchronised). The result: the watcher's cost per decode step in ms, and as a share of the step.

    PYTHONPATH=src python benchmarks/watch_overhead.py --model tiny-llama --device cpu
    PYTHONPATH=src python3 benchmarks/watch_overhead.py --model llama-1b --device cuda --batch 1 --seq 2048
    PYTHONPATH=src python3 benchmarks/watch_overhead.py --model llama-1b --device cuda --decode --seq 512 --steps 16
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="default bf16 on CUDA, fp32 on CPU")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--reps", type=int, default=30, help="timed forwards per arm (default 30)")
    p.add_argument("--out", type=Path, default=None, help="write the result JSON here")
    p.add_argument("--ablate", action="store_true",
                   help="add arms that isolate the cost: watch without the call-site walk, and a bare passthrough "
                        "patch of F.scaled_dot_product_attention")
    p.add_argument("--decode", action="store_true",
                   help="measure decode steps (one token each, from a prefilled cache of --seq tokens) instead of "
                        "prefill forwards")
    p.add_argument("--steps", type=int, default=16, help="--decode: decode steps per block (default 16)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also print cProfile's top functions (by own time) over N watched forwards, to stderr")
    args = p.parse_args(argv)

    from attnprof.audit import watch
    from attnprof.models import build_model, padded_batch
    from attnprof.workload import resolve_device

    device = resolve_device(args.device)
    cuda = device.startswith("cuda")
    dtype = args.dtype or ("bf16" if cuda else "fp32")
    model = build_model(args.model, attn_implementation="sdpa", dtype=dtype, device=device)
    ids, mask = padded_batch(model.config, batch=args.batch, seq=args.seq, device=device)
    if args.decode:
        return _decode(args, model, ids, device, dtype, watch)

    host: dict[str, list[float]] = {}

    def forward(arm: str = "plain") -> float:
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        model(input_ids=ids, attention_mask=mask)
        host.setdefault(arm, []).append((time.perf_counter() - t0) * 1e3)
        if cuda:
            torch.cuda.synchronize(device)
        return (time.perf_counter() - t0) * 1e3

    def watched() -> float:
        with watch() as calls:
            ms = forward("watched")
        watched.calls = len(calls)
        return ms

    arms = {"plain": forward, "watched": watched}
    if args.ablate:
        arms.update(_ablation_arms(forward, watch))
    times: dict[str, list[float]] = {name: [] for name in arms}
    names = list(arms)
    with torch.no_grad():
        for _ in range(3):  # warm-up every arm (first-call work, the watcher's cached reasons)
            for fn in arms.values():
                fn()
        host.clear()
        for i in range(args.reps):  # interleaved, alternating the order so drift hits every arm alike
            for name in (names if i % 2 == 0 else names[::-1]):
                times[name].append(arms[name]())
    plain, with_watch = statistics.median(times["plain"]), statistics.median(times["watched"])
    plain_ms, watch_ms = times["plain"], times["watched"]
    result = {
        "schema": "attnprof.watch_overhead/1", "model": args.model, "device": device, "dtype": dtype,
        "batch": args.batch, "seq": args.seq, "reps": args.reps, "sdpa_calls_per_forward": watched.calls,
        "forward_ms_p50": round(plain, 4), "watched_ms_p50": round(with_watch, 4),
        "overhead_pct": round(100 * (with_watch - plain) / plain, 2),
        "forward_ms_p20_p80": [round(x, 4) for x in statistics.quantiles(plain_ms, n=5)[::3]],
        "watched_ms_p20_p80": [round(x, 4) for x in statistics.quantiles(watch_ms, n=5)[::3]],
        # host time to enqueue one forward: close to forward_ms_p50 means launch-bound (every host µs shows)
        "host_ms_p50": round(statistics.median(host["plain"]), 4),
        "watched_host_ms_p50": round(statistics.median(host["watched"]), 4),
    }
    if args.ablate:
        result["arms_ms_p50"] = {name: round(statistics.median(t), 4) for name, t in times.items()}
    result.update(_per_call_costs(device))
    from attnprof.files import write_json
    from attnprof.provenance import provenance

    result["provenance"] = provenance(device)
    print(f"{args.model} {args.batch}x{args.seq} {dtype} on {result['provenance']['device']}: forward "
          f"{plain:.3f} ms, watched {with_watch:.3f} ms → overhead {result['overhead_pct']:+.2f} % "
          f"({watched.calls} SDPA calls per forward); per call: {result['per_torch_call_us']:.2f} µs on any torch "
          f"call, {result['per_sdpa_call_us']:.1f} µs on an SDPA call (best of 5)", file=sys.stderr)
    if args.profile:
        _profile(watched, args.profile)
    if args.out:
        write_json(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "provenance"}))
    return 0


def _decode(args, model, ids, device: str, dtype: str, watch) -> int:
    """Per decode step: plain vs watched (see the module docstring). Unpadded prompt: batch rows all full."""
    import copy

    from attnprof.files import write_json
    from attnprof.provenance import provenance

    cuda = device.startswith("cuda")
    ids = ids.clamp(min=3)  # no padding: one KV length per step for the whole batch
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    prefilled, token = out.past_key_values, out.logits[:, -1:].argmax(-1)  # token: (B, 1)
    del out

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def block(watched: bool) -> tuple[list[float], list[float], int]:
        cache = copy.deepcopy(prefilled)
        steps, hosts, tok = [], [], token
        ctx = watch() if watched else contextlib.nullcontext([])
        with torch.no_grad(), ctx as calls:
            for _ in range(args.steps):
                sync()
                t0 = time.perf_counter()
                logits = model(input_ids=tok, past_key_values=cache, use_cache=True).logits
                hosts.append((time.perf_counter() - t0) * 1e3)
                tok = logits[:, -1:].argmax(-1)
                sync()
                steps.append((time.perf_counter() - t0) * 1e3)
        return steps, hosts, len(calls)

    for _ in range(2):  # warm-up: first lengths (cuDNN plans), the watcher's caches
        block(False)
        block(True)
    times = {True: [], False: []}
    host = {True: [], False: []}
    calls = 0
    for i in range(args.reps):  # interleaved, alternating the order so drift hits both alike
        for watched in ((False, True) if i % 2 == 0 else (True, False)):
            steps, hosts, n = block(watched)
            times[watched] += steps
            host[watched] += hosts
            calls = n or calls
    plain, watched = statistics.median(times[False]), statistics.median(times[True])
    with watch() as seen:  # which backend the decode steps ran
        with torch.no_grad():
            model(input_ids=token, past_key_values=copy.deepcopy(prefilled), use_cache=True)
    result = {
        "schema": "attnprof.watch_overhead/1", "phase": "decode", "model": args.model, "device": device,
        "dtype": dtype, "batch": args.batch, "prompt": args.seq, "steps_per_block": args.steps, "blocks": args.reps,
        "sdpa_calls_per_step": calls // args.steps, "backends": sorted({c.backend for c in seen}),
        "step_ms_p50": round(plain, 4), "watched_step_ms_p50": round(watched, 4),
        "overhead_ms_per_step": round(watched - plain, 4), "overhead_pct": round(100 * (watched - plain) / plain, 2),
        "step_ms_p20_p80": [round(x, 4) for x in statistics.quantiles(times[False], n=5)[::3]],
        "watched_step_ms_p20_p80": [round(x, 4) for x in statistics.quantiles(times[True], n=5)[::3]],
        "host_ms_p50": round(statistics.median(host[False]), 4),
        "watched_host_ms_p50": round(statistics.median(host[True]), 4),
    }
    result.update(_per_call_costs(device))
    result["provenance"] = provenance(device)
    print(f"{args.model} decode after a {args.batch}x{args.seq} prompt, {dtype} on {result['provenance']['device']}: "
          f"step {plain:.3f} ms, watched {watched:.3f} ms → {watched - plain:+.3f} ms per step "
          f"({result['overhead_pct']:+.2f} %, {result['sdpa_calls_per_step']} SDPA calls per step, "
          f"backend {', '.join(result['backends'])})", file=sys.stderr)
    if args.out:
        write_json(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "provenance"}))
    return 0


def _ablation_arms(forward, watch) -> dict:
    """Arms that each remove one part of the watcher, to see where its time goes."""
    import torch.nn.functional as F

    watch_module = importlib.import_module("attnprof.dispatch.watch")  # the package re-exports the function as `watch`

    def no_callsite() -> float:
        sites = watch_module._SITES
        sites.find = lambda: (None, None, None)  # instance attribute shadows the method
        try:
            with watch():
                return forward("watched-no-callsite")
        finally:
            del sites.find

    def passthrough() -> float:
        inner = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = lambda *a, **k: inner(*a, **k)
        try:
            return forward("passthrough-patch")
        finally:
            F.scaled_dot_product_attention = inner

    return {"watched-no-callsite": no_callsite, "passthrough-patch": passthrough}


def _profile(watched, n: int) -> None:
    """Where the watched forward's host time goes: cProfile over `n` forwards, top 25 by own time."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    with torch.no_grad():
        prof.enable()
        for _ in range(n):
            watched()
        prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    print(buf.getvalue(), file=sys.stderr)


def _per_call_costs(device: str, n: int = 2000) -> dict:
    """The watcher's added CPU time per ordinary torch call and per SDPA call (best of 5: robust to a busy host)."""
    import torch.nn.functional as F

    from attnprof.audit import watch

    x = torch.ones(4, device=device)
    q = torch.randn(1, 2, 8, 16, device=device)

    def best(fn) -> float:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) / n * 1e6

    def adds():
        for _ in range(n):
            torch.add(x, x)

    def sdpas():
        for _ in range(n // 10):
            F.scaled_dot_product_attention(q, q, q)

    plain_add, plain_sdpa = best(adds), best(sdpas) * 10
    with watch():
        w_add, w_sdpa = best(adds), best(sdpas) * 10
    return {"per_torch_call_us": round(w_add - plain_add, 3), "per_sdpa_call_us": round(w_sdpa - plain_sdpa, 2)}


if __name__ == "__main__":
    sys.exit(main())
