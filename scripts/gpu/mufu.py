"""Session 14: is the conversion of P to bf16 on the same quarter-rate pipe as tanh and exp2? (TUNING.md step 21)
The softcap consumer at head dim 128 issues, per score, MUFU.TANH + MUFU.EX2 + half an F2FP (two scores per
pack), the plain one MUFU.EX2 + half an F2FP. If F2FP.BF16.F32.PACK_AB runs at the special-function unit's 16 per
clock per SM, the P conversion is a quarter of the softcap loop's work on that unit, and rounding on the integer
pipe (add 0x8000, keep the high halves with one PRMT per pair: round half away from zero, 1.5 ALU instructions per
score) would take it off. Same chains as mufu13.py (8 independent chains per thread, every SM full); prints results
per clock per SM. Check on the CPU first that each compiles to the instruction named:
    TRITON_INTERPRET=0 python3 scripts/gpu/mufu14.py --sass     (sm_90 SASS of each chain's loop, no GPU needed)
"""
import subprocess
import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mufu13 import OPS as OPS13  # noqa: E402
from mufu13 import chain  # noqa: E402

OPS = {
    "tanh.approx.f32": OPS13["tanh.approx.f32"],
    "ex2.approx.f32 (of -|x|)": OPS13["ex2.approx.f32 (of -|x|)"],
    # one pack of two results: counted as 2 (pack=2 over fp32 pairs would need a vector operand; the same x twice)
    "cvt.rn.bf16x2.f32 (F2FP pack, 2 results)": (
        "{ .reg .b32 p; cvt.rn.bf16x2.f32 p, $1, $1; mov.b32 $0, p; }", "=f,f", tl.float32, 1),
    "add.u32 + prmt (ALU pack, 2 results)": (
        "{ .reg .b32 a; add.u32 a, $1, 32768; prmt.b32 $0, a, a, 0x3276; }", "=r,r", tl.int32, 1),
    "FFMA (reference)": OPS13["FFMA (reference)"],
}
RESULTS = {name: 2 if "2 results" in name else 1 for name in OPS}


def sass() -> None:
    from triton.backends.compiler import GPUTarget

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    for name, (asm, cons, dt, pack) in OPS.items():
        src = triton.compiler.ASTSource(chain, {"X": "*fp32", "ITERS": "constexpr", "ASM": "constexpr",
                                                "CONS": "constexpr", "DT": "constexpr", "PACK": "constexpr",
                                                "BLOCK": "constexpr"},
                                        {(1,): 64, (2,): asm, (3,): cons, (4,): dt, (5,): pack, (6,): 2048})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8))
        cubin = Path(f"/tmp/mufu14-{len(asm)}.cubin")
        cubin.write_bytes(k.asm["cubin"])
        text = subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
        ops = [line.split(";")[0].split("*/")[-1].strip().split(" ")[0] for line in text.splitlines() if "*/" in line]
        top = {op: ops.count(op) for op in dict.fromkeys(ops) if ops.count(op) >= 16}
        print(f"{name:<42} {top}")


def main():
    import torch

    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    block, warps, iters = 2048, 8, 4096  # 8 elements per thread
    n = block * sms * 8
    print(f"{torch.cuda.get_device_name()}: {sms} SMs")
    for name, (asm, cons, dt, pack) in OPS.items():
        x = (torch.rand(n, device="cuda") * 0.5).to(torch.int32 if dt == tl.int32 else torch.float32)
        fn = lambda x=x, asm=asm, cons=cons, dt=dt, pack=pack: chain[(n // block,)](  # noqa: E731
            x, iters, asm, cons, dt, pack, block, num_warps=warps)
        ms = triton.testing.do_bench(fn, warmup=5, rep=50)
        rate = n * iters * RESULTS[name] / (ms * 1e-3)
        clock = torch.cuda.clock_rate() * 1e6
        print(f"{name:<42} {ms:8.3f} ms  {rate / clock / sms:6.1f} results/clk/SM at {clock / 1e9:.3f} GHz",
              flush=True)


if __name__ == "__main__":
    sass() if "--sass" in sys.argv[1:] else main()
