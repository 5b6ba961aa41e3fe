"""Session 13: softcap at head dim 128 by key block and stages on the varlen Gluon program (is the 0.79x the
per-block softmax length?). Prints GPU µs per call (graph replays) and the ratio to the plain default call."""
import sys
from pathlib import Path

import torch

from attnprof.bench.timing import time_call
from attnprof.variants import kernel_hub

REPO = Path(__file__).resolve().parents[2] / "kernels" / "flash-triton"
mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
q, k, v = (torch.randn(2, 4096, h, 128, device="cuda", dtype=torch.bfloat16) for h in (32, 8, 8))
t = lambda f: time_call(f, "cuda", warmup=3, reps=20, cuda_graph=True).p50 * 1e3  # noqa: E731
plain = t(lambda: mod.flash_attn_func(q, k, v, causal=True))
print(f"plain default {plain:.1f} us", flush=True)
for bn, st in ((128, 3), (128, 2), (64, 3), (64, 4), (64, 5), (64, 2)):
    for cap in (0.0, 30.0):
        try:
            cfg = mod.Config(block_m=128, block_n=bn, num_warps=4, num_stages=st, gluon=True, warp_specialize=True,
                             varlen=True)
            f = mod.parse_features("bench", q, cap, (-1, -1), None)
            us = t(lambda: mod.attention(q, k, v, None, True, config=cfg, features=f))
            print(f"varlen block_n {bn} stages {st} softcap {cap:g}: {us:.1f} us, {plain / us:.2f}x plain", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"varlen block_n {bn} stages {st} softcap {cap:g}: {type(e).__name__}: {str(e)[:200]}", flush=True)
sys.exit(0)
