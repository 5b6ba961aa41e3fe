"""flash-triton's serving programs compiled ahead of time for sm_90 (the H200) on the CPU: they compile, and the
machine code keeps what they are built for, before any GPU run.

- The decode program streams K/V through Triton's software pipeliner (`cp.async` copies, `num_stages` deep) with
  no register spills; a paged cache keeps the same depth as a dense one (a block-table load inside the loop used
  to cut the K/V buffers to one stage: the page ids are now loaded a tile ahead); the fused merge has its atomics.
- The prefill program with `VARLEN` compiles on both load paths (TMA descriptors and pointers), and the
  warp-specialized Gluon program over packed sequences keeps the Gluon program's schedule (softmax under the second
  matmul, register hand-off to the consumers, no spills, within shared memory).
Triton specialises pointers and strides divisible by 16 at launch; the signatures here say so (without it nothing
vectorises and nothing is pipelined, which would test a kernel no GPU runs). Numerics: test_kernel_serving_cuda.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

SOURCE = Path(__file__).resolve().parents[1] / "kernels" / "flash-triton" / "torch-ext" / "flash_triton"
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
SMEM_PER_SM = 232448


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"flash_triton_{name}", SOURCE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made (`_splits`)
    spec.loader.exec_module(mod)
    return mod


def _compile(fn, pointers: dict[str, str], const: dict, divisible, warps=4, stages=3):
    names = fn.arg_names
    sig = {n: "i32" for n in names}
    sig.update(pointers)
    sig.update({k: "constexpr" for k in const})
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n not in const and divisible(n)}
    src = ASTSource(fn, sig, {(names.index(k),): v for k, v in const.items()}, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))


def _usage(kernel, tmp: Path) -> tuple[int, int]:
    cubin = tmp / "k.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    out = subprocess.run([str(BIN / "cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True,
                         text=True, check=True).stdout
    return int(re.search(r"REG:(\d+)", out).group(1)), int(re.search(r"LOCAL:(\d+)", out).group(1))


def _key_loop(sass: str) -> list[str]:
    """The instructions of the first consumer's key loop: the first loop (a backward conditional branch) whose body
    holds the P·V wgmma (`tnspB`: V read untransposed), masked branches included."""
    lines = sass.splitlines()
    labels = {line.strip().rstrip(":"): i for i, line in enumerate(lines) if re.match(r"^\.L_x_\d+:", line)}
    for i, line in enumerate(lines):
        m = re.search(r"@!?P\d BRA `\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i and any("tnspB" in x for x in lines[labels[m.group(1)]:i]):
            return [x for x in lines[labels[m.group(1)]:i + 1] if re.match(r"\s*/\*[0-9a-f]+\*/", x)]
    raise AssertionError("no key loop with a P·V wgmma in the SASS")


def _loop_spills(sass: str) -> int:
    """Local-memory loads and stores inside the key loop: a register spill there costs every block. (cuobjdump's
    LOCAL misses them: this program's spills are counted as STACK.)"""
    return sum(bool(re.search(r"\b(STL|LDL)\b", x)) for x in _key_loop(sass))


def compile_decode(page: int, append: bool, fused: bool, d: int = 128, softcap: bool = False, fp8: bool = False,
                   v_keys: bool = False, **config):
    """The decode program as the shipped default config (or `DecodeConfig(**config)`) launches it at head dim d
    (`DecodeConfig.for_head_dim`); `fp8`: over an e4m3 cache with descales; `v_keys`: its v stored with the keys
    contiguous (stride_vcs = 1, which Triton specializes at launch)."""
    fn = _load("_decode").kvcache_fwd
    cfg = _load("_splits").DecodeConfig(**config).for_head_dim(d)
    pointers = {n: "*bf16" for n in ("Q", "KCache", "VCache", "KNew", "VNew", "O")}
    pointers.update(LSE="*fp32", Seqlens="*i32", BatchIdx="*i32", LeftPad="*i32", Table="*i32", PartAcc="*fp32",
                    Counters="*i32", qk_scale="fp32", softcap_in="fp32", softcap_out="fp32")
    if fp8:
        pointers.update(KCache="*fp8e4nv", VCache="*fp8e4nv", KDescale="*fp32", VDescale="*fp32")
    const = dict(HEAD_DIM=d, BLOCK_D=d, BLOCK_M=16, BLOCK_N=cfg.block_n, PAGE_SIZE=page, CAUSAL=append,
                 APPEND=append, HAS_SEQLENS=True, HAS_BATCH_IDX=False, HAS_LEFTPAD=False, SPLIT=True,
                 FUSED_REDUCE=fused, STORE_LSE=False, PREFETCH=cfg.prefetch_merge, MERGE_GROUP=cfg.merge_group,
                 LSE=None, BatchIdx=None,
                 LeftPad=None, Sinks=None, SOFTCAP=softcap, WINDOW=False, SINKS=False, DESCALE=fp8)
    const["V_KEYS"] = v_keys  # a constexpr left out would compile as a runtime int, both branches kept
    if v_keys:
        const["stride_vcs"] = 1
    if not fp8:
        const.update(KDescale=None, VDescale=None)
    if not append:
        const.update(KNew=None, VNew=None)
    if not page:
        const["Table"] = None
    if not fused:
        const["Counters"] = None
    return _compile(fn, pointers, const, lambda n: n in pointers and n != "qk_scale" or n.startswith("stride")
                    or n in ("cap", "split_len", "ml_off"), stages=cfg.num_stages, warps=cfg.num_warps)


pytestmark = pytest.mark.skipif(not (BIN / "cuobjdump").exists(), reason="this Triton wheel ships no cuobjdump")


@pytest.fixture(scope="module")
def decode():
    return {"dense": compile_decode(0, False, True), "paged64-append": compile_decode(64, True, True),
            "paged16-2launch": compile_decode(16, False, False), "dense-d256": compile_decode(0, False, True, d=256),
            "dense-softcap": compile_decode(0, False, True, softcap=True),
            "dense-merge1-prefetch": compile_decode(0, False, True, merge_group=1, prefetch_merge=True),
            "dense-fp8": compile_decode(0, False, True, fp8=True),
            "paged64-append-fp8": compile_decode(64, True, True, fp8=True),
            "dense-fp8-vkeys": compile_decode(0, False, True, fp8=True, v_keys=True)}


@pytest.mark.parametrize("variant", ["dense", "paged64-append", "paged16-2launch", "dense-d256", "dense-softcap",
                                     "dense-merge1-prefetch", "dense-fp8", "paged64-append-fp8", "dense-fp8-vkeys"])
def test_decode_program_is_pipelined_without_spills(decode, variant, tmp_path):
    kernel = decode[variant]
    regs, local = _usage(kernel, tmp_path)
    assert local == 0, f"register spills ({regs} registers, {local} bytes of local memory)"
    copies = kernel.asm["ttgir"].count("async_copy_global_to_local")
    assert copies >= 4, f"K/V loads not software-pipelined ({copies} async copies)"
    assert kernel.metadata.shared <= SMEM_PER_SM


def test_an_fp8_cache_moves_one_byte_per_element_and_widens_in_registers(decode):
    """The FP8 program's K/V tiles are e4m3 in shared memory (half the bytes of bf16 per stage) and widened to bf16
    after the load, never before: its K/V shared memory is at most the bf16 program's."""
    fp8, bf16 = decode["dense-fp8"], decode["dense"]
    assert "f8E4M3FN" in fp8.asm["ttgir"] and "f8E4M3FN" not in bf16.asm["ttgir"]
    assert fp8.metadata.shared < bf16.metadata.shared, (fp8.metadata.shared, bf16.metadata.shared)


def test_an_fp8_v_stored_keys_contiguous_reaches_the_mma_without_byte_loads(decode):
    """P·V's B operand has the keys as its reduction dim. An FP8 V stored head-dim-contiguous is gathered from shared
    memory one byte at a time (`ld.shared.b8`, 128 per thread per 128-key tile: the FP8 decode at 73-84 % of the
    copy ceiling on the H100); stored keys-contiguous (`V_KEYS`) its whole tiles come through a multi-buffered async
    copy ring like K's, 16 bytes per copy, and no byte loads are left."""
    plain, keys = decode["dense-fp8"].asm, decode["dense-fp8-vkeys"].asm
    assert len(re.findall(r"ld\.shared\.b8", plain["ptx"])) >= 64  # what V_KEYS removes
    assert "ld.shared.b8" not in keys["ptx"] and "cp.async.ca" not in keys["ptx"]
    rings = re.findall(r"%(\w+) = ttg\.local_alloc : \(\) -> !ttg\.memdesc<[2-9]x128x128xf8E4M3FN", keys["ttgir"])
    assert "vt" in rings, rings


def test_paged_cache_keeps_the_dense_pipeline_depth(decode):
    dense, paged = decode["dense"].metadata.shared, decode["paged64-append"].metadata.shared
    assert paged >= dense, f"paged decode buffers {paged} B of K/V, dense {dense} B: fewer stages in flight"


def test_soft_capping_compiles_without_spills_or_inline_assembly(decode, tmp_path):
    """The decode program's softcap keeps the exp2 form of tanh: `tanh.approx.f32` ran batch-1 decode 1.9x slower on
    the GPU (session 10), so it is the Gluon program's only."""
    regs, local = _usage(decode["dense-softcap"], tmp_path)
    assert local == 0 and "tanh.approx" not in decode["dense-softcap"].asm["ptx"]


def test_fused_merge_counts_with_atomics(decode):
    assert "atomic_rmw" in decode["dense"].asm["ttgir"]
    assert "atomic_rmw" not in decode["paged16-2launch"].asm["ttgir"]  # the second launch merges instead


@pytest.mark.parametrize("tma, features, window", [(True, False, False), (False, False, False), (True, True, True),
                                                   (True, True, False)],
                         ids=["tma", "pointers", "tma-softcap-window-sinks", "tma-softcap-sinks"])
def test_varlen_prefill_compiles_on_both_load_paths(tma, features, window):
    """Plain, and with the model features on (`_features.py`: Gemma 2's softcap and window, gpt-oss's sinks; without a
    window, soft-capping runs in the unmasked fast loop too)."""
    fn = _load("_kernel").attention_fwd
    pointers = dict(Q="*bf16", K="*bf16", V="*bf16", O="*bf16", qk_scale="fp32", CuSeqQ="*i32", CuSeqK="*i32",
                    softcap_in="fp32", softcap_out="fp32")
    const = dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_M=64, BLOCK_N=64, CAUSAL=True, USE_TMA=tma, WARP_SPECIALIZE=False,
                 OVERLAP=False, POLY_EXP=False, LAZY_RESCALE=False, VARLEN=True, SOFTCAP=features, WINDOW=window,
                 SINKS=features)
    if features:
        pointers["Sinks"] = "*fp32"
    else:
        const["Sinks"] = None
    if tma:
        pointers.update({n: "tensordesc<bf16[64, 128]>" for n in ("desc_q", "desc_k", "desc_v")})
    else:
        const.update(desc_q=None, desc_k=None, desc_v=None)
    kernel = _compile(fn, pointers, const, lambda n: n in ("Q", "K", "V", "O", "CuSeqQ", "CuSeqK")
                      or n.startswith("stride"))
    ttgir = kernel.asm["ttgir"]
    assert ttgir.count("async_tma_copy" if tma else "async_copy_global_to_local") >= 4
    assert kernel.metadata.shared <= SMEM_PER_SM


