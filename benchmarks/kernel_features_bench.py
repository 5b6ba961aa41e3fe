"""flash-triton with model features (softcap, sliding window, sinks) against the plain path, on the GPU.

Issue 31 asks the features to run at >= 0.95x the speed of the plain path. A call with a feature runs the Triton
prefill program through one masked loop per tile (or the decode program with a switch on), while the plain call may
run a Gluon program: this prints both, GPU time per call from CUDA-graph replays (`attnprof.bench.timing.time_call`),
and the ratio, for prefill at 4k and decode at B 1/16 over 8k keys (32/8 heads, head dim 128, bf16). A sliding window
does less work than the plain causal call; its row also gives the time of the same work without skipping (window
-1) for comparison.

    PYTHONPATH=src python3 benchmarks/kernel_features_bench.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from attnprof.bench.timing import time_call
from attnprof.variants import kernel_hub

REPO = Path(__file__).resolve().parents[1] / "kernels" / "flash-triton"
CASES = {"plain": {}, "softcap 30": dict(softcap=30.0), "window 1024": dict(window_size=(1023, 0)),
         "sinks": "sinks", "all three": "all"}


def main() -> int:
    if not torch.cuda.is_available():
        print("kernel_features_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    sinks = torch.randn(32, device="cuda") + 4

    def kwargs(case):
        if case == "sinks":
            return dict(s_aux=sinks)
        if case == "all":
            return dict(softcap=30.0, window_size=(1023, 0), s_aux=sinks)
        return case

    print(f"{'call':<34} {'case':<12} {'gpu us':>9} {'x plain':>8}")
    q, k, v = (torch.randn(2, 4096, h, 128, device="cuda", dtype=torch.bfloat16) for h in (32, 8, 8))
    cache = [torch.randn(16, 8192, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2)]  # [B, S, Hkv, D]
    qd = torch.randn(16, 1, 32, 128, device="cuda", dtype=torch.bfloat16)  # [B, 1, Hq, D]
    lens = torch.full((16,), 8192, dtype=torch.int32, device="cuda")
    for label, call in (
        ("prefill 2x4096, 32/8 heads", lambda kw: mod.flash_attn_func(q, k, v, causal=True, **kw)),
        ("decode B=1 over 8k", lambda kw: mod.flash_attn_with_kvcache(qd[:1], cache[0][:1], cache[1][:1],
                                                                      cache_seqlens=lens[:1], **kw)),
        ("decode B=16 over 8k", lambda kw: mod.flash_attn_with_kvcache(qd, cache[0], cache[1], cache_seqlens=lens,
                                                                       **kw)),
    ):
        plain = None
        for case, spec in CASES.items():
            kw = kwargs(spec)
            us = time_call(lambda kw=kw, call=call: call(kw), "cuda", warmup=3, reps=20, cuda_graph=True).p50 * 1e3
            plain = plain or us
            print(f"{label:<34} {case:<12} {us:9.1f} {plain / us:8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
