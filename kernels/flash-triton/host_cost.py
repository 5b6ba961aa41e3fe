"""Host time of one flash-triton call (checks, program choice, descriptors, Triton's launcher) beside SDPA's.

Run from the repository root on the GPU machine:
    PYTHONPATH=src python3 kernels/flash-triton/host_cost.py [--calls 300] [--rounds 7] [--profile]
A call's host time is measured as the wall time to enqueue `--calls` calls divided by their number, with the GPU
kept ahead (tiny shapes: the kernels take less GPU time than their launches). One such measurement moves a lot from
run to run (SDPA's for one call went from 21 to 37 µs between two GPU runs), so ours and SDPA's are interleaved: each
shape runs `--rounds` rounds, each timing ours and SDPA back to back (which goes first alternates from round to
round), and the table prints the median of each side (`ours us`, `sdpa us`) and the median of the rounds' ratios
(`ours/sdpa`: a drift that slows both sides of a round cancels out of it; below 1 is ours cheaper), beside the
kernel's GPU time (CUDA-graph replays, `gpu us`); `--profile` prints the top of a cProfile of the default path, which
names where the host microseconds go. Prints a table; nothing is timed in a unit test.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

from attnprof.measure.timing import time_call

REPO = Path(__file__).resolve().parent
SHAPES = [(1, 16, 1024, 64, True), (8, 16, 1024, 64, True), (1, 32, 1024, 128, True), (1, 32, 1024, 128, False),
          (2, 16, 1000, 128, True)]
# decode: one query per sequence over a cache of S keys, 32 query heads over 8 KV heads, head dim 128
DECODE = [(1, 1024), (1, 8192), (16, 4096), (64, 1024)]


def host_us(fn, calls: int) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return host


def interleaved(ours, theirs, calls: int, rounds: int) -> tuple[float, float, float]:
    """(ours, theirs, ours/theirs): the medians over `rounds` rounds of host µs per call of each and of the round's
    ratio; each round times both back to back, ours first in even rounds and theirs first in odd ones."""
    mine, other, ratios = [], [], []
    for r in range(rounds):
        if r % 2 == 0:
            a = host_us(ours, calls)
            b = host_us(theirs, calls)
        else:
            b = host_us(theirs, calls)
            a = host_us(ours, calls)
        mine.append(a)
        other.append(b)
        ratios.append(a / b)
    return statistics.median(mine), statistics.median(other), statistics.median(ratios)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=300, help="calls per timing (default 300)")
    p.add_argument("--rounds", type=int, default=7,
                   help="interleaved rounds of ours then SDPA (the order alternating) per shape; medians printed "
                        "(default 7)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--stage", action="store_true",
                   help="instead: the main job's `kernel`, `sdpa` (and `flash-attn-4`) stages on the tutorial workload "
                        "as `attnprof stages` calls them (Variant, no_grad, [B, H, S, D] views), before and after a "
                        "profiler session: host us per call, p50 latency of 20 event-timed calls, host syncs")
    args = p.parse_args()
    if args.calls < 1 or args.rounds < 1:
        p.error("--calls and --rounds must be at least 1")
    if args.stage:
        return stage_table(args.calls)
    from kernels import get_local_kernel

    mod = get_local_kernel(REPO)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    print(f"fast launch: {mod.fast_launch_problem() or 'on'}")
    print(f"host us: medians of {args.rounds} interleaved rounds of {args.calls} calls; ours/sdpa: median of the "
          "rounds' ratios")
    print(f"{'B':>3} {'H':>3} {'S':>5} {'D':>4} {'mask':<6} {'program':<34} {'ours us':>8} {'sdpa us':>8} "
          f"{'ours/sdpa':>9} {'gpu us':>8}")
    for b, h, s, d, causal in SHAPES:
        qh, kh, vh = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        q, k, v = (t.transpose(1, 2) for t in (qh, kh, vh))  # the `kernel` variant's views: no copies

        def ours(q=q, k=k, v=v, causal=causal):
            return mod.flash_attn_func(q, k, v, causal=causal)

        def theirs(qh=qh, kh=kh, vh=vh, causal=causal):
            return sdpa(qh, kh, vh, is_causal=causal)

        gpu = time_call(ours, "cuda", warmup=3, reps=20, cuda_graph=True)  # the kernel alone: graph replays
        label = mod.choose_config(q, k, causal).label()
        mine, other, ratio = interleaved(ours, theirs, args.calls, args.rounds)
        print(f"{b:>3} {h:>3} {s:>5} {d:>4} {'causal' if causal else 'full':<6} {label:<34} "
              f"{mine:8.1f} {other:8.1f} {ratio:9.2f} "
              f"{gpu.p50 * 1e3:8.1f}" + ("" if gpu.method == "cuda-graph" else f" ({gpu.method})"), flush=True)
        if args.profile and (b, s) == (8, 1024):
            print_profile(ours)
    decode_table(mod, args.calls, args.rounds, args.profile)
    return 0


def stage_table(calls: int) -> int:
    """The `--stage` table: where the main job's per-call latency of a third-party entry point comes from."""
    from attnprof.profiling.capture import capture
    from attnprof.variants import resolve_variants
    from attnprof.workload import Workload

    w = Workload(batch=8, heads=16, seq=1024, head_dim=64, dtype="bf16", causal=True, device="cuda")
    inputs = w.make_inputs(0)
    names = ["sdpa", "kernel"]
    try:
        import flash_attn.cute  # noqa: F401
        names.append("flash-attn-4")
    except ImportError:
        pass
    print(f"{'stage':<14} {'when':<16} {'host us':>8} {'p50 ms':>8} {'gpu ms':>8}  syncs")
    for variant in resolve_variants(",".join(names)):
        def call(variant=variant):
            with torch.no_grad():
                return variant(inputs)

        gpu = time_call(call, "cuda", warmup=3, reps=20, cuda_graph=True)
        for when in ("fresh", "after profiler"):
            if when == "after profiler":
                capture(call, Path("/tmp/host_cost_trace.json"), device="cuda", steps=5, warmup=2)
            host = host_us(call, calls)
            lat = time_call(call, "cuda", warmup=3, reps=20)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                for _ in range(3):
                    call()
                syncs = "none"
            except RuntimeError as e:
                syncs = f"sync: {str(e).splitlines()[0][:80]}"
            finally:
                torch.cuda.set_sync_debug_mode("default")
            print(f"{variant.name:<14} {when:<16} {host:8.1f} {lat.p50:8.4f} {gpu.p50:8.4f}  {syncs}", flush=True)
        if variant.name == "kernel":
            print_profile(call, 100)
    return 0


