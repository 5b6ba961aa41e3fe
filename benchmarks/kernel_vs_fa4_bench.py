"""flash-triton beside FlashAttention-4 and cuDNN, side by side in one process, on the GPU.

The shapes are the FA4 comparison's (prefill at B·S = 16k tokens: head dims 64/128/256, causal and not, GQA; the
model features: softcap 50, a long window, gpt-oss's sinks with a 128-token window; decode at batch 1/16/64). Each
implementation runs on the same bf16 tensors: ours (`kernels/flash-triton` through `kernels`, `flash_attn_func` /
`flash_attn_with_kvcache` on contiguous `[B, S, H, D]` tensors), FlashAttention-4 (`flash_attn.cute.flash_attn_func`,
the same tensors; its `learnable_sink`, `window_size`, `softcap`), and SDPA with cuDNN forced on `[B, H, S, D]`
views of them (plain cases; GQA through `enable_gqa`). Time: CUDA-graph replays where capture works (CUDA events
otherwise, said in the row), L2 flushed before each, p50 of 20 (`attnprof.measure.timing.time_call`). TF/s count
4·B·H·Sq·Sk·D, halved when causal, also for windowed calls (so a window's rate reads above the causal one);
decode rows give GB/s of K/V read. `--explore` adds our kernel with named configs beside the default
(`Config.lpt`: FlashAttention's LPT tile order; the persistent program on a tile plan; the consumers' matmuls in
turns, `Config.pingpong`; the one-warpgroup and varlen programs for windows) — what its
defaults are chosen from; each explore row's output is held against the default's (`agreement`: a note says WRONG
past `AGREE`). `--rounds` (default 3) times the implementations of a case in turn that many times and
keeps each one's median.

`--anatomy` splits each implementation's time into its key loop and a fixed cost: not causal, 4x32 heads x 2k
queries (2,048 tiles of 128 rows, ~16 waves on 132 SMs) over 512 to 8k keys at head dims 64 and 128; a least-squares
line through µs against keys gives the loop's steady rate (TF/s of the slope) and the intercept (what a call costs
beside its key loop: launch, each tile's Q load, first block, epilogue and store, the last wave's tail). A gap in
the rate is the key loop; a gap in the intercept is the per-tile work that short causal tiles pay most often.

`--timeline` records our default program's schedule on the plain head-dim-128 cases (each tile's start and end on
the GPU's global timer, its SM and key blocks: `attention(..., timeline=)`): the busy fraction of span x SMs, the
tail, and tile µs against key blocks, whose fixed part holds the diagonal block and the tile's prologue and epilogue.

    PYTHONPATH=src python3 benchmarks/kernel_vs_fa4_bench.py [--explore] [--anatomy] [--timeline] [--only NAME,...]
        [--out rows.jsonl]
A missing FA4 or a refused shape is a `-` with its reason in the notes; nothing is timed in a unit test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import warnings
from importlib import metadata
from pathlib import Path

import torch

from attnprof.measure.timing import time_call
from attnprof.variants import kernel_hub

REPO = Path(__file__).resolve().parents[1] / "kernels" / "flash-triton"


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    b: int
    hq: int
    hkv: int
    s: int
    d: int
    causal: bool = True
    softcap: float = 0.0
    window: tuple[int, int] = (-1, -1)
    sinks: bool = False
    decode: bool = False  # one query per sequence over a cache of `s` keys
    sq: int = 0  # queries per sequence when they differ from `s` (the anatomy cases); 0: as many as keys

    def flops(self) -> float:
        f = 4.0 * self.b * self.hq * (self.sq or self.s) * self.s * self.d
        return f / 2 if self.causal else f

    def kv_bytes(self) -> float:
        return 2.0 * self.b * self.s * self.hkv * self.d * 2


CASES = [
    *(Case(f"{16384 // s}x16x{s // 1024}k d128 causal", 16384 // s, 16, 16, s, 128) for s in (1024, 2048, 4096, 8192, 16384)),
    Case("4x16x4k d64 causal", 4, 16, 16, 4096, 64), Case("1x16x16k d64 causal", 1, 16, 16, 16384, 64),
    Case("4x16x4k d128 full", 4, 16, 16, 4096, 128, causal=False),
    Case("1x16x16k d128 full", 1, 16, 16, 16384, 128, causal=False),
    Case("GQA 2x32/8x8k d128 causal", 2, 32, 8, 8192, 128),
    Case("4x16x4k d256 causal", 4, 16, 16, 4096, 256),
    Case("softcap 50 4x32/16x4k d128", 4, 32, 16, 4096, 128, softcap=50.0),
    Case("softcap 50 4x16/8x4k d256", 4, 16, 8, 4096, 256, softcap=50.0),
    Case("window 4096 1x32/8x16k d128", 1, 32, 8, 16384, 128, window=(4096, 0)),
    Case("window 512 4x32/8x4k d128", 4, 32, 8, 4096, 128, window=(512, 0)),
    Case("window 1024 4x32/8x4k d128", 4, 32, 8, 4096, 128, window=(1024, 0)),
    Case("window 2048 2x32/8x8k d128", 2, 32, 8, 8192, 128, window=(2048, 0)),
    Case("window 1024 4x64/8x4k d64", 4, 64, 8, 4096, 64, window=(1024, 0)),
    Case("gpt-oss sinks+window 128 4x64/8x4k d64", 4, 64, 8, 4096, 64, window=(128, 0), sinks=True),
    *(Case(f"decode B{b} 32/8 {s // 1024}k d128", b, 32, 8, s, 128, causal=False, decode=True)
      for b, s in ((1, 8192), (1, 32768), (16, 8192), (64, 4096))),
]
ANATOMY_KEYS = (512, 1024, 2048, 4096, 8192)
ANATOMY = [Case(f"anatomy d{d} 4x32x2k q, {s} keys", 4, 32, 32, s, d, causal=False, sq=2048)
           for d in (64, 128) for s in ANATOMY_KEYS]


def _line(pts: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Least squares y = fixed + slope·x: (fixed, slope, r²)."""
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts) or 1.0
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    fixed = my - slope * mx
    ss_res = sum((y - fixed - slope * x) ** 2 for x, y in pts)
    ss_tot = sum((y - my) ** 2 for _, y in pts) or 1.0
    return fixed, slope, 1 - ss_res / ss_tot


