"""Stage four's benchmark: our fused kernel against SDPA (auto, flash) and FlexAttention, beside the matmul ceiling.

Why these shapes: the FlashAttention benchmark's convention, so the numbers compare with published ones. Forward,
causal, bf16, 16 heads, head dim 128 and 64, B·S = 16k tokens for S = 512 … 16k; FLOPs 4·B·H·S²·D / 2.
Every implementation gets its native layout through the variants registry (one way in): SDPA and flex take
contiguous `[B, H, S, D]`; the `kernel` variant gets `[B, H, S, D]` views of `[B, S, H, D]` storage, which it
transposes to flash-attn's layout for free. Every implementation runs through `attnprof.run.run` (supports(),
a first call, 10 untimed and `--reps` timed calls; an OOM or an error is a row with its reason). Each TFLOP/s
stands beside SDPA auto's (ratio) and beside a bf16 8192³ matmul measured in the same run (the ceiling). A
kernel-vs-SDPA output difference (`numerics.compare`, norm-relative) is printed per cell as a sanity check (the
real numerics check is tests/test_kernel_cuda.py against the fp64 oracle).

    PYTHONPATH=src python3 benchmarks/kernel_bench.py --out DIR [--kernel ORG/REPO@V --trust-remote-kernel]
Writes DIR/h200-kernel.md (the command line at the top) and DIR/kernel-bench.json (schema attnprof.kernel-bench/1).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path

import torch

from attnprof.bench.ceilings import measure_matmul
from attnprof.bench.flops import tflops
from attnprof.commands.common import add_kernel_args
from attnprof.files import write_atomic, write_json
from attnprof.numerics.compare import compare
from attnprof.provenance import provenance
from attnprof.run import run
from attnprof.variants import VARIANTS, Variant, kernel_hub
from attnprof.workload import Inputs, Workload

SCHEMA = "attnprof.kernel-bench/1"
IMPLS = ("sdpa", "sdpa-flash", "flex", "kernel", "kernel-triton")
SEQS = (512, 1024, 2048, 4096, 8192, 16384)


def bshd_storage(inputs: Inputs) -> Inputs:
    """The same values, as `[B, H, S, D]` views of `[B, S, H, D]` storage: flash-attn's native layout."""
    def view(t):
        return t.transpose(1, 2).contiguous().transpose(1, 2)  # (B,H,S,D) -> (B,S,H,D) copy -> (B,H,S,D) view
    return dataclasses.replace(inputs, q=view(inputs.q), k=view(inputs.k), v=view(inputs.v))


def own_kernel(spec: kernel_hub.KernelSpec):
    """Our kernel module when the loaded kernel is flash-triton (it exposes `choose_config`), else None."""
    mod = kernel_hub.load(spec)
    return mod if hasattr(mod, "choose_config") and hasattr(mod, "default_config") else None


def triton_path(mod):
    """flash-triton forced onto its Triton program (`default_config`): the row that shows what the Gluon one adds."""
    def run(inputs: Inputs) -> torch.Tensor:
        q, k, v = (t.transpose(1, 2) for t in (inputs.q, inputs.k, inputs.v))  # views -> contiguous [B, S, H, D]
        cfg = mod.default_config(q.shape[-1], q.device)
        return mod.attention(q, k, v, inputs.scale, inputs.causal, config=cfg).transpose(1, 2)
    return run


