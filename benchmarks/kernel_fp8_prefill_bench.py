"""FP8 prefill: our kernel's e4m3 `flash_attn_func` beside its bf16 one and SDPA (cuDNN), one run on one GPU.

Causal prefill at head dim 128, B·S = 16k tokens, 16 query heads over 16 (or `--kv-heads`) kv heads, S from 1k to 16k
(issue 45's grid). Each implementation is timed with CUDA-graph replays, L2 flushed, p50 of 20
(`attnprof.measure.timing.time_call`), the median of `--rounds` interleaved rounds; TF/s count the causal half.
The FP8 inputs are the bf16 ones quantized per (sequence, kv head) (descale = amax / 448); the quantize step is not
timed (an FP8 model keeps its activations in FP8). Where the installed torch has FlashAttention-3's quantized SDPA
(`torch.nn.attention.experimental._scaled_dot_product_attention_quantized`, torch >= 2.13 with FA3 activated) it is
a row too; otherwise the row says why not. Errors: each output against the fp64 attention of the bf16 inputs.

    PYTHONPATH=src python3 benchmarks/kernel_fp8_prefill_bench.py [--seqs 1024,...,16384] [--explore] [--out FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from attnprof.measure.timing import time_call
from attnprof.variants import kernel_hub

REPO = Path(__file__).resolve().parents[1] / "kernels" / "flash-triton"


def _quantize(x: torch.Tensor, groups: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """x `[B, S, H, D]` bf16 -> (e4m3, fp32 descale `[B, H / groups]`)."""
    b, s, h, d = x.shape
    ds = x.float().view(b, s, h // groups, groups, d).abs().amax(dim=(1, 3, 4)).clamp_min(1e-12) / 448.0
    return (x.float() / ds.repeat_interleave(groups, 1)[:, None, :, None]).to(torch.float8_e4m3fn), ds


def _quantized_sdpa():
    """FlashAttention-3's FP8 SDPA from the installed torch, or the reason there is none."""
    try:
        from torch.nn.attention.experimental._scaled_dot_product_attention_quantized import (
            _scaled_dot_product_attention_quantized as qsdpa,
        )
    except ImportError as e:
        return None, f"torch {torch.__version__} has no quantized SDPA ({e})"
    # it runs only on FlashAttention-3, which torch dispatches to once activated (the other SDPA row here pins cuDNN)
    activate = getattr(torch.nn.attention, "activate_flash_attention_impl", None)
    if activate is not None:
        try:
            activate("FA3")
        except Exception as e:  # not registered / its package missing: the row says why
            return None, f"torch {torch.__version__} cannot activate FlashAttention-3 ({type(e).__name__}: {e})"
    return qsdpa, ""


# `--explore`: the FP8 program's tile configs (BLOCK_M, BLOCK_N, warps, stages), as rows "ours fp8 MxN wW sS" beside
# the default (128x64 w4 s3, chosen from the first six of these on an H100): what its defaults are chosen from
CONFIGS = ((128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 8, 4), (128, 128, 4, 2),
           (128, 64, 4, 4), (128, 64, 4, 2), (128, 128, 4, 3), (64, 128, 4, 3), (128, 128, 8, 4))