def compile_gluon_varlen(dense: bool, heads_in_rows: bool, d: int, valid: int, features: bool = False,
                         cap_bound: bool = False, p_pack_alu: bool = False, softcap_only: bool = False,
                         cap_poly: int = 0, block_m: int = 128, stages: int | None = None, lpt: bool = False,
                         v_wait_early: bool = False):
    """The warp-specialized varlen Gluon program compiled for sm_90 as `_launch_gluon*` launches it; `features`:
    softcap, window and sinks all on (`_features.py`), with `cap_bound` the softcap without a running max
    (`softcap_only`: softcap alone; `cap_poly`: one exp2 in that many of it on the FMA pipes); `p_pack_alu`: P
    rounded to bf16 on the integer pipe; `v_wait_early`: `Config.v_wait_early`. Every constexpr is passed: one left at its default shares Triton's compile
    cache with a call that spells another value."""
    import sys
    import types

    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    pkg = types.ModuleType("flash_triton_src")  # the source as a package: _gluon_varlen imports ._gluon
    pkg.__path__ = [str(SOURCE)]
    sys.modules.setdefault("flash_triton_src", pkg)
    fn = importlib.import_module("flash_triton_src._gluon_varlen").attention_fwd_sm90_ws_varlen

    def desc(rows: int) -> str:
        return f"tensordesc<bf16[{rows}, {d}],{gl.NVMMASharedLayout.get_default_for([rows, d], gl.bfloat16)!r}>"

    block_n, default_stages = (64, 2) if d == 256 else (128, 3)  # head dim 256: 128x64 tiles, 2 stages (192 KiB)
    stages = stages or default_stages
    names = fn.arg_names
    sig = {n: "i32" for n in names}
    sig.update(desc_q=desc(64), desc_k=desc(block_n), desc_v=desc(block_n), O="*bf16", qk_scale="fp32",
               CuSeqQ="*i32", CuSeqK="*i32")
    sig.update(softcap_in="fp32", Sinks="*fp32")
    const = dict(HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=True, num_warps=4, DENSE=dense,
                 HEADS_IN_ROWS=heads_in_rows, HEAD_DIM_VALID=valid,  # valid 80/96: zero-padded 128-wide tiles
                 JOINT_RELEASE=False, SOFTCAP=features or softcap_only, WINDOW=features, SINKS=features,
                 CAP_BOUND=cap_bound, P_PACK_ALU=p_pack_alu, CAP_POLY=cap_poly, LPT=lpt, V_WAIT_EARLY=v_wait_early)
    if not features:
        const["Sinks"] = None
    if dense:
        const.update(CuSeqQ=None, CuSeqK=None)  # not read: every sequence has SQ queries and SK keys
    sig.update({k: "constexpr" for k in const})
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("O", "stride_os", "CuSeqQ", "CuSeqK")
             if n not in const}
    return triton.compile(GluonASTSource(fn, sig, {(names.index(k),): v for k, v in const.items()}, attrs),
                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))