def anatomy_fits(rows: list[dict]) -> list[dict]:
    """Per (head dim, implementation): the least-squares line through its anatomy rows, µs = fixed + slope·keys.
    The loop's rate is the FLOPs one more key costs over the slope; `fixed_us` is the intercept."""
    out = []
    for d in sorted({r["shape"]["d"] for r in rows}):
        for impl in dict.fromkeys(r["impl"] for r in rows):
            pts = [(r["shape"]["s"], r["us"]) for r in rows
                   if r["shape"]["d"] == d and r["impl"] == impl and r["us"] is not None]
            if len(pts) < 3:
                continue
            fixed, slope, r2 = _line(pts)
            shape = next(r["shape"] for r in rows if r["shape"]["d"] == d)
            per_key_flops = 4.0 * shape["b"] * shape["hq"] * shape["sq"] * d
            out.append(dict(case=f"anatomy fit d{d}", impl=impl, fixed_us=fixed, us_per_1k_keys=slope * 1024,
                            loop_tfs=per_key_flops / slope / 1e6, r2=r2, points=len(pts)))
    return out


def timeline_summary(rec: list[tuple[int, int, int, int]]) -> dict:
    """What `attention(..., timeline=)`'s records (start ns, end ns, SM, key blocks) say of a launch's schedule: its
    span, how much of span x SMs the tiles kept busy, the tail (from the first SM to run out of tiles to the end),
    and a line through tile µs against key blocks (per-block µs, per-tile fixed µs: the diagonal block and a tile's
    prologue and epilogue are in the fixed part, compared with a launch without causal tiles)."""
    t0 = min(r[0] for r in rec)
    end = max(r[1] for r in rec)
    last: dict[int, int] = {}
    busy: dict[int, int] = {}
    for start, stop, sm, _ in rec:
        last[sm] = max(last.get(sm, 0), stop)
        busy[sm] = busy.get(sm, 0) + stop - start
    span = end - t0
    fixed, slope, r2 = _line([(float(n), (stop - start) / 1e3) for start, stop, _, n in rec])
    return dict(tiles=len(rec), sms=len(last), span_us=span / 1e3, busy=sum(busy.values()) / (len(last) * span),
                tail_us=(end - min(last.values())) / 1e3, tile_fixed_us=fixed, us_per_block=slope, r2=r2)