def print_profile(fn, calls: int = 200) -> None:
    """The top of a cProfile of `calls` calls of fn: where the host microseconds go."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
    print(buf.getvalue())


def decode_table(mod, calls: int, rounds: int, profile: bool = False) -> None:
    """flash_attn_with_kvcache (cache_seqlens a [B] tensor, as serving loops pass it) against SDPA on the same decode
    step (q [B, 32, 1, 128] over k/v [B, 8, S, 128], enable_gqa), host µs per call (interleaved rounds, medians) and
    GPU µs per graph replay."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    print(f"{'B':>3} {'Skv':>6} {'decode program':<34} {'ours us':>8} {'sdpa us':>8} {'ours/sdpa':>9} {'gpu us':>8} "
          f"{'sdpa gpu':>8}")
    for b, s in DECODE:
        q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)  # [B, 1, Hq, D]
        kc, vc = (torch.randn(b, s, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))  # [B, S, Hkv, D]
        lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
        qh, kh, vh = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)  # [B, H, S, D] views

        def ours(q=q, kc=kc, vc=vc, lens=lens):
            return mod.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)

        def theirs(qh=qh, kh=kh, vh=vh):
            return sdpa(qh, kh, vh, enable_gqa=True)

        gpu = time_call(ours, "cuda", warmup=3, reps=20, cuda_graph=True)
        gpu_sdpa = time_call(theirs, "cuda", warmup=3, reps=20, cuda_graph=True)
        p = mod.DecodeConfig().label()
        mine, other, ratio = interleaved(ours, theirs, calls, rounds)
        print(f"{b:>3} {s:>6} {p:<34} {mine:8.1f} {other:8.1f} {ratio:9.2f} "
              f"{gpu.p50 * 1e3:8.1f} {gpu_sdpa.p50 * 1e3:8.1f}", flush=True)
        if profile and (b, s) == (1, 8192):
            print_profile(ours)


if __name__ == "__main__":
    sys.exit(main())
