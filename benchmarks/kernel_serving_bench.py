"""flash-triton at serving shapes: decode over a KV cache and packed varlen prefill, beside SDPA and FlexAttention.

Decode is a memory-bound read of the cache: B·Skv·Hkv·D·2 bytes of K and as many of V per step, one query token per
sequence. Its floor is those bytes at the copy bandwidth this GPU measured (`attnprof.bench.ceilings.measure_copy`,
read + written); every decode row prints K/V GB/s and that fraction. A step is a few microseconds, so the host's
launch cost (Triton's Python launcher, torch's dispatcher: 10-30 µs) can hide the kernel: each row is timed twice,
`triton.testing.do_bench` (eager launches, L2 flushed between calls) and `do_bench_cudagraph` (the calls replayed
from a CUDA graph, what a serving loop with graphs runs; the caches are cycled over copies larger than L2 so no call
reads another's bytes from cache). Ours: `flash_attn_with_kvcache` on a dense cache `[B, S, Hkv, D]`, on `[B, S,
Hkv, D]` views of head-major `[B, Hkv, S, D]` storage (`ours-heads`: transformers' static cache, and the bytes SDPA
reads) and on paged caches (scattered block tables); SDPA auto / pinned flash / efficient and flex on `[B, H, S, D]`, GQA by
`enable_gqa`. Prefill: 8 causal sequences of different lengths packed into one `flash_attn_varlen_func` call,
against our dense kernel called once per sequence (the same FLOPs), SDPA per sequence and flex with a document
mask; TF/s = Σ 4·H·S²·D/2. `--tune` also times decode configs on a few points (TUNING.md's data).

    PYTHONPATH=src python3 benchmarks/kernel_serving_bench.py --out DIR [--parts decode,varlen,tune]
Writes DIR/<gpu>-kernel-serving.md (h200, h100: the GPU it ran on) and DIR/kernel-serving-bench.json (schema attnprof.kernel-serving-bench/1).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnprof.bench.ceilings import measure_copy
from attnprof.commands.common import add_kernel_args, kernel_from_args
from attnprof.files import write_atomic, write_json
from attnprof.provenance import provenance
from attnprof.variants import kernel_hub

SCHEMA = "attnprof.kernel-serving-bench/1"
DECODE_IMPLS = ("ours", "ours-heads", "ours-paged64", "ours-paged256", "sdpa", "sdpa-flash", "sdpa-efficient", "flex")
# more that `--decode-impls` can name: ours over an FP8 (e4m3) cache, dense and paged, descales per (sequence, kv head);
# `-heads`: stored [B, Hkv, S, D] as transformers' (and attnprof's FP8) static cache keeps it; `-vkeys`: v stored
# [B, Hkv, D, S], the keys contiguous (the decode program's V_KEYS path: Vᵀ tiles, no byte gathers)
FP8_IMPLS = ("ours-fp8", "ours-fp8-heads", "ours-fp8-vkeys", "ours-fp8-paged64", "ours-fp8-paged256")
TUNE_POINTS = ((1, 1024), (1, 8192), (1, 32768), (4, 8192), (16, 8192), (64, 4096))
# `--tune-set batch1` (issue 30 item 3): batch 1 against cuDNN, and batch 4 (4 splits) to see what a change costs there
BATCH1_POINTS = ((1, 1024), (1, 8192), (1, 32768), (4, 8192))
# `--tune-set fp8` (issue 45): decode configs over an e4m3 cache, where the bf16 default reads 31-84 % of the copy
FP8_TUNE_POINTS = ((1, 8192), (1, 32768), (16, 8192), (64, 8192))


DEVICE = "cuda"


def timed(fn, rotate: int, methods=("eager", "graph")) -> dict:
    """Median ms of `fn(i)` (i cycles over `rotate` buffer sets) under do_bench and do_bench_cudagraph."""
    import triton.testing as tt

    step = [0]

    def call():
        fn(step[0] % rotate)
        step[0] += 1

    benches = {"eager": lambda: tt.do_bench(call, warmup=10, rep=20, return_mode="median"),
               "graph": lambda: tt.do_bench_cudagraph(call, rep=20, return_mode="median")}
    out = {}
    for method in methods:
        try:
            out[method] = benches[method]()
        except (RuntimeError, torch.OutOfMemoryError) as e:
            out[f"{method}_error"] = str(e).strip().splitlines()[0][:160]
    return out


def decode_cell(mod, b: int, s: int, hq: int, hkv: int, d: int, impls, l2_bytes: int, flex_ok: bool) -> list[dict]:
    """Every implementation on one decode shape (Sq = 1), each on its own copies of the same K/V values."""
    kv_bytes = 2 * b * s * hkv * d * 2
    rotate = max(1, min(16, math.ceil(3 * l2_bytes / kv_bytes)))
    gen = torch.Generator(device=DEVICE).manual_seed(b * s)
    q = torch.randn(b, 1, hq, d, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    ks = [torch.randn(b, s, hkv, d, device=DEVICE, dtype=torch.bfloat16, generator=gen) for _ in range(rotate)]
    vs = [torch.randn_like(k) for k in ks]
    seqlens = torch.full((b,), s, dtype=torch.int32, device=DEVICE)
    rows, ref = [], None
    for impl in impls:
        row = {"part": "decode", "impl": impl, "batch": b, "kv_len": s, "rotate": rotate,
               "kv_bytes": kv_bytes // 2 if impl in FP8_IMPLS else kv_bytes}  # the bytes this one reads
        try:
            fn, out = _decode_fn(mod, impl, q, ks, vs, seqlens, gen, flex_ok)
        except (RuntimeError, ValueError, torch.OutOfMemoryError) as e:
            rows.append({**row, "status": "error", "reason": str(e).strip().splitlines()[0][:200]})
            continue
        if fn is None:
            rows.append({**row, "status": "skipped", "reason": out})
            continue
        ref = out if ref is None else ref
        rows.append({**row, "status": "ok", **timed(fn, rotate),
                     "rel_diff": ((out.float() - ref.float()).norm() / ref.float().norm()).item()})
    del ks, vs
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return rows


def _decode_fn(mod, impl, q, ks, vs, seqlens, gen, flex_ok):
    """(fn(i) running impl on buffer set i, its output on set 0), or (None, why skipped)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if impl == "ours":
        def fn(i):
            return mod.flash_attn_with_kvcache(q, ks[i], vs[i], cache_seqlens=seqlens)
        return fn, fn(0)
    if impl == "ours-heads":  # transformers' static cache: [B, Hkv, S, D] storage (SDPA's), read through views
        hk = [k.transpose(1, 2).contiguous().transpose(1, 2) for k in ks]
        hv = [v.transpose(1, 2).contiguous().transpose(1, 2) for v in vs]

        def fn(i):
            return mod.flash_attn_with_kvcache(q, hk[i], hv[i], cache_seqlens=seqlens)
        return fn, fn(0)
    fp8 = {}
    if impl in FP8_IMPLS:  # the same values as an e4m3 cache: x / descale, descale = amax / 448 per (b, kv head)
        kd = ks[0].float().abs().amax(dim=(1, 3)) / 448.0
        vd = vs[0].float().abs().amax(dim=(1, 3)) / 448.0
        ks = [(k.float() / kd[:, None, :, None]).to(torch.float8_e4m3fn) for k in ks]
        vs = [(v.float() / vd[:, None, :, None]).to(torch.float8_e4m3fn) for v in vs]
        fp8 = {"k_descale": kd, "v_descale": vd}
        impl = impl.replace("-fp8", "")
        if impl == "ours-vkeys":
            tv = [v.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2) for v in vs]

            def fn(i):
                return mod.flash_attn_with_kvcache(q, ks[i], tv[i], cache_seqlens=seqlens, **fp8)
            return fn, fn(0)
        if impl == "ours-heads":
            hk = [k.transpose(1, 2).contiguous().transpose(1, 2) for k in ks]
            hv = [v.transpose(1, 2).contiguous().transpose(1, 2) for v in vs]

            def fn(i):
                return mod.flash_attn_with_kvcache(q, hk[i], hv[i], cache_seqlens=seqlens, **fp8)
            return fn, fn(0)
        if impl == "ours":
            def fn(i):
                return mod.flash_attn_with_kvcache(q, ks[i], vs[i], cache_seqlens=seqlens, **fp8)
            return fn, fn(0)
    if impl.startswith("ours-paged"):
        page = int(impl.removeprefix("ours-paged"))
        b, s, hkv, d = ks[0].shape
        blocks = s // page
        table = torch.randperm(b * blocks, device=DEVICE, generator=gen).view(b, blocks).to(torch.int32)
        pk, pv = [], []
        for k, v in zip(ks, vs):  # page j of sequence i holds its keys [j·page, (j+1)·page)
            pk.append(torch.empty(b * blocks, page, hkv, d, device=DEVICE, dtype=k.dtype))
            pv.append(torch.empty_like(pk[-1]))
            pk[-1][table.flatten().long()] = k.view(b * blocks, page, hkv, d)
            pv[-1][table.flatten().long()] = v.view(b * blocks, page, hkv, d)

        def fn(i):
            return mod.flash_attn_with_kvcache(q, pk[i], pv[i], cache_seqlens=seqlens, block_table=table, **fp8)
        return fn, fn(0)
    qh = q.transpose(1, 2).contiguous()  # [B, 1, Hq, D] -> [B, Hq, 1, D]: SDPA's and flex's layout
    kh = [k.transpose(1, 2).contiguous() for k in ks]  # [B, S, Hkv, D] -> [B, Hkv, S, D]
    vh = [v.transpose(1, 2).contiguous() for v in vs]
    if impl == "flex":
        if not flex_ok:
            return None, "flex compile budget spent"
        from torch.nn.attention.flex_attention import flex_attention

        torch._dynamo.reset()
        flex = torch.compile(flex_attention, dynamic=False)

        def fn(i):
            return flex(qh, kh[i], vh[i], enable_gqa=True)
        return fn, fn(0).transpose(1, 2)
    backends = {"sdpa": None, "sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION}
    backend = backends[impl]

    def fn(i):
        if backend is None:
            return F.scaled_dot_product_attention(qh, kh[i], vh[i], enable_gqa=True)
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(qh, kh[i], vh[i], enable_gqa=True)
    return fn, fn(0).transpose(1, 2)


def varlen_rows(mod, lengths: list[int], hq: int, hkv: int, d: int, flex_ok: bool) -> list[dict]:
    """One packed causal prefill of `lengths`: ours varlen (default on contiguous and on transformers' strided views,
    forced onto the Gluon / Triton program), ours dense per sequence (chosen program / Triton only),
    SDPA auto per sequence, flex with a document mask; TF/s over the same causal FLOPs."""
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    q = torch.randn(total, hq, d, device=DEVICE, dtype=torch.bfloat16)
    k, v = (torch.randn(total, hkv, d, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    flops = sum(4 * hq * n * n * d / 2 for n in lengths)
    spans = [(int(cu[i]), int(cu[i + 1])) for i in range(len(lengths))]
    per_seq = [(q[a:e].unsqueeze(0), k[a:e].unsqueeze(0), v[a:e].unsqueeze(0)) for a, e in spans]  # [1, S, H, D]
    heads_first = [tuple(t.transpose(1, 2).contiguous() for t in x) for x in per_seq]  # [1, H, S, D] for SDPA
    triton_cfg = mod.default_config(d, q.device)
    gluon = mod.Config(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True, warp_specialize=True)
    # transformers' continuous batching passes [total, H, D] views of [H, total, D] storage
    qs, ks, vs = (t.transpose(0, 1).contiguous().transpose(0, 1) for t in (q, k, v))
    fns = {
        "ours-varlen": lambda: mod.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True),
        "ours-varlen-strided": lambda: mod.flash_attn_varlen_func(qs, ks, vs, cu, cu, max(lengths), max(lengths),
                                                                  causal=True),
        "ours-varlen-triton": lambda: mod.varlen_attention(q, k, v, cu, cu, max(lengths), None, True, config=triton_cfg),
        "ours-varlen-gluon": lambda: mod.varlen_attention(q, k, v, cu, cu, max(lengths), None, True, config=gluon),
        "ours-dense-per-seq": lambda: [mod.flash_attn_func(*x, causal=True) for x in per_seq],
        "ours-dense-triton-per-seq": lambda: [mod.attention(*x, None, True, config=triton_cfg) for x in per_seq],
        "sdpa-per-seq": lambda: [F.scaled_dot_product_attention(*x, is_causal=True, enable_gqa=True)
                                 for x in heads_first],
    }
    if flex_ok:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        doc = torch.repeat_interleave(torch.arange(len(lengths), device=DEVICE), torch.tensor(lengths, device=DEVICE))

        def document_causal(b, h, qi, ki):
            return (doc[qi] == doc[ki]) & (ki <= qi)

        mask = create_block_mask(document_causal, None, None, total, total, device=DEVICE)
        torch._dynamo.reset()
        flex = torch.compile(flex_attention, dynamic=False)
        packed = tuple(t.transpose(0, 1).unsqueeze(0).contiguous() for t in (q, k, v))  # [1, H, total, D]
        fns["flex-packed"] = lambda: flex(*packed, block_mask=mask, enable_gqa=True)
    rows = []
    for impl, fn in fns.items():
        row = {"part": "varlen", "impl": impl, "lengths": lengths, "flops": flops}
        try:
            fn()
            rows.append({**row, "status": "ok", **timed(lambda i, fn=fn: fn(), 1)})
        except (RuntimeError, ValueError, torch.OutOfMemoryError) as e:
            rows.append({**row, "status": "error", "reason": str(e).strip().splitlines()[0][:200]})
    return rows


def tune_configs(mod, tune_set: str) -> list:
    """The decode configs a tune set times: `sweep` is TUNING.md step 15's grid; `batch1` the split count and the
    merge's round trips at batch 1 (steps 19 and 20)."""
    c = mod.DecodeConfig
    if tune_set == "fp8":  # over an e4m3 cache a 128-key tile carries half the bytes of a bf16 one: more CTAs per SM
        # (the FP8 default, `_splits.DEFAULT_FP8`, first; then without its floor of 512 keys per split), the bf16
        # default, wider tiles, more warps (the widening to bf16 is work the bf16 cache does not have), deeper pipelines
        return [mod.DEFAULT_FP8_DECODE, c(ctas_per_sm=2), c(), c(num_warps=8), c(ctas_per_sm=2, num_warps=8),
                c(ctas_per_sm=2, block_n=64), c(ctas_per_sm=2, block_n=64, min_split_keys=512), c(ctas_per_sm=3),
                c(block_n=64), c(block_n=256, num_warps=8), c(num_stages=4)]
    if tune_set == "batch1":  # the default (merge 4) against the one before it, split counts around the heuristic's
        # (14 at batch 1 over 32k keys: 112 of 132 SMs) and eight warps per split
        return [c(), c(merge_group=1, prefetch_merge=True), c(num_splits=8), c(num_splits=16), c(num_splits=32),
                c(num_warps=8)]
    return [c(), c(prefetch_merge=True), c(ctas_per_sm=1), c(ctas_per_sm=1, prefetch_merge=True),
            c(block_n=128, ctas_per_sm=1), c(block_n=128, ctas_per_sm=1, prefetch_merge=True),
            c(num_stages=4, ctas_per_sm=1, prefetch_merge=True), c(num_warps=2, ctas_per_sm=1, prefetch_merge=True),
            c(fused_reduce=False, prefetch_merge=True), c(fused_reduce=False, ctas_per_sm=1, prefetch_merge=True),
            c(ctas_per_sm=3, prefetch_merge=True), c(block_n=128, prefetch_merge=True)]


def tune_rows(mod, hq: int, hkv: int, d: int, l2_bytes: int, tune_set: str = "sweep") -> list[dict]:
    """Decode configs on a few points, graph-timed: the data behind TUNING.md's decode steps. `batch1` also times
    SDPA (auto: cuDNN on the H200) at each point, and profiles one call of a few configs kernel by kernel."""
    configs = tune_configs(mod, tune_set)
    points = {"batch1": BATCH1_POINTS, "fp8": FP8_TUNE_POINTS}.get(tune_set, TUNE_POINTS)
    rows = []
    for b, s in points:
        rows += _tune_point(mod, configs, b, s, hq, hkv, d, l2_bytes, with_sdpa=tune_set == "batch1",
                            fp8=tune_set == "fp8")
        print(f"tune B={b} S={s}: " + "  ".join(f"{r['impl']} {r.get('graph', float('nan')) * 1e3:.1f}us"
                                                 for r in rows if r["batch"] == b and r["kv_len"] == s),
              file=sys.stderr, flush=True)
    if tune_set == "batch1":
        c = mod.DecodeConfig
        rows += anatomy_rows(mod, [c(), c(fused_reduce=False), c(merge_group=1, prefetch_merge=True)], 1, 8192, hq, hkv, d)
    return rows


def anatomy_rows(mod, configs, b: int, s: int, hq: int, hkv: int, d: int, calls: int = 20) -> list[dict]:
    """Each config's (and SDPA's) kernels under the PyTorch profiler over `calls` calls: mean µs per kernel name.
    The two-launch config shows the split pass without the merge and the merge alone."""
    import tempfile

    from attnprof.profiling.capture import capture
    from attnprof.profiling.trace import load_trace

    q = torch.randn(b, 1, hq, d, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(b, s, hkv, d, device=DEVICE, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = torch.full((b,), s, dtype=torch.int32, device=DEVICE)
    fns = {cfg.label(): (lambda cfg=cfg: mod.kvcache_attention(q, k, v, cache_seqlens=lens, config=cfg))
           for cfg in configs}
    sdpa, _ = _decode_fn(mod, "sdpa", q, [k], [v], lens, None, False)
    fns["sdpa"] = lambda: sdpa(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, fn in fns.items():
            trace = load_trace(capture(fn, Path(tmp) / "t.json", device=DEVICE, steps=calls, warmup=3))
            per: dict[str, list[float]] = {}
            for step in trace.steps():
                for e in step.gpu:
                    if e.cat == "kernel":
                        per.setdefault(e.name[:80], []).append(e.dur)
            rows.append({"part": "anatomy", "impl": label, "batch": b, "kv_len": s, "status": "ok",
                         "kernels": {n: sum(x) / len(x) for n, x in per.items()}})
            kernels = ", ".join(f"{n[:40]} {t:.1f}us" for n, t in rows[-1]["kernels"].items())
            print(f"anatomy B={b} S={s} {label}: {kernels}", file=sys.stderr, flush=True)
    return rows


def _tune_point(mod, configs, b: int, s: int, hq: int, hkv: int, d: int, l2_bytes: int,
                with_sdpa: bool = False, fp8: bool = False) -> list[dict]:
    """`fp8`: every config over an e4m3 cache (descales per sequence and kv head), kv_bytes its FP8 bytes."""
    kv_bytes = (2 if fp8 else 4) * b * s * hkv * d
    rotate = max(1, min(16, math.ceil(3 * l2_bytes / kv_bytes)))
    q = torch.randn(b, 1, hq, d, device=DEVICE, dtype=torch.bfloat16)
    ks = [torch.randn(b, s, hkv, d, device=DEVICE, dtype=torch.bfloat16) for _ in range(rotate)]
    vs = [torch.randn_like(k) for k in ks]
    descales = {}
    if fp8:
        descales = {"k_descale": ks[0].float().abs().amax(dim=(1, 3)) / 448.0,
                    "v_descale": vs[0].float().abs().amax(dim=(1, 3)) / 448.0}
        ks = [(k.float() / descales["k_descale"][:, None, :, None]).to(torch.float8_e4m3fn) for k in ks]
        vs = [(v.float() / descales["v_descale"][:, None, :, None]).to(torch.float8_e4m3fn) for v in vs]
    lens = torch.full((b,), s, dtype=torch.int32, device=DEVICE)
    rows, ref = [], None
    for cfg in configs:
        row = {"part": "tune", "impl": cfg.label(), "batch": b, "kv_len": s, "kv_bytes": kv_bytes}

        def call(i, cfg=cfg):
            return mod.kvcache_attention(q, ks[i], vs[i], cache_seqlens=lens, config=cfg, **descales)
        try:
            out = call(0).float()  # against the first config's output: a config may change the order of sums only
            ref = out if ref is None else ref
            row["rel_diff"] = ((out - ref).norm() / ref.norm()).item()
            rows.append({**row, "status": "ok", **timed(call, rotate, methods=("graph",))})
        except (RuntimeError, ValueError) as e:
            rows.append({**row, "status": "error", "reason": str(e).strip().splitlines()[0][:200]})
    if with_sdpa:  # the default on SDPA's own layout (head-major storage), then SDPA
        heads, out = _decode_fn(mod, "ours-heads", q, ks, vs, lens, None, False)
        rows.append({"part": "tune", "impl": f"{configs[0].label()} heads", "batch": b, "kv_len": s,
                     "kv_bytes": kv_bytes, "status": "ok", "rel_diff": ((out.float() - ref).norm() / ref.norm()).item(),
                     **timed(heads, rotate, methods=("graph",))})
        sdpa, _ = _decode_fn(mod, "sdpa", q, ks, vs, lens, None, False)
        rows.append({"part": "tune", "impl": "sdpa (auto)", "batch": b, "kv_len": s, "kv_bytes": kv_bytes,
                     "status": "ok", **timed(sdpa, rotate, methods=("graph",))})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--parts", default="decode,varlen,tune")
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--kv-lens", default="1024,4096,8192,32768")
    p.add_argument("--varlen-lens", default="512,1024,1536,2048,3072,4096,6144,8192")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--decode-impls", default=",".join(DECODE_IMPLS),
                   help=f"decode implementations, in order (the first is the reference of rel_diff); also {', '.join(FP8_IMPLS)}")
    p.add_argument("--tune-set", choices=("sweep", "batch1", "fp8"), default="sweep",
                   help="the decode configs --parts tune times (batch1: split count and merge at batch 1, with SDPA; "
                   "fp8: tile, warps and stages over an e4m3 cache)")
    p.add_argument("--flex-budget-s", type=float, default=40.0, help="stop compiling flex cells after this long")
    add_kernel_args(p)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("kernel_serving_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    spec = kernel_from_args(args)
    mod = kernel_hub.load(spec)
    if not hasattr(mod, "flash_attn_with_kvcache"):
        print(f"kernel_serving_bench: {spec.label()} has no flash_attn_with_kvcache", file=sys.stderr)
        return 2
    parts = set(args.parts.split(","))
    impls = [i for i in args.decode_impls.split(",") if i]
    if unknown := [i for i in impls if i not in DECODE_IMPLS + FP8_IMPLS]:
        print(f"kernel_serving_bench: unknown --decode-impls {', '.join(unknown)} (known: "
              f"{', '.join(DECODE_IMPLS + FP8_IMPLS)})", file=sys.stderr)
        return 2
    t0 = time.time()
    copy_gbps = measure_copy("cuda", 1024, reps=30, warmup=5)
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
    print(f"copy ceiling {copy_gbps:.0f} GB/s (read + written), L2 {l2 / 2**20:.0f} MiB", file=sys.stderr, flush=True)
    command = "PYTHONPATH=src python3 " + " ".join(shlex.quote(a) for a in sys.argv)
    shape = {"heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "dtype": "bf16"}
    rows, flex_spent = [], 0.0

    def save() -> str:  # after every cell: a run cut short by its time limit still leaves what it measured
        return write_results(args.out, rows, copy_gbps, command, shape, spec.label())

    if "decode" in parts:
        for b in map(int, args.batches.split(",")):
            for s in map(int, args.kv_lens.split(",")):
                t = time.time()
                cell = decode_cell(mod, b, s, args.heads, args.kv_heads, args.head_dim, impls, l2,
                                   flex_spent <= args.flex_budget_s)
                flex_spent += (time.time() - t) if any(r["impl"] == "flex" and r["status"] == "ok" for r in cell) else 0
                rows += cell
                save()
                print(f"decode B={b} S={s}: " + "  ".join(
                    f"{r['impl']} {r.get('graph', float('nan')) * 1e3:.1f}us" for r in cell)
                    + f"  ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
    if "varlen" in parts:
        lengths = [int(x) for x in args.varlen_lens.split(",")]
        rows += varlen_rows(mod, lengths, args.heads, args.kv_heads, args.head_dim, flex_spent <= args.flex_budget_s)
        save()
        print(f"varlen done ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
    if "tune" in parts:
        rows += tune_rows(mod, args.heads, args.kv_heads, args.head_dim, l2, args.tune_set)
        save()
        print(f"tune done ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
    print(save())
    return 0


def write_results(out: Path, rows: list[dict], copy_gbps: float, command: str, shape: dict, kernel: str) -> str:
    """Rates beside their ceiling, then DIR/kernel-serving-bench.json and DIR/<gpu>-kernel-serving.md; the markdown."""
    from kernel_serving_report import render  # benchmarks/ is this script's folder, first on sys.path

    for r in rows:
        for method in ("eager", "graph"):
            if method in r and "kv_bytes" in r:
                r[f"{method}_gbps"] = r["kv_bytes"] / (r[method] * 1e-3) / 1e9
                r[f"{method}_of_copy"] = r[f"{method}_gbps"] / copy_gbps
            if method in r and "flops" in r:
                r[f"{method}_tflops"] = r["flops"] / (r[method] * 1e-3) / 1e12
    prov = provenance("cuda", seed=0)
    write_json(out / "kernel-serving-bench.json", {"schema": SCHEMA, "provenance": prov, "command": command,
                                                   "kernel": kernel, "shape": shape, "copy_gbps": copy_gbps,
                                                   "rows": rows})
    md = render(rows, copy_gbps, command, prov, kernel, shape)
    name = torch.cuda.get_device_name()
    gpu = next((g for g in ("h200", "h100", "a100") if g in name.lower()), "gpu")  # files named for the GPU that ran
    write_atomic(out / f"{gpu}-kernel-serving.md", md)
    return md


if __name__ == "__main__":
    sys.exit(main())