def run_timeline(case: Case, mod, gen, gpu: str, persistent: bool = False) -> dict | None:
    """Our default program on `case` (`persistent`: its persistent form, one record per tile of the CTAs' plans) with
    a timeline (`attention(..., timeline=)`), after a warm-up call: its schedule summarised (`timeline_summary`).
    None where the default is not the dense warp-specialized program."""
    q = torch.randn(case.b, case.sq or case.s, case.hq, case.d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(case.b, case.s, case.hkv, case.d, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    cfg = mod.choose_config(q, k, case.causal)
    if not getattr(cfg, "dense_ws", False):  # a DecodeConfig has none
        return None
    name = "ours (default)"
    if persistent:
        cfg, name = dataclasses.replace(cfg, persistent=True, lpt=False), "ours default persistent"
    tiles = case.b * case.hq * (q.shape[1] // cfg.block_m)
    buf = torch.zeros(4 * tiles, dtype=torch.int64, device="cuda")
    for _ in range(2):  # the first call compiles; the second is the one read
        mod.attention(q, k, v, None, case.causal, config=cfg, timeline=buf)
    torch.cuda.synchronize()
    rec = [tuple(r) for r in buf.view(tiles, 4).tolist()]
    return dict(case=case.name, impl=f"{name} timeline, {cfg.label()}", gpu=gpu, **timeline_summary(rec))


def explore_configs(mod, case: Case, q, k) -> dict:
    """Named configs of our kernel to time beside its default on this case (`--explore`): for windows the
    one-warpgroup program on 64x64 tiles with 2 and 3 stages, the warp-specialized varlen program and the persistent
    one (with and without `pingpong`), the one-warpgroup, varlen and persistent programs with `Config.v_wait_early`;
    for plain calls the default program with `Config.lpt` switched the other way and its persistent form (one CTA per SM
    walking a longest-first tile plan, `_plan.py`), its consumers' matmuls in turns (`Config.pingpong`) and each
    block's values waited for at the end of its softmax (`Config.v_wait_early`: the exponentials kept under the
    previous block's P·V, TUNING.md step 31); where the default is the one-warpgroup program, the warp-specialized
    program and those forms of it); at head dim 64 the varlen program on 192-row tiles, three consumers (0.84-0.90x
    FA4 against the default's 0.89-0.91 at git 461b305; no spills in its loop with Triton 3.6, the GPU image's, though
    3.9's spills), with and without `v_wait_early`. Left out after they lost on an H100 (TUNING.md steps 28-29):
    `Config.exp_poly` (0.78-0.99x the default in bf16 at every shape, git 5fd04a1) and `Config.split_mask`
    (0.93-1.00x)."""
    if case.decode or case.softcap:
        return {}
    known = mod._config  # the kernel's own named configs
    if case.window != (-1, -1) or case.sinks:
        out = {"varlen ws": known.GLUON_WS_256_VARLEN if case.d == 256 else known.GLUON_WS_VARLEN}
        if case.window != (-1, -1) and case.d in (64, 128):
            for st in (2, 3):
                out[f"one-wg 64x64 s{st}"] = dataclasses.replace(known.GLUON_64x64, num_stages=st)
                out[f"one-wg 64x64 s{st} v-wait-early"] = dataclasses.replace(known.GLUON_64x64, num_stages=st,
                                                                              v_wait_early=True)
        out["varlen ws v-wait-early"] = dataclasses.replace(out["varlen ws"], v_wait_early=True)
        if case.d in (64, 128):  # the persistent program walks each tile's window blocks from its plan
            out["ws persistent"] = dataclasses.replace(known.GLUON_WS, persistent=True)
            out["ws persistent pingpong"] = dataclasses.replace(known.GLUON_WS, persistent=True, pingpong=True)
            out["ws persistent v-wait-early"] = dataclasses.replace(known.GLUON_WS, persistent=True, v_wait_early=True)
        return out
    cfg = mod.choose_config(q, k, case.causal)
    out = {}
    if getattr(cfg, "gluon", False) and case.causal:
        out[f"default {'without' if cfg.lpt else 'with'} lpt"] = dataclasses.replace(cfg, lpt=not cfg.lpt)
    if getattr(cfg, "gluon", False):  # the exponentials kept under P·V
        out["default v-wait-early"] = dataclasses.replace(cfg, v_wait_early=True)
    if getattr(cfg, "dense_ws", False) and case.d in (64, 128):  # the forms the persistent program takes
        out["default persistent"] = dataclasses.replace(cfg, persistent=True, lpt=False)
    if getattr(cfg, "dense_ws", False):
        out["default pingpong"] = dataclasses.replace(cfg, pingpong=True)
        # FlashAttention-3 runs both: the consumers in turns and each one's softmax under its own P·V
        out["default pingpong v-wait-early"] = dataclasses.replace(cfg, pingpong=True, v_wait_early=True)
        if case.d in (64, 128):
            out["default persistent pingpong"] = dataclasses.replace(cfg, persistent=True, lpt=False, pingpong=True)
            out["default persistent v-wait-early"] = dataclasses.replace(cfg, persistent=True, lpt=False,
                                                                         v_wait_early=True)
    if case.d == 64:  # FlashAttention-3/4's head-dim-64 tile: 192 rows, three consumers (the varlen program's)
        three = dataclasses.replace(known.GLUON_WS_VARLEN, block_m=192, lpt=case.causal)
        out["varlen ws 192"] = three
        out["varlen ws 192 v-wait-early"] = dataclasses.replace(three, v_wait_early=True)
    elif getattr(cfg, "dense_gluon", False) and case.d in (64, 128):  # a one-warpgroup default: the
        out["ws"] = known.GLUON_WS  # warp-specialized program against it too, its ping-pong and persistent forms
        out["ws pingpong"] = dataclasses.replace(known.GLUON_WS, pingpong=True)
        out["ws v-wait-early"] = dataclasses.replace(known.GLUON_WS, v_wait_early=True)
        out["ws persistent"] = dataclasses.replace(known.GLUON_WS, persistent=True)
        out["ws persistent pingpong"] = dataclasses.replace(known.GLUON_WS, persistent=True, pingpong=True)
    return out


AGREE = 2e-2  # an explore config's output within this (relative Frobenius norm) of the default's: bf16 rounding


def agreement(impls: dict, names: list[str]) -> dict:
    """Each named implementation's output against the default's (`ours (default)`), relative Frobenius norm: a
    config that times well but computes something else shows here, without an oracle run (the oracle tests are
    `tests/test_kernel_cuda.py`'s)."""
    if "ours (default)" not in impls or not names:
        return {}
    ref = impls["ours (default)"]().float()
    out = {}
    for name in names:
        with torch.no_grad():
            out[name] = ((impls[name]().float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    return out


def run_case(case: Case, mod, fa4, explore: bool, gen, gpu: str, rounds: int = 1) -> list[dict]:
    """Every implementation on one case's tensors, `rounds` times in turn (each a p50 of 20 replays; the median of
    the rounds is kept, so a clock or power drift during the case hits every implementation alike): one printed line
    and one row each."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sq = 1 if case.decode else (case.sq or case.s)
    q = torch.randn(case.b, sq, case.hq, case.d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(case.b, case.s, case.hkv, case.d, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    sinks = torch.randn(case.hq, device="cuda", generator=gen) + 4 if case.sinks else None
    feats = dict(softcap=case.softcap, window_size=case.window, s_aux=sinks)
    impls = {}
    if case.decode:
        lens = torch.full((case.b,), case.s, dtype=torch.int32, device="cuda")
        impls["ours (default)"] = lambda: mod.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)
    else:
        impls["ours (default)"] = lambda: mod.flash_attn_func(q, k, v, causal=case.causal, **feats)
        f = mod.parse_features("bench", q, case.softcap, case.window, sinks)
        for label, cfg in (explore_configs(mod, case, q, k) if explore else {}).items():
            impls[f"ours {label}"] = (lambda cfg=cfg: mod.attention(q, k, v, None, case.causal, config=cfg, features=f,
                                                                    s_aux=sinks))
    if fa4 is not None:
        fa_kw = dict(causal=case.causal and not case.decode, softcap=case.softcap, learnable_sink=sinks)
        if case.window != (-1, -1):
            fa_kw["window_size"] = case.window
        impls["FA4"] = lambda: fa4(q, k, v, **fa_kw)
    if not (case.softcap or case.sinks or case.window != (-1, -1)):
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(
                    qh, kh, vh, is_causal=case.causal and not case.decode, enable_gqa=case.hq != case.hkv)
        impls["cuDNN (SDPA)"] = cudnn
    samples, notes = {}, {}
    for _ in range(rounds):
        for name, fn in impls.items():
            if name in notes and name not in samples:
                continue  # it failed in an earlier round
            try:
                t = time_call(fn, "cuda", warmup=3, reps=20, l2_flush=True, cuda_graph=True)
                samples.setdefault(name, []).append(t.p50 * 1e3)
                if t.method != "cuda-graph":
                    notes[name] = t.method
            except Exception as e:  # a refused shape or a missing runtime is a finding, not the end of the run
                notes[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
            torch.cuda.synchronize()
    times = {name: statistics.median(xs) for name, xs in samples.items()}
    for name, err in agreement(impls, [n for n in samples if n.startswith("ours ") and n != "ours (default)"]).items():
        if err > AGREE:  # a wrong answer fast is no finding: the row says so
            notes[name] = (notes.get(name, "") + f" WRONG: {err:.1e} from the default's output").strip()
    rows = []
    for name in impls:
        us = times.get(name)
        rate = None if us is None else (case.kv_bytes() / us / 1e3 if case.decode else case.flops() / us / 1e6)
        vs = {ref: (times[ref] / us if us and ref in times else None) for ref in ("FA4", "cuDNN (SDPA)")}
        rows.append(dict(case=case.name, impl=name, us=us, rate=rate, unit="GB/s" if case.decode else "TF/s",
                         x_fa4=vs["FA4"], x_cudnn=vs["cuDNN (SDPA)"], note=notes.get(name, ""),
                         rounds_us=samples.get(name, []),
                         shape=dataclasses.asdict(case), gpu=gpu))
        print(f"{case.name:<40} {name:<44} {_fmt(us, '9.1f')} {_fmt(rate, '9.0f')} {_fmt(vs['FA4'], '6.2f')} "
              f"{_fmt(vs['cuDNN (SDPA)'], '7.2f')}  {notes.get(name, '')}", flush=True)
    return rows


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:  # importable from a path pip did not record
        return "?"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--explore", action="store_true", help="also time named configs of our kernel (see above)")
    p.add_argument("--anatomy", action="store_true", help="also split each implementation's time into key loop and "
                                                           "fixed cost (see above)")
    p.add_argument("--timeline", action="store_true", help="also our default program's schedule on the plain head "
                                                            "dim 128 cases (`attention(..., timeline=)`; with "
                                                            "--explore its persistent form's too)")
    p.add_argument("--only", default="", help="comma-separated substrings of case names to run")
    p.add_argument("--out", type=Path, help="write one JSON row per (case, implementation) here")
    p.add_argument("--rounds", type=int, default=3, help="rounds over the implementations per case, median kept "
                                                          "(default 3)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("kernel_vs_fa4_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    if isinstance(mod, kernel_hub.Rejected):
        print(f"kernel_vs_fa4_bench: {mod.reason}", file=sys.stderr)
        return 2
    # FA4's CuTe DSL warns at each new compile that one of its own arguments is no JIT argument: not ours to act on
    warnings.filterwarnings("ignore", message="Argument aux_data")
    try:
        from flash_attn.cute import flash_attn_func as fa4
        fa4_version = _dist_version("flash-attn-4")
    except ImportError as e:
        fa4, fa4_version = None, f"not importable ({e})"
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, torch {torch.__version__}, flash-attn-4 {fa4_version}; median of {args.rounds} rounds of "
          "p50 of 20, L2 flushed, CUDA-graph replays unless a row says events")
    print(f"{'case':<40} {'implementation':<44} {'us':>9} {'rate':>9} {'x FA4':>6} {'x cuDNN':>7}  note")
    only = [s for s in args.only.split(",") if s]
    gen = torch.Generator(device="cuda").manual_seed(0)
    # one case's rows are written as soon as it is timed: a run cut short by a call's time limit keeps what finished
    sink = args.out.open("w") if args.out else None
    anatomy = []
    try:
        for case in CASES + (ANATOMY if args.anatomy else []):
            if not only or any(s in case.name for s in only):
                rows = run_case(case, mod, fa4, args.explore, gen, props.name,
                                max(args.rounds, 1))
                anatomy += rows if case in ANATOMY else []
                if sink:
                    sink.write("".join(json.dumps(r) + "\n" for r in rows))
                    sink.flush()
        for case in [c for c in CASES if c.d == 128 and not (c.decode or c.softcap or c.sinks or c.window != (-1, -1))
                     ] if args.timeline else []:
            if only and not any(s in case.name for s in only):
                continue
            for persistent in (False, True) if args.explore else (False,):  # with --explore its persistent form too
                t = run_timeline(case, mod, gen, props.name, persistent)
                if t is None:
                    continue
                print(f"{t['case']:<40} {'persistent ' if persistent else ''}timeline: {t['tiles']} tiles on "
                      f"{t['sms']} SMs, span {t['span_us']:.1f} us, busy {t['busy']:.1%}, tail {t['tail_us']:.1f} us; "
                      f"tile = {t['tile_fixed_us']:.2f} + {t['us_per_block']:.3f} us x key blocks (r2 {t['r2']:.3f})",
                      flush=True)
                if sink:
                    sink.write(json.dumps(t) + "\n")
        for fit in anatomy_fits(anatomy):
            print(f"{fit['case']:<40} {fit['impl']:<44} fixed {fit['fixed_us']:8.1f} us, loop {fit['loop_tfs']:6.0f} "
                  f"TF/s ({fit['us_per_1k_keys']:.1f} us per 1k keys, r2 {fit['r2']:.4f})", flush=True)
            if sink:
                sink.write(json.dumps(dict(fit, gpu=props.name)) + "\n")
    finally:
        if sink:
            sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
