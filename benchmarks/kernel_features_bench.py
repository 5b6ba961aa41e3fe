"""flash-triton with model features (softcap, sliding window, sinks) against the plain path, on the GPU.

Issue 31 asks the features to run at >= 0.95x the speed of the plain path. The plain prefill call runs a Gluon
program on sm_90; a call with a feature runs, by default, the varlen Gluon program, the one Gluon program that
computes the features (`_features.py`), and with FLASH_TRITON_GLUON_FEATURES=0 the Triton prefill program; decode
runs the split-KV program either way, with a switch on. This prints GPU time per call from CUDA-graph replays (`attnprof.measure.timing.time_call`) and the ratio to the
plain default call of the same shape, for prefill at 2x4096 (head dim 128, 32/8 heads; and Gemma 2's 256, 16/8),
each feature four ways (default, `gluon varlen` named, that with `cap_bound=False`: softcap with a running max, and
with `p_pack_alu`: P rounded to bf16 on the integer pipe), the softcap 30 case also with `cap_poly=4` (one exp2 in 4
of the bounded softcap on the FMA pipes) alone and with `p_pack_alu`, and decode at B 1/16 over 8k keys (32/8 heads,
head dim 128), bf16. The default softcap call at head dim 128 takes `cap_poly=4` and `p_pack_alu` (session 15,
`_features.softcap_switches`); its `gluon varlen` row names the program without them. A sliding window does less work than the plain causal call: its ratio may pass 1.

    PYTHONPATH=src python3 benchmarks/kernel_features_bench.py [--softcap-only]
`--softcap-only`: the plain, softcap and all-three cases of the prefill calls (a short run).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from attnprof.measure.timing import time_call
from attnprof.variants import kernel_hub

REPO = Path(__file__).resolve().parents[1] / "kernels" / "flash-triton"
CASES = {"plain": {}, "softcap 30": dict(softcap=30.0), "window 1024": dict(window_size=(1023, 0)),
         "sinks": "sinks", "all three": "all"}


def main() -> int:
    if not torch.cuda.is_available():
        print("kernel_features_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    softcap_only = "--softcap-only" in sys.argv[1:]
    cases = {k: v for k, v in CASES.items() if k in ("plain", "softcap 30", "all three")} if softcap_only else CASES
    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    sinks = {h: torch.randn(h, device="cuda") + 4 for h in (16, 32)}

    def kwargs(case, hq):
        if case == "sinks":
            return dict(s_aux=sinks[hq])
        if case == "all":
            return dict(softcap=30.0, window_size=(1023, 0), s_aux=sinks[hq])
        return case

    print(f"{'call':<56} {'case':<12} {'gpu us':>9} {'x plain':>8}")
    print(f"(the default of a prefill call with a feature: "
          f"{'the varlen Gluon program' if mod._features.GLUON_BY_DEFAULT else 'the Triton program'})")

    def gluon_varlen(q, k, v, kw, d, cap_bound=True, p_pack_alu=False, cap_poly=0):  # the varlen Gluon program
        # named, as the CUDA tests call it
        cfg = mod.Config(block_m=128, block_n=64 if d == 256 else 128, num_warps=4, num_stages=2 if d == 256 else 3,
                         gluon=True, warp_specialize=True, varlen=True, cap_bound=cap_bound, p_pack_alu=p_pack_alu,
                         cap_poly=cap_poly)
        f = mod.parse_features("bench", q, kw.get("softcap", 0.0), kw.get("window_size", (-1, -1)), kw.get("s_aux"))
        return mod.attention(q, k, v, None, True, config=cfg, features=f, s_aux=kw.get("s_aux"))

    calls = []
    only = {}  # label -> the cases it runs (all where absent)
    for d, hq, hkv in ((128, 32, 8), (256, 16, 8)):
        q, k, v = (torch.randn(2, 4096, h, d, device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv))
        name = f"prefill 2x4096 d{d} {hq}/{hkv}"
        calls.append((name, lambda kw, q=q, k=k, v=v: mod.flash_attn_func(q, k, v, causal=True, **kw)))
        calls.append((name + " gluon varlen", lambda kw, q=q, k=k, v=v, d=d: gluon_varlen(q, k, v, kw, d)))
        calls.append((name + " gluon varlen online-max",  # softcap with the running max (TUNING.md step 19)
                      lambda kw, q=q, k=k, v=v, d=d: gluon_varlen(q, k, v, kw, d, cap_bound=False)))
        calls.append((name + " gluon varlen alu-pack",  # P rounded to bf16 on the integer pipe (TUNING.md step 21)
                      lambda kw, q=q, k=k, v=v, d=d: gluon_varlen(q, k, v, kw, d, p_pack_alu=True)))
        for poly, pack in ((4, False), (4, True), (2, True)):  # one exp2 in 4 or 2 on the FMA pipes (TUNING.md
            # step 20), alone and with P packed on the integer pipe: the bounded softcap's options only
            suffix = f" poly/{poly}" + (" + alu-pack" if pack else "")
            calls.append((name + " gluon varlen" + suffix, lambda kw, q=q, k=k, v=v, d=d, pack=pack, poly=poly:
                          gluon_varlen(q, k, v, kw, d, p_pack_alu=pack, cap_poly=poly)))
            only[calls[-1][0]] = ("softcap 30",)
    cache = [torch.randn(16, 8192, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2)]  # [B, S, Hkv, D]
    qd = torch.randn(16, 1, 32, 128, device="cuda", dtype=torch.bfloat16)  # [B, 1, Hq, D]
    lens = torch.full((16,), 8192, dtype=torch.int32, device="cuda")
    calls.append(("decode B=1 over 8k", lambda kw: mod.flash_attn_with_kvcache(
        qd[:1], cache[0][:1], cache[1][:1], cache_seqlens=lens[:1], **kw)))
    calls.append(("decode B=16 over 8k", lambda kw: mod.flash_attn_with_kvcache(
        qd, cache[0], cache[1], cache_seqlens=lens, **kw)))
    if softcap_only:
        calls = [(label, call) for label, call in calls if label.startswith("prefill")]
    plain = {}
    for label, call in calls:
        base = label.split(" gluon varlen")[0]
        for case, spec in cases.items():
            if case not in only.get(label, cases):
                continue
            kw = kwargs(spec, 32 if "32/" in label or "decode" in label else 16)
            us = time_call(lambda kw=kw, call=call: call(kw), "cuda", warmup=3, reps=20, cuda_graph=True).p50 * 1e3
            plain.setdefault(base, us)  # the default plain call of this shape (the first row of it)
            print(f"{label:<56} {case:<12} {us:9.1f} {plain[base] / us:8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