def _sass(kernel, tmp: Path) -> str:
    cubin = tmp / "k.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    return subprocess.run([str(BIN / "nvdisasm"), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("dense,heads_in_rows,d,valid", [(False, False, 128, 0), (False, True, 128, 0),
                                                         (True, False, 128, 0), (True, True, 128, 0),
                                                         (True, False, 256, 0), (True, True, 128, 80),
                                                         (False, True, 128, 96)],
                         ids=["packed-rows", "packed-heads", "dense-rows", "dense-heads", "dense-rows-d256",
                              "dense-heads-d80", "packed-heads-d96"])
def test_varlen_gluon_program_keeps_the_schedule(tmp_path, dense, heads_in_rows, d, valid):
    """The packed program and its dense form (`flash_attn_func` with ragged lengths), each in both TMA layouts."""
    pytest.importorskip("triton.experimental.gluon")
    kernel = compile_gluon_varlen(dense, heads_in_rows, d, valid)
    sass = _sass(kernel, tmp_path)
    regs, local = _usage(kernel, tmp_path)
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass and "USETMAXREG" in sass
    assert local == 0 and kernel.metadata.shared <= SMEM_PER_SM and _loop_spills(sass) == 0
    assert "MUFU.TANH" not in sass  # the plain program has no soft-capping


