"""Session 13: special-function-unit throughput on this GPU, per instruction (TUNING.md step 20): chains of
tanh.approx.f32, ex2.approx.f32, tanh.approx.f16x2 and a polynomial exp2 (FMA/ALU pipes), 8 independent chains per
thread, every SM full. Prints results (elements) per clock per SM, at the SM clock the device reports after the
runs."""
import torch
import triton
import triton.language as tl

OPS = {
    "tanh.approx.f32": ("tanh.approx.f32 $0, $1;", "=f,f", tl.float32, 1),
    "ex2.approx.f32 (of -|x|)": ("{ .reg .f32 t; neg.f32 t, $1; ex2.approx.ftz.f32 $0, t; }", "=f,f", tl.float32, 1),
    "tanh.approx.f16x2": ("tanh.approx.f16x2 $0, $1;", "=r,r", tl.float16, 2),
    "FFMA (reference)": ("fma.rn.f32 $0, $1, 0f3F7FF000, 0f3A800000;", "=f,f", tl.float32, 1),
}


@triton.jit
def chain(X, ITERS: tl.constexpr, ASM: tl.constexpr, CONS: tl.constexpr, DT: tl.constexpr, PACK: tl.constexpr,
          BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs).to(DT)
    for _ in range(ITERS):
        x = tl.inline_asm_elementwise(ASM, CONS, [x], dtype=x.dtype, is_pure=False, pack=PACK)
    tl.store(X + offs, x.to(tl.float32))


def main():
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    block, warps, iters = 2048, 8, 4096  # 8 elements per thread
    n = block * sms * 8
    x = torch.rand(n, device="cuda") * 0.5
    print(f"{torch.cuda.get_device_name()}: {sms} SMs")
    for name, (asm, cons, dt, pack) in OPS.items():
        fn = lambda asm=asm, cons=cons, dt=dt, pack=pack: chain[(n // block,)](  # noqa: E731
            x, iters, asm, cons, dt, pack, block, num_warps=warps)
        ms = triton.testing.do_bench(fn, warmup=5, rep=50)
        rate = n * iters / (ms * 1e-3)
        clock = torch.cuda.clock_rate() * 1e6
        print(f"{name:<28} {ms:8.3f} ms  {rate / clock / sms:6.1f} results/clk/SM at {clock / 1e9:.3f} GHz", flush=True)


if __name__ == "__main__":
    main()