def run(seq: int, tokens: int, hq: int, hkv: int, d: int, mod, rounds: int, gen, explore: bool = False) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b = max(1, tokens // seq)
    q = torch.randn(b, seq, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(b, seq, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    (q8, qd), (k8, kd), (v8, vd) = _quantize(q, hq // hkv), _quantize(k), _quantize(v)
    v8t = v8.transpose(1, 3).contiguous().transpose(1, 3)
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    impls = {"ours bf16": lambda: mod.flash_attn_func(q, k, v, causal=True),
             # the default: the warp-specialized Gluon program (`_gluon_fp8.py`) where it runs, else the Triton one
             "ours fp8": lambda: mod.flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd,
                                                     v_descale=vd),
             # the Gluon program with one exponential in 2 on the FMA pipes, or none (the default: one in 4,
             # `_fp8.FP8_EXP_POLY`; TUNING.md step 29)
             **{name: (lambda n=n: mod.fp8_attention(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd,
                                                     v_descale=vd, exp_poly=n))
                for name, n in (("ours fp8 exp-poly/2", 2), ("ours fp8 exp-poly off", 0))},
             # the two consumers' products issued in turns (FlashAttention-3's ping-pong; TUNING.md step 30)
             **{name: (lambda n=n: mod.fp8_attention(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd,
                                                     v_descale=vd, exp_poly=n, pingpong=True))
                for name, n in (("ours fp8 pingpong", None), ("ours fp8 pingpong exp-poly/2", 2))},
             # each block's values waited for at the end of its softmax, which keeps its exponentials under the
             # previous block's P·V in the machine code (`Config.v_wait_early`; TUNING.md step 31)
             **{name: (lambda n=n: mod.fp8_attention(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd,
                                                     v_descale=vd, exp_poly=n, v_wait_early=True))
                for name, n in (("ours fp8 v-wait-early", None), ("ours fp8 v-wait-early exp-poly off", 0))},
             "ours fp8 pingpong v-wait-early": lambda: mod.fp8_attention(q8, k8, v8, causal=True, q_descale=qd,
                                                                         k_descale=kd, v_descale=vd, pingpong=True,
                                                                         v_wait_early=True),
             "ours fp8 triton": lambda: mod.fp8_attention(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd,
                                                          v_descale=vd, program="triton"),
             # v kept with the keys contiguous, as the Triton program reads it: the call without its transposing copy
             "ours fp8 triton (v keys-contiguous)": lambda: mod.fp8_attention(q8, k8, v8t, causal=True, q_descale=qd,
                                                                              k_descale=kd, v_descale=vd,
                                                                              program="triton")}
    for bm, bn, w, st in CONFIGS if explore else ():
        impls[f"ours fp8 {bm}x{bn} w{w} s{st}"] = (
            lambda bm=bm, bn=bn, w=w, st=st: mod.fp8_attention(q8, k8, v8t, causal=True, q_descale=qd, k_descale=kd,
                                                               v_descale=vd, block_m=bm, block_n=bn, num_warps=w,
                                                               num_stages=st, program="triton"))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True,
                                                                    enable_gqa=hq != hkv).transpose(1, 2)
    impls["cuDNN bf16 (SDPA)"] = cudnn
    qsdpa, why = _quantized_sdpa()
    notes = {}
    if qsdpa is not None:
        q8h, k8h, v8h = (t.transpose(1, 2) for t in (q8, k8, v8))
        impls["FA3 fp8 (torch quantized SDPA)"] = lambda: qsdpa(q8h, k8h, v8h, is_causal=True, q_descale=qd,
                                                                k_descale=kd, v_descale=vd).transpose(1, 2)
    else:
        notes["FA3 fp8 (torch quantized SDPA)"] = why
    # the fp64 reference of the bf16 inputs, on a few query rows (the whole one would not fit at 16k)
    rows_ref = torch.arange(0, seq, max(1, seq // 64), device="cuda")
    g = hq // hkv
    s = torch.einsum("qhd,khd->hqk", q[0, rows_ref].double(), k[0].double().repeat_interleave(g, 1)) * d ** -0.5
    s = s.masked_fill(torch.arange(seq, device="cuda")[None, None, :] > rows_ref[None, :, None], float("-inf"))
    ref = torch.einsum("hqk,khd->qhd", s.softmax(-1), v[0].double().repeat_interleave(g, 1))
    samples, errs = {}, {}
    for _ in range(rounds):
        for name, fn in impls.items():
            if name in notes:
                continue
            try:
                us = time_call(fn, "cuda", warmup=3, reps=20, l2_flush=True, cuda_graph=True).p50 * 1e3
                samples.setdefault(name, []).append(us)
                if name not in errs:
                    out = fn()[0, rows_ref].double()
                    errs[name] = ((out - ref).norm() / ref.norm()).item()
            except Exception as e:  # a refused shape or a missing runtime is a finding, not the end of the run
                notes[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            torch.cuda.synchronize()
    flops = 4 * b * hq * seq * seq * d / 2
    base = statistics.median(samples["ours bf16"]) if "ours bf16" in samples else None
    out_rows = []
    for name in impls:
        us = statistics.median(samples[name]) if name in samples else None
        row = dict(seq=seq, batch=b, heads=hq, kv_heads=hkv, head_dim=d, impl=name, us=us,
                   tflops=None if us is None else flops / us / 1e6, x_bf16=None if not (us and base) else base / us,
                   err=errs.get(name), note=notes.get(name, ""), rounds_us=samples.get(name, []),
                   gpu=torch.cuda.get_device_name())
        out_rows.append(row)
        print(f"{b}x{hq}/{hkv}x{seq}x{d} causal  {name:<32} " + ("-" if us is None else
              f"{us:9.1f} us {row['tflops']:7.1f} TF/s {row['x_bf16'] or 0:5.2f}x bf16  err {errs.get(name, 0):.2e}")
              + f"  {notes.get(name, '')}", flush=True)
    return out_rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    p.add_argument("--tokens", type=int, default=16384, help="B·S per row (default 16384)")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--explore", action="store_true", help="also the FP8 program's tile configs (CONFIGS) at --explore-seqs")
    p.add_argument("--explore-seqs", default="8192,16384")
    p.add_argument("--out", type=Path, help="one JSON row per (seq, implementation), written as each seq finishes")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("kernel_fp8_prefill_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    if isinstance(mod, kernel_hub.Rejected):
        print(f"kernel_fp8_prefill_bench: {mod.reason}", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; median of {args.rounds} rounds of p50 of 20, "
          "L2 flushed, CUDA-graph replays; TF/s with the causal half", flush=True)
    sink = args.out.open("w") if args.out else None
    try:
        for seq in (int(s) for s in args.seqs.split(",") if s):
            explore = args.explore and str(seq) in args.explore_seqs.split(",")
            rows = run(seq, args.tokens, args.heads, args.kv_heads, args.head_dim, mod, max(1, args.rounds), gen,
                       explore)
            if sink:
                sink.write("".join(json.dumps(r) + "\n" for r in rows))
                sink.flush()
    finally:
        if sink:
            sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