def test_three_consumer_warpgroups_at_head_dim_64_keep_the_schedule(tmp_path):
    """The varlen program with 192-row tiles (FlashAttention-3/4's head-dim-64 tile): three consumer warpgroups and
    the producer warp, each consumer keeping the in-warpgroup overlap, registers handed over by setmaxnreg."""
    pytest.importorskip("triton.experimental.gluon")
    kernel = compile_gluon_varlen(True, True, 64, 0, block_m=192, stages=3, lpt=True)
    sass = _sass(kernel, tmp_path)
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") >= 3 and "USETMAXREG" in sass  # one overlap per consumer
    assert kernel.metadata.shared <= SMEM_PER_SM


@pytest.mark.parametrize("dense,heads_in_rows,d", [(True, True, 128), (False, False, 128), (True, False, 256),
                                                   (True, True, 64)],
                         ids=["dense-heads", "packed-rows", "dense-rows-d256", "dense-heads-d64"])
def test_varlen_gluon_program_with_model_features_keeps_the_schedule(tmp_path, dense, heads_in_rows, d):
    """Softcap, sliding window and sinks on the varlen Gluon program (Gemma 2's head dim 256, gpt-oss's 64): the
    softmax still runs under the second matmul, no spills, tanh on the special-function unit."""
    pytest.importorskip("triton.experimental.gluon")
    kernel = compile_gluon_varlen(dense, heads_in_rows, d, 0, features=True)
    sass = _sass(kernel, tmp_path)
    regs, local = _usage(kernel, tmp_path)
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass and "USETMAXREG" in sass
    assert local == 0, f"register spills ({regs} registers, {local} bytes of local memory)"
    assert kernel.metadata.shared <= SMEM_PER_SM
    assert "MUFU.TANH" in sass
    assert _loop_spills(sass) == 0, "register spills in the key loop"