def run_cell(w: Workload, impls: list[str], reps: int, spec: kernel_hub.KernelSpec) -> dict[str, dict]:
    """Every implementation on the same input values, one `run()` each; `kernel` loads `spec` (`--kernel`)."""
    inputs = w.make_inputs(seed=0)
    results = {}
    mod = own_kernel(spec)
    kernel = kernel_hub.kernel_variant(spec)
    for impl in impls:
        if impl == "kernel-triton":
            if mod is None:
                continue
            variant = Variant("kernel-triton", triton_path(mod), supports=kernel.supports, family="kernel",
                              backend="kernel")
        else:
            variant = kernel if impl == "kernel" else VARIANTS[impl]
        if impl == "flex":
            torch._dynamo.reset()  # one compile per shape; without this the recompile limit turns flex eager
        own = bshd_storage(inputs) if impl.startswith("kernel") else inputs
        r = run(variant, w, own, reps=reps, warmup=10, keep_output=True)
        if not r.status.ran:
            results[impl] = {"status": r.status.value, "reason": r.reason}
            continue
        t = r.timing
        results[impl] = {"status": "ok", "ms": t.p50, "p20": t.p20, "p80": t.p80, "tflops": tflops(w, t.p50 * 1e-3),
                         "out": r.output}
        if impl == "kernel" and mod is not None:  # which of flash-triton's programs `kernel` ran
            results[impl]["config"] = mod.choose_config(own.q.transpose(1, 2), own.k.transpose(1, 2), w.causal).label()
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--head-dims", default="128,64")
    p.add_argument("--seqs", default=",".join(map(str, SEQS)))
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--flex-budget-s", type=float, default=90.0, help="stop compiling flex cells after this long")
    add_kernel_args(p)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("kernel_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    spec = kernel_hub.parse_spec(args.kernel, args.trust_remote_kernel)
    t0 = time.time()
    ceiling = measure_matmul("cuda", "bf16", 8192, reps=30, warmup=5)
    print(f"matmul bf16 8192^3: {ceiling:.0f} TF/s", file=sys.stderr, flush=True)
    rows, flex_spent = [], 0.0
    for d in (int(x) for x in args.head_dims.split(",")):
        for s in (int(x) for x in args.seqs.split(",")):
            w = Workload(batch=max(1, args.tokens // s), heads=args.heads, seq=s, head_dim=d, dtype="bf16",
                         causal=True, device="cuda")
            impls = [i for i in IMPLS if i != "flex" or flex_spent <= args.flex_budget_s]
            t = time.time()
            results = run_cell(w, impls, args.reps, spec)
            flex_spent += time.time() - t if "flex" in impls else 0.0  # compile time dominates the cell
            if "flex" not in impls:
                results["flex"] = {"status": "skipped", "reason": f"flex compile budget {args.flex_budget_s}s spent"}
            base = results.get("sdpa", {}).get("tflops")
            ref_out = results.get("sdpa", {}).pop("out", None)
            for impl, r in results.items():
                out = r.pop("out", None)
                if out is not None and ref_out is not None and impl != "sdpa":
                    r["rel_diff_vs_sdpa"] = compare(out, ref_out, dtype=w.dtype).norm_rel
                rows.append({"impl": impl, "batch": w.batch, "seq": s, "head_dim": d, **r,
                             "vs_sdpa": r["tflops"] / base if "tflops" in r and base else None,
                             "vs_matmul": r["tflops"] / ceiling if "tflops" in r else None})
            print(f"d={d} S={s}: " + "  ".join(f"{i} {r.get('tflops', float('nan')):.0f}" for i, r in results.items())
                  + f"  ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
    command = "PYTHONPATH=src python3 " + " ".join(shlex.quote(a) for a in sys.argv)
    prov = provenance("cuda", seed=0)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "kernel-bench.json", {"schema": SCHEMA, "provenance": prov, "command": command,
                                                "kernel": spec.label(),
                                                "matmul_bf16_tflops": ceiling, "rows": rows})
    md = render(rows, ceiling, command, prov, spec.label())
    write_atomic(args.out / "h200-kernel.md", md)
    print(md)
    return 0


def render(rows: list[dict], ceiling: float, command: str, prov: dict, kernel: str) -> str:
    lines = [f"# Stage four: fused attention forward on {prov['device']}", "", "```", command, "```", "",
             f"torch {prov['torch']}, CUDA {prov['cuda']}, cuDNN {prov['cudnn']}, Triton {prov['triton']}, "
             f"kernels {prov['kernels']}, git {prov['git_sha']}, {prov['time_utc']}. `kernel` = {kernel}.",
             f"Causal bf16, 16 heads, B·S = 16k tokens; TFLOP/s = 4·B·H·S²·D/2 over the median of the timed calls; "
             f"ceiling = bf16 8192³ matmul measured in this run: **{ceiling:.0f} TFLOP/s**. "
             "`kernel (…)` names the flash-triton program `flash_attn_func` chose; `kernel-triton` is the same kernel "
             "forced onto its Triton program.", ""]
    for d in sorted({r["head_dim"] for r in rows}, reverse=True):
        lines += [f"## head dim {d}", "",
                  "| S | B | impl | ms (p50) | TFLOP/s | × SDPA auto | × matmul | rel. diff vs SDPA |",
                  "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in (r for r in rows if r["head_dim"] == d):
            if r["status"] != "ok":
                lines.append(f"| {r['seq']} | {r['batch']} | {r['impl']} | {r['status']}: {r['reason'][:80]} | | | | |")
                continue
            diff = f"{r['rel_diff_vs_sdpa']:.1e}" if "rel_diff_vs_sdpa" in r else ""
            impl = f"{r['impl']} ({r['config']})" if r.get("config") else r["impl"]
            lines.append(f"| {r['seq']} | {r['batch']} | {impl} | {r['ms']:.3f} | {r['tflops']:.0f} | "
                         f"{r['vs_sdpa']:.2f} | {r['vs_matmul']:.2f} | {diff} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
