"""Check flash-triton on a GPU against the fp64 oracle, then time launch configs (the data behind TUNING.md).

Run from the repository root on the GPU machine:
    PYTHONPATH=src python3 kernels/flash-triton/tune.py --out "$OUT/kernel-tune" [--budget-s 300]
Loads the kernel only through `kernels.get_local_kernel`. Correctness: for each case, the kernel's error against
`reference_attention` (fp64) must be at most twice the error of plain eager attention in the same dtype
(norm-relative). Timing: `triton.testing.do_bench` median, TFLOP/s = 4·B·H·S²·D / 2 (causal), beside SDPA auto
and the measured bf16 8192³ matmul ceiling. Writes tune.json and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton

from attnprof.variants.naive import naive_attention
from attnprof.variants.reference import reference_attention
from attnprof.workload import Workload

REPO = Path(__file__).resolve().parent

CASES = [  # (B, Hq, Hkv, Sq, Sk, D, dtype, causal)
    (2, 8, 2, 1000, 1000, 256, "bf16", True),
    (2, 8, 8, 777, 777, 96, "bf16", False),
    (1, 8, 2, 300, 900, 80, "fp16", True),
    (2, 8, 8, 1024, 1024, 128, "bf16", True),
    (2, 8, 8, 1024, 1024, 64, "fp16", True),
    (2, 8, 2, 1000, 1000, 128, "bf16", False),
    (3, 4, 4, 1025, 1025, 64, "bf16", True),
    (2, 4, 1, 97, 300, 128, "fp16", True),
    (2, 4, 4, 300, 97, 64, "bf16", True),
    (1, 4, 4, 1, 777, 128, "bf16", True),
    (2, 16, 16, 4096, 4096, 128, "bf16", True),
    (2, 8, 2, 512, 1536, 128, "fp16", True),  # aligned, Sq < Sk, GQA: shapes the Gluon program takes
    (1, 8, 8, 2048, 2048, 64, "bf16", True),
    (2, 8, 2, 1024, 1024, 128, "bf16", False),  # aligned, not causal: the Gluon programs' non-causal path
    (1, 8, 8, 2048, 1024, 64, "fp16", False),
]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double().nan_to_num(nan=float("inf"))
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(mod, configs, views: bool = False) -> list[dict]:
    """Every case on the default and on `configs` against the fp64 oracle; `views`: hand the kernel `[B, S, H, D]`
    views of `[B, H, S, D]` tensors instead of contiguous copies."""
    rows = []
    for b, hq, hkv, sq, sk, d, dtype, causal in CASES:
        w = Workload(batch=b, heads=hq, kv_heads=hkv, seq=sq, kv_seq=sk, head_dim=d, dtype=dtype, causal=causal,
                     device="cuda")
        inp = w.make_inputs(seed=sq + sk)
        ref = reference_attention(inp)
        seen = ref.new_ones(())  # rows that see at least one key (eager gives NaN for the others)
        if inp.valid is not None:
            seen = inp.valid.any(-1, keepdim=True)  # (B, 1, Sq, 1)
        eager = naive_attention(inp).double().masked_fill(~seen, 0.0) if causal else naive_attention(inp)
        base = rel_err(eager, ref)
        q, k, v = (t.transpose(1, 2) if views else t.transpose(1, 2).contiguous()  # [B,H,S,D] -> [B,S,H,D]
                   for t in (inp.q, inp.k, inp.v))
        for cfg in configs.get(d, [None]):
            if cfg is not None and cfg.gluon and (why := mod.gluon_unsupported(q, k, causal, cfg)):
                rows.append({"case": w.label(), "config": cfg.label(), "skipped": why, "ok": None})
                continue  # the Gluon program refuses this shape (and says why): not a failure
            out = mod.attention(q, k, v, inp.scale, causal, config=cfg).transpose(1, 2)  # -> [B, H, S, D]
            torch.cuda.synchronize()
            err = rel_err(out, ref)
            rows.append({"case": w.label(), "config": cfg.label() if cfg else "default", "err": err,
                         "eager_err": base, "ok": err <= 2 * base})
    return rows


def matmul_ceiling() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    bm = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: a @ bm, warmup=50, rep=200, return_mode="median")
    return 2 * 8192**3 / ms / 1e9


def tflops(b, h, s, d, ms, causal=True) -> float:
    return 4 * b * h * s * s * d / (2 if causal else 1) / ms / 1e9


ROUND = {"1": "broad: BLOCK_M 128 x BLOCK_N 64/128 x warps 4/8 x stages 2/3/4 (TMA), pointer loads, 64x64",
         "2": "around round 1's winners (64x64 w4 s3 tma; 128x128 w8 s3 tma)",
         "3": "Hopper overlap: the hand-pipelined unmasked loop (ov) and Triton's warp specialization (ws)",
         "4": "exp2 on two pipes (px: half the exponentials as an FMA polynomial) and 64x32 tiles (3 CTAs/SM)",
         "5": "the Gluon program (softmax of block j under P V of block j-1) and lazy rescale (lz) in Triton",
         "6": "the warp-specialized Gluon program: 128-row tile, two consumer warpgroups sharing K/V, a TMA warp",
         "7": "the warp-specialized Gluon program made persistent (one CTA per SM walks the tiles)",
         "10": "head dims 256 (TMA tiles and warps) and 80/96 (padded to 128 columns, pointer loads)",
         "11": "non-causal and short sequences on the Gluon programs; ragged lengths through the varlen Gluon one",
         "12": "head dim 256 on the warp-specialized Gluon program (128x64 tiles, 2 stages) against the Triton one",
         "13": "the warp-specialized Gluon programs with K released after QK^T and V after P V, against the joint "
               "release before (joint), per head dim",
         "14": "short sequences at head dim 128: the one-warpgroup Gluon program (64-row tiles, two CTAs per SM) "
               "against the warp-specialized one"}


def candidates(mod, d: int, round_: str = "1") -> list:
    if round_ == "14":  # 64x64 tiles: 112 KiB of shared memory with 3 stages, 80 with 2: two CTAs per SM
        C = mod.Config
        return [C(64, 64, 4, 3, gluon=True), C(64, 64, 4, 2, gluon=True), C(64, 128, 4, 2, gluon=True),
                C(128, 128, 4, 3, gluon=True, warp_specialize=True)]
    if round_ == "13":  # timed on views, as round 12; "joint": the schedule before (one release after P V)
        C = mod.Config
        ws = dict(gluon=True, warp_specialize=True)
        if d == 256:
            return [C(128, 64, 4, 2, joint_release=True, **ws), C(128, 64, 4, 2, **ws), C(128, 32, 4, 3, **ws),
                    C(128, 64, 4, 2, varlen=True, **ws)]
        out = [C(128, 128, 4, 3, joint_release=True, **ws), C(128, 128, 4, 3, **ws), C(128, 128, 4, 2, **ws),
               C(128, 128, 4, 3, varlen=True, **ws)]
        return out if d != 64 else [C(64, 128, 4, 2, True), C(64, 128, 4, 2, gluon=True)] + out
    if round_ == "12":  # timed on [B, S, H, D] views of [B, H, S, D] tensors (80, 96 need them on Gluon)
        C = mod.Config
        ws = dict(gluon=True, warp_specialize=True)
        if d == 256:
            return [C(128, 64, 8, 2, True), C(128, 64, 4, 2, **ws), C(128, 64, 4, 2, varlen=True, **ws),
                    C(128, 32, 4, 3, **ws), C(128, 32, 4, 4, **ws)]
        return [C(64, 64, 4, 3, False), C(128, 128, 4, 3, **ws), C(128, 128, 4, 3, varlen=True, **ws),
                C(128, 64, 4, 3, **ws), C(128, 64, 4, 4, **ws)]
    if round_ == "11":
        C = mod.Config
        ws = dict(gluon=True, warp_specialize=True)
        if d == 128:
            return [C(64, 64, 4, 3, True), C(64, 64, 4, 3, gluon=True), C(128, 128, 4, 3, **ws),
                    C(128, 128, 4, 2, **ws), C(128, 64, 4, 3, **ws)]
        return [C(64, 128, 4, 2, True), C(64, 128, 4, 2, gluon=True), C(128, 128, 4, 3, **ws),
                C(128, 64, 4, 3, **ws)]
    if round_ == "10":
        C = mod.Config
        if d == 256:
            return [C(64, 32, 8, 2, True), C(64, 64, 8, 2, True), C(64, 64, 4, 2, True), C(128, 64, 8, 2, True),
                    C(128, 32, 8, 2, True), C(64, 64, 8, 3, True), C(128, 64, 8, 2, False)]
        return [C(64, 64, 4, 3, False), C(64, 128, 4, 2, False), C(128, 64, 8, 3, False), C(128, 128, 8, 2, False),
                C(64, 32, 4, 3, False)]
    if round_ == "7":
        C = mod.Config
        ws = dict(gluon=True, warp_specialize=True)
        out = [C(128, 128, 4, 3, **ws), C(128, 128, 4, 3, persistent=True, **ws)]
        return out if d == 128 else [C(64, 128, 4, 2, True)] + out
    if round_ == "6":
        C = mod.Config
        ws = dict(gluon=True, warp_specialize=True)
        if d == 128:
            return [C(64, 64, 4, 3, True), C(64, 64, 4, 3, gluon=True), C(128, 64, 4, 3, **ws), C(128, 64, 4, 4, **ws),
                    C(128, 128, 4, 2, **ws), C(128, 128, 4, 3, **ws)]
        return [C(64, 128, 4, 2, True), C(64, 128, 4, 2, gluon=True), C(128, 128, 4, 2, **ws),
                C(128, 128, 4, 3, **ws), C(128, 64, 4, 4, **ws)]
    if round_ == "5":
        C = mod.Config
        if d == 128:
            return [C(64, 64, 4, 3, True), C(64, 64, 4, 3, True, lazy_rescale=True),
                    C(128, 128, 8, 3, True, lazy_rescale=True),
                    C(64, 64, 4, 3, gluon=True), C(64, 64, 4, 2, gluon=True), C(64, 128, 4, 2, gluon=True),
                    C(128, 64, 8, 3, gluon=True), C(128, 128, 8, 2, gluon=True)]
        return [C(64, 128, 4, 2, True), C(64, 128, 4, 2, True, lazy_rescale=True),
                C(64, 128, 4, 2, gluon=True), C(64, 128, 4, 3, gluon=True), C(64, 64, 4, 3, gluon=True),
                C(128, 128, 8, 2, gluon=True)]
    if round_ == "4":
        C = mod.Config
        if d == 128:
            return [C(64, 64, 4, 3, True), C(64, 64, 4, 3, True, poly_exp=True), C(64, 32, 4, 3, True),
                    C(64, 32, 4, 4, True), C(64, 32, 4, 3, True, poly_exp=True), C(128, 128, 8, 3, True, poly_exp=True),
                    C(64, 128, 4, 2, True, poly_exp=True), C(128, 64, 8, 3, True, poly_exp=True)]
        return [C(64, 128, 4, 2, True), C(64, 128, 4, 2, True, poly_exp=True), C(64, 64, 4, 3, True, poly_exp=True),
                C(128, 128, 8, 2, True, poly_exp=True)]
    if round_ == "3":
        C = mod.Config
        if d == 128:
            return [C(64, 64, 4, 3, True), C(64, 64, 4, 3, True, overlap=True), C(64, 64, 4, 3, True, True),
                    C(128, 128, 8, 3, True), C(128, 128, 8, 3, True, overlap=True), C(128, 128, 8, 3, True, True),
                    C(128, 64, 8, 3, True, overlap=True), C(64, 128, 4, 2, True, overlap=True)]
        return [C(64, 128, 4, 2, True), C(64, 128, 4, 2, True, overlap=True), C(64, 128, 4, 2, True, True),
                C(64, 64, 4, 3, True, overlap=True), C(128, 128, 8, 2, True, overlap=True)]
    if round_ == "2":
        return [mod.Config(64, 64, 4, 3, True), mod.Config(64, 64, 4, 2, True), mod.Config(64, 128, 4, 2, True),
                mod.Config(64, 128, 4, 3, True), mod.Config(64, 64, 4, 3, False), mod.Config(128, 128, 8, 3, True),
                mod.Config(128, 128, 8, 3, False)]
    out = [mod.Config(128, bn, w, s, True) for bn in (64, 128) for w in (4, 8) for s in (2, 3, 4)]
    out += [mod.Config(128, 64, w, 3, False) for w in (4, 8)]
    out += [mod.Config(64, 64, 4, s, True) for s in (3, 4)]
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=300.0)
    p.add_argument("--round", choices=sorted(ROUND), default="1", help="which candidate list (see ROUND)")
    p.add_argument("--head-dims", default="128,64")
    p.add_argument("--shapes", default="16x1024,4x4096,1x16384", help="BxS, comma-separated (16 heads)")
    p.add_argument("--causal", choices=("causal", "full", "both"), default="causal", help="which masks to time")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    from kernels import get_local_kernel

    mod = get_local_kernel(REPO)
    print(f"loaded {mod.__name__} from {REPO} | {torch.cuda.get_device_name()} | triton {triton.__version__}",
          flush=True)
    shapes = [tuple(int(n) for n in x.split("x")) for x in args.shapes.split(",")]
    head_dims = [int(x) for x in args.head_dims.split(",")]
    heads = 16
    result = {"round": ROUND[args.round], "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "argv": sys.argv}
    views = args.round in ("12", "13", "14")  # head dims 80, 96 run on Gluon only from [B, H, S, D] storage
    result["check_default"] = check(mod, {}, views)
    print("check default:", sum(r["ok"] for r in result["check_default"]), "/", len(result["check_default"]),
          flush=True)
    for r in result["check_default"]:
        if not r["ok"]:
            print("  FAIL", r, flush=True)
    result["matmul_tflops"] = ceiling = matmul_ceiling()
    print(f"matmul bf16 8192^3: {ceiling:.0f} TF/s", flush=True)
    timings = []
    causals = {"causal": (True,), "full": (False,), "both": (True, False)}[args.causal]
    for d, causal, (b, s) in ((d, c, sh) for d in head_dims for c in causals for sh in shapes):
        q, k, v = (torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        if views:  # the Gluon program takes head dims 80, 96 only from [B, H, S, D] storage
            q, k, v = (t.transpose(1, 2) for t in (qh, kh, vh))
        cell = {"d": d, "b": b, "s": s, "causal": causal}

        def timed(impl: str, fn) -> None:
            if time.time() - t0 > args.budget_s:
                timings.append({**cell, "impl": impl, "error": "skipped: budget"})
                return
            try:
                ms = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
                timings.append({**cell, "impl": impl, "ms": ms, "tflops": tflops(b, heads, s, d, ms, causal)})
            except Exception as e:  # a config that does not fit (shared memory, registers) is data here
                timings.append({**cell, "impl": impl, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"})

        timed("sdpa-auto", lambda: torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=causal))
        timed("default", lambda: mod.attention(q, k, v, None, causal))
        for cfg in candidates(mod, d, args.round):
            if cfg.gluon and (why := mod.gluon_unsupported(q, k, causal, cfg)):
                timings.append({**cell, "impl": cfg.label(), "error": f"refused: {why}"})
                continue
            timed(cfg.label(), lambda cfg=cfg: mod.attention(q, k, v, None, causal, config=cfg))
        if args.round == "11":  # the same tensors as packed sequences through the varlen Gluon program
            cu = torch.arange(0, (b + 1) * s, s, device="cuda", dtype=torch.int32)
            qp, kp, vp = (t.view(b * s, heads, d) for t in (q, k, v))
            ws = mod.Config(128, 128, 4, 3, gluon=True, warp_specialize=True)
            if mod.gluon_varlen_unsupported(qp, kp, vp, ws) is None:
                timed("varlen " + ws.label(), lambda: mod.varlen_attention(qp, kp, vp, cu, cu, s, None, causal,
                                                                           config=ws))
        print(f"d={d} b={b} s={s} {'causal' if causal else 'full'} done at {time.time() - t0:.0f}s", flush=True)
    result["timings"] = timings
    # correctness of the fastest config per head dim, on the full case list
    best = {}
    for t in timings:
        if "tflops" in t and t["impl"] not in ("sdpa-auto", "default") and t["s"] >= 4096 and t["impl"] in {
                c.label() for c in candidates(mod, t["d"], args.round)}:
            best.setdefault((t["d"], t["impl"]), []).append(t["tflops"])
    winners = {}
    for d in head_dims:
        scored = [(sum(v) / len(v), impl) for (dd, impl), v in best.items() if dd == d]
        if scored:
            winners[d] = max(scored)[1]
    result["winners"] = winners
    cfg_of = {c.label(): c for d in head_dims for c in candidates(mod, d, args.round)}
    result["check_winners"] = check(mod, {d: [cfg_of[w]] for d, w in winners.items()}, views)
    if args.round in ("5", "6", "7", "11", "12", "13", "14"):  # new programs: every candidate on the full case list, not just the winners
        result["check_all"] = check(mod, {d: candidates(mod, d, args.round) for d in head_dims}, views)
    (args.out / "tune.json").write_text(json.dumps(result, indent=1))

    print(f"\n{'d':>4} {'B':>3} {'S':>6} {'mask':<6} {'impl':<30} {'ms':>8} {'TF/s':>6} {'/sdpa':>6} {'/mm':>5}")
    sdpa = {(t["d"], t["s"], t["causal"]): t.get("tflops") for t in timings if t["impl"] == "sdpa-auto"}
    for t in timings:
        head = f"{t['d']:>4} {t['b']:>3} {t['s']:>6} {'causal' if t['causal'] else 'full':<6} {t['impl']:<30}"
        base = sdpa.get((t["d"], t["s"], t["causal"]))
        if "tflops" not in t or not base:
            print(f"{head} {t.get('error', 'no sdpa-auto timing')[:70]}")
            continue
        print(f"{head} {t['ms']:8.3f} {t['tflops']:6.0f} {t['tflops'] / base:6.2f} {t['tflops'] / ceiling:5.2f}")
    print("winners:", winners)
    checked = result["check_default"] + result["check_winners"] + result.get("check_all", [])
    bad = [r for r in checked if r["ok"] is False]
    print(f"checked {sum(r['ok'] is True for r in checked)} runs, {sum(r['ok'] is None for r in checked)} refused")
    print(f"checks: {len(bad)} failed" + "".join(f"\n  {r}" for r in bad))
    print(f"total {time.time() - t0:.0f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