@pytest.mark.parametrize("d", [128, 256])
def test_softcap_without_a_running_max_drops_the_row_max(tmp_path, d):
    """`CAP_BOUND` (softcap up to `_features.CAP_BOUND_MAX`): exp2 against a fixed reference, so the consumer has no
    per-score float max and no accumulator rescale; the schedule, tanh on the special-function unit and no spills
    stay. The online form keeps its row max (FMNMX per score)."""
    pytest.importorskip("triton.experimental.gluon")
    online = _sass(compile_gluon_varlen(True, True, d, 0, features=True), tmp_path)
    kernel = compile_gluon_varlen(True, True, d, 0, features=True, cap_bound=True)
    bound = _sass(kernel, tmp_path)
    regs, local = _usage(kernel, tmp_path)
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in bound and "USETMAXREG" in bound and "MUFU.TANH" in bound
    assert local == 0, f"register spills ({regs} registers, {local} bytes of local memory)"
    assert _loop_spills(bound) == 0 and _loop_spills(online) == 0, "register spills in the key loop"
    fmax = [sass.count("FMNMX") for sass in (online, bound)]
    assert fmax[0] >= 64 and fmax[1] * 4 <= fmax[0], f"float max instructions, online vs bound: {fmax}"


@pytest.mark.parametrize("softcap", [False, True], ids=["plain", "softcap-bound"])
def test_p_packed_on_the_integer_pipe_leaves_no_conversion_in_the_key_loop(tmp_path, softcap):
    """`P_PACK_ALU` (`Config.p_pack_alu`, TUNING.md step 21): the key loop rounds P to bf16 with integer adds and one
    PRMT per pair instead of F2FP (32 per iteration at head dim 128: a 64x128 score tile over 128 threads, two
    scores per pack), and keeps the schedule, its special-function work and no spills in the loop."""
    pytest.importorskip("triton.experimental.gluon")
    kw = dict(softcap_only=softcap, cap_bound=softcap)
    f2fp = _key_loop(_sass(compile_gluon_varlen(True, True, 128, 0, **kw), tmp_path))
    kernel = compile_gluon_varlen(True, True, 128, 0, p_pack_alu=True, **kw)
    sass = _sass(kernel, tmp_path)
    loop = _key_loop(sass)
    count = lambda lines, op: sum(f" {op}" in x for x in lines)  # noqa: E731
    assert count(f2fp, "F2FP.BF16") >= 32 and count(loop, "F2FP") == 0, (count(f2fp, "F2FP.BF16"), count(loop, "F2FP"))
    assert count(loop, "PRMT") >= 32
    assert count(loop, "MUFU.EX2") == count(f2fp, "MUFU.EX2") and count(loop, "MUFU.TANH") == count(f2fp, "MUFU.TANH")
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass and "USETMAXREG" in sass and _loop_spills(sass) == 0


def test_softcap_polynomial_exponentials_leave_the_special_function_unit_with_or_without_the_alu_pack(tmp_path):
    """`CAP_POLY` = 4 (`Config.cap_poly`, TUNING.md step 20): one exp2 in 4 of the bounded softcap's key loop leaves
    MUFU.EX2 for a polynomial on the FMA pipes (Gemma 2's head dim 128, where tanh and exp2 queue on the
    special-function unit beside the matmuls: 64 of each per iteration, 48 exp2 left), with no conversion-unit
    instruction (F2I, FRND); with `P_PACK_ALU` too, the loop also has no F2FP. Schedule and no spills kept. One
    compile per configuration (the default's is the P_PACK_ALU test's, from Triton's cache)."""
    pytest.importorskip("triton.experimental.gluon")
    kw = dict(softcap_only=True, cap_bound=True)
    count = lambda lines, op: sum(f" {op}" in x for x in lines)  # noqa: E731
    bound = _key_loop(_sass(compile_gluon_varlen(True, True, 128, 0, **kw), tmp_path))
    ex2, tanh = count(bound, "MUFU.EX2"), count(bound, "MUFU.TANH")
    assert ex2 >= 64 and tanh >= 64 and count(bound, "F2FP.BF16") >= 32, (ex2, tanh, count(bound, "F2FP.BF16"))
    for pack in (False, True):
        sass = _sass(compile_gluon_varlen(True, True, 128, 0, cap_poly=4, p_pack_alu=pack, **kw), tmp_path)
        loop = _key_loop(sass)
        got = {op: count(loop, op) for op in ("MUFU.EX2", "MUFU.TANH", "F2FP", "FFMA", "F2I", "FRND")}
        assert got["MUFU.EX2"] == ex2 * 3 // 4 and got["MUFU.TANH"] == tanh, (pack, ex2, tanh, got)
        assert got["FFMA"] >= count(bound, "FFMA") + 3 * ex2 // 4, (pack, count(bound, "FFMA"), got)  # 3 per poly
        assert (got["F2I"], got["FRND"]) == (count(bound, "F2I"), count(bound, "FRND")), (pack, got)
        assert (got["F2FP"] == 0) if pack else (got["F2FP"] == count(bound, "F2FP")), (pack, got)
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass and "USETMAXREG" in sass and _loop_spills(sass) == 0
