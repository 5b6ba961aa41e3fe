"""flash-triton's FP8 Gluon program (`_gluon_fp8.py`, sm_90 only) checked without a GPU: compiled ahead of time for
sm_90, its machine code must keep what it exists for: both products on the FP8 tensor cores (QGMMA ... E4M3), the
softmax of block j under P_{j-1}·V_{j-1} (S_j and P_{j-1}·V_{j-1} issued back to back, then a wait that leaves one
group in flight), P entering the second product from the first one's registers without lane shuffles or byte
repacking, no spills, shared memory within a CTA's 227 KiB. Numerics: tests/test_kernel_fp8_gluon_cuda.py.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton.experimental.gluon")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402

SOURCE = Path(__file__).resolve().parents[1] / "kernels" / "flash-triton" / "torch-ext" / "flash_triton"
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
SMEM_PER_SM = 232448  # H100/H200: the most shared memory one CTA may allocate (227 KiB)
CONFIGS = [(128, True), (128, False), (64, True), (64, False)]  # (head dim, causal)

pytestmark = pytest.mark.skipif(not (BIN / "nvdisasm").exists(), reason="this Triton wheel ships no nvdisasm")


def _module():
    """`_gluon_fp8` from the source tree, as a package module (it imports `._gluon`, `._checks`, `._config`)."""
    pkg = types.ModuleType("flash_triton_src")
    pkg.__path__ = [str(SOURCE)]
    sys.modules.setdefault("flash_triton_src", pkg)
    return importlib.import_module("flash_triton_src._gluon_fp8")


def compile_fp8(head_dim: int, causal: bool, stages: int = 3, heads_in_rows: bool = False, exp_poly: int = 0,
                pingpong: bool = False, v_wait_early: bool = False):
    """`attention_fwd_fp8_sm90_ws` compiled for sm_90 as `gluon_fp8_attention` launches it (bf16 out)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    mod = _module()
    fn = mod.attention_fwd_fp8_sm90_ws

    def desc(rows: int, cols: int, name: str = "fp8e4nv", dtype=gl.float8e4nv) -> str:
        return f"tensordesc<{name}[{rows}, {cols}],{gl.NVMMASharedLayout.get_default_for([rows, cols], dtype)!r}>"

    names = fn.arg_names
    sig = {n: "i32" for n in names}
    sig.update(desc_q=desc(64, head_dim), desc_k=desc(mod.BLOCK_N, head_dim), desc_vt=desc(head_dim, mod.BLOCK_N),
               desc_o=desc(64, head_dim, "bf16", gl.bfloat16), QD="*fp32", KD="*fp32", VD="*fp32", qk_scale="fp32")
    const = dict(HEAD_DIM=head_dim, BLOCK_M=mod.BLOCK_M, BLOCK_N=mod.BLOCK_N, STAGES=stages, CAUSAL=causal,
                 num_warps=4, HEADS_IN_ROWS=heads_in_rows, LPT=False, EXP_POLY=exp_poly,
                 PINGPONG=pingpong, V_WAIT_EARLY=v_wait_early)  # every constexpr passed
    sig.update({k: "constexpr" for k in const})
    return triton.compile(GluonASTSource(fn, sig, {(names.index(k),): v for k, v in const.items()}),
                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))


def _tool(kernel, tmp: Path, *cmd: str) -> str:
    cubin = tmp / "k.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    return subprocess.run([str(BIN / cmd[0]), *cmd[1:], str(cubin)], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Each (head dim, causal) compiled once (~3 s each): kernel, SASS, resource usage."""
    tmp = tmp_path_factory.mktemp("fp8_gluon")
    out = {}
    for d, causal in CONFIGS:
        kernel = compile_fp8(d, causal)
        out[d, causal] = (kernel, _tool(kernel, tmp, "nvdisasm", "-c"),
                          _tool(kernel, tmp, "cuobjdump", "--dump-resource-usage"))
    return out


def _instructions(sass: str) -> list[str]:
    return [re.sub(r"^\s*/\*[0-9a-f]+\*/\s*", "", x).rstrip(" ;") for x in sass.splitlines()
            if re.match(r"\s*/\*[0-9a-f]+\*/", x)]


def overlapped_pairs(sass: str) -> int:
    """How often an S = Q·Kᵀ wgmma group (A from shared memory: `gdesc` first) and a P·V group (A from registers) are
    both issued and then waited for with one group left in flight (`WARPGROUP.DEPBAR.LE gsb0, 0x1`), no wait between:
    the loop of each consumer warpgroup, in which the softmax of block j runs under P_{j-1}·V_{j-1}."""
    pairs, state = 0, ""
    for ins in _instructions(sass):
        if "DEPBAR" in ins:
            pairs += state == "sp" and ins.endswith("gsb0, 0x1")
            state = ""
        elif ins.startswith("QGMMA") and "gsb0" in ins.split(",")[-1]:  # the last wgmma of a committed group
            register_a = re.match(r"QGMMA\S* R\d+, R\d+, gdesc", ins) is not None
            state = state + "p" if register_a and state == "s" else "s" if not register_a else ""
    return pairs


def _ptxas_release() -> tuple[int, int]:
    out = subprocess.run([str(BIN / "ptxas"), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


# ptxas 12.8 (Triton 3.6's, the GPU image's) joins each two F2FP pairs of P's e4m3 bytes into the A operand's register
# with a PRMT (16 a key block); 12.9 (Triton 3.9's) writes them in place with F2FP itself (TUNING.md step 31)
P_PRMT_PER_LOOP = 16 if _ptxas_release() < (12, 9) else 0


def assert_p_enters_without_shuffles(sass: str) -> None:
    """P reaches the second product's A operand as the accumulator's registers (`p_operand_keys`): no lane exchange
    anywhere (`SHFL.IDX`; 12.8 has one outside the key loops at head dim 128, not P's), and in each key loop no byte
    permute but what this ptxas needs to join P's pairs (`P_PRMT_PER_LOOP`)."""
    from test_kernel_gluon import key_loops

    loops = key_loops(sass)
    assert loops and all(not any("SHFL.IDX" in x for x in body) for body in loops)
    assert sass.count("SHFL.IDX") <= (1 if P_PRMT_PER_LOOP else 0), sass.count("SHFL.IDX")
    assert all(sum("PRMT" in x for x in body) <= P_PRMT_PER_LOOP for body in loops), (
        [sum("PRMT" in x for x in body) for body in loops])
    if not P_PRMT_PER_LOOP:
        assert "PRMT" not in sass


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"d{c[0]}-{'causal' if c[1] else 'full'}")
def test_both_products_are_fp8_wgmma_with_the_softmax_under_pv(compiled, config):
    kernel, sass, usage = compiled[config]
    d = config[0]
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k32)\.f32\.e4m3\.e4m3", kernel.asm["ptx"]))
    assert shapes == {"m64n128k32", f"m64n{d}k32"}, shapes  # S (128 keys) and P·V (D columns), both e4m3
    assert "wgmma.mma_async.sync.aligned.m64n128k16" not in kernel.asm["ptx"]  # no 16-bit wgmma anywhere
    assert re.search(r"QGMMA\.64x128x32\.F32\.E4M3\.E4M3 R\d+, gdesc", sass)  # QKᵀ, Q from shared memory
    assert re.search(rf"QGMMA\.64x{d}x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc", sass)  # P·V, P from registers
    assert overlapped_pairs(sass) == 2, "S_j and P_{j-1}·V_{j-1} not both in flight in each consumer's loop"
    assert "USETMAXREG" in sass  # the producer warp hands its registers to the consumers
    # P reaches the A operand as the accumulator's registers, reordered by `p_operand_keys`: no lane exchange, no
    # byte shuffling; one F2FP packs two probabilities (a key block: 64 x 128 / 128 threads / 2 = 32 per thread)
    assert_p_enters_without_shuffles(sass)
    assert sass.count("F2FP.SATFINITE.E4M3.F32") % 32 == 0 and sass.count("F2FP.SATFINITE.E4M3.F32") >= 4 * 32
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    local = int(re.search(r"LOCAL:(\d+)", usage).group(1))
    assert stack == 0 and local == 0 and not re.search(r"\b(STL|LDL)\b", sass), f"register spills: {usage.strip()}"
    # Q (2 x 64 x D), STAGES x (K 128 x D + Vᵀ D x 128) in e4m3, O staging (2 x 64 x D bf16), barriers
    tiles = 2 * 64 * d + 3 * (128 * d + d * 128) + 2 * 64 * d * 2
    assert tiles <= kernel.metadata.shared <= min(tiles + 1024, SMEM_PER_SM), kernel.metadata.shared


def test_heads_major_views_and_four_stages_keep_the_schedule(tmp_path):
    """[B, H, S, D] views (descriptors over [B*H*S, D]) change only the tile coordinates; 4 stages of head dim 128
    still fit (176 KiB)."""
    kernel = compile_fp8(128, True, stages=4, heads_in_rows=True)
    sass = _tool(kernel, tmp_path, "nvdisasm", "-c")
    assert overlapped_pairs(sass) == 2
    assert_p_enters_without_shuffles(sass)
    assert int(re.search(r"LOCAL:(\d+)", _tool(kernel, tmp_path, "cuobjdump", "--dump-resource-usage")).group(1)) == 0
    assert kernel.metadata.shared <= SMEM_PER_SM


def test_exp_poly_moves_a_quarter_of_the_exponentials_off_the_special_function_unit(compiled, tmp_path):
    """`exp_poly=4` (`gluon_fp8_attention`'s `EXP_POLY`): with FP8 products the exponentials take as long as both
    matmuls; one in four goes to the FMA pipes. The schedule, the shuffle-free P and the register budget stay."""
    kernel = compile_fp8(128, True, exp_poly=4)
    sass = _tool(kernel, tmp_path, "nvdisasm", "-c")
    plain = compiled[128, True][1]
    assert overlapped_pairs(sass) == 2
    assert_p_enters_without_shuffles(sass)
    assert int(re.search(r"LOCAL:(\d+)", _tool(kernel, tmp_path, "cuobjdump", "--dump-resource-usage")).group(1)) == 0
    ex2, ex2_plain = sass.count("MUFU.EX2"), plain.count("MUFU.EX2")
    assert 0.6 * ex2_plain < ex2 < 0.85 * ex2_plain, (ex2, ex2_plain)


def test_pingpong_hands_the_turn_on_between_the_products_and_the_wait(compiled, tmp_path):
    """`pingpong` (`PINGPONG`): each consumer issues S_j and P_{j-1}·V_{j-1} in its turn and hands the turn on before it
    waits for S (the overlap kept); three arrivals more (the first turn given, one handoff per consumer's loop), the
    same products and exponentials, no spills."""
    kernel = compile_fp8(128, True, exp_poly=4, pingpong=True)
    sass = _tool(kernel, tmp_path, "nvdisasm", "-c")
    plain = _tool(compile_fp8(128, True, exp_poly=4), tmp_path, "nvdisasm", "-c")
    assert overlapped_pairs(sass) == 2 and sass.count("SYNCS.ARRIVE") == plain.count("SYNCS.ARRIVE") + 3
    ins = [x for x in _instructions(sass) if "GMMA" in x or "SYNCS.ARRIVE" in x or "DEPBAR.LE gsb0" in x]
    handoffs = [i for i in range(len(ins) - 2) if ins[i].startswith("QGMMA") and ins[i].endswith("gsb0")
                and "SYNCS.ARRIVE" in ins[i + 1] and ins[i + 2].endswith("gsb0, 0x1")]
    assert len(handoffs) == 2, ins
    assert sass.count("QGMMA") == plain.count("QGMMA") and sass.count("MUFU.EX2") == plain.count("MUFU.EX2")
    assert int(re.search(r"LOCAL:(\d+)", _tool(kernel, tmp_path, "cuobjdump", "--dump-resource-usage")).group(1)) == 0


def test_the_values_waited_for_early_keep_the_exponentials_under_the_product(compiled, tmp_path):
    """`v_wait_early` (`V_WAIT_EARLY`, TUNING.md step 31): by default ptxas hoists each consumer's wait for
    P_{j-1}·V_{j-1} above S_j's exponentials; with the values waited for at the end of the softmax every exponential
    of the key loop is issued before that wait. The schedule, the products, the shuffle-free P and the register
    budget stay."""
    from test_kernel_gluon import exps_under_the_product, key_loops

    kernel = compile_fp8(128, True, exp_poly=4, v_wait_early=True)
    sass = _tool(kernel, tmp_path, "nvdisasm", "-c")
    plain = _tool(compile_fp8(128, True, exp_poly=4), tmp_path, "nvdisasm", "-c")
    loops, plain_loops = key_loops(sass), key_loops(plain)
    assert len(loops) == len(plain_loops) == 2  # one per consumer
    for body, plain_body in zip(loops, plain_loops):
        (exps, under), (plain_exps, plain_under) = exps_under_the_product(body), exps_under_the_product(plain_body)
        assert exps == plain_exps and under == exps and plain_under < plain_exps, (under, plain_under, exps)
    assert overlapped_pairs(sass) == 2
    assert_p_enters_without_shuffles(sass)
    assert sass.count("QGMMA") == plain.count("QGMMA") and sass.count("MUFU.EX2") == plain.count("MUFU.EX2")
    assert int(re.search(r"LOCAL:(\d+)", _tool(kernel, tmp_path, "cuobjdump", "--dump-resource-usage")).group(1)) == 0


def test_the_overlap_check_fails_without_the_overlap():
    """`overlapped_pairs` on hand-written sequences: waiting for S before issuing P·V is not an overlap."""
    s = ["QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], R24, gsb0 ;"]
    pv = ["QGMMA.64x128x32.F32.E4M3.E4M3 R88, R152, gdesc[UR8], R88, gsb0 ;"]
    wait1, wait0 = ["WARPGROUP.DEPBAR.LE gsb0, 0x1 ;"], ["WARPGROUP.DEPBAR.LE gsb0, 0x0 ;"]

    def sass(lines):
        return "\n".join(f"        /*{i * 16:04x}*/ {x}" for i, x in enumerate(lines))

    assert overlapped_pairs(sass(s + pv + wait1)) == 1
    assert overlapped_pairs(sass(s + wait0 + pv + wait1)) == 0
    assert overlapped_pairs(sass(s + pv + wait0)) == 0
    assert overlapped_pairs(sass(pv + s + wait1)) == 0


def test_vt_keys_follow_the_p_operand_order():
    """Vᵀ's key order (`permuted_vt_reference`, the oracle of `_transpose_keys_permuted`) is the one
    `p_operand_keys` gives P: position 16h + 4c + 2g + e of each 32 holds key 16h + 8g + 2c + e."""
    mod = _module()
    b, s, h, d = 1, 256, 2, 64
    v = torch.arange(s, dtype=torch.float32)[None, :, None, None].expand(b, s, h, d)  # each entry: its key
    vt = mod.permuted_vt_reference(v)
    assert vt.shape == (b, h, d, s)
    want = torch.tensor([32 * n + 16 * hh + 8 * g + 2 * c + e for n in range(s // 32) for hh in range(2)
                         for c in range(4) for g in range(2) for e in range(2)], dtype=torch.float32)
    assert torch.equal(vt[0, 1, 5], want) and sorted(want.tolist()) == list(range(s))
    assert not torch.equal(want, torch.arange(s, dtype=torch.float32))


@pytest.mark.parametrize("change, words", [
    (dict(d=96), "head dims 64, 128"),
    (dict(sq=200), "multiple of 128"),
    (dict(sk=1000), "multiple of 128"),
    (dict(sq=512, sk=256, causal=True), "Sq <= Sk"),
    (dict(strided=True), "through TMA"),
    (dict(), "CUDA GPU"),  # everything else fits: the CPU is refused last
], ids=["head-dim-96", "sq-ragged", "sk-ragged", "causal-sq-gt-sk", "strided", "cpu"])
def test_gluon_fp8_supported_names_the_reason(change, words):
    mod = _module()
    p = dict(d=128, sq=256, sk=256, causal=False, strided=False)
    p.update(change)
    q = torch.zeros(1, p["sq"], 4, p["d"], dtype=torch.float8_e4m3fn)
    k = torch.zeros(1, p["sk"], 2, p["d"], dtype=torch.float8_e4m3fn)
    if p["strided"]:
        q = torch.zeros(1, p["sq"], 8, p["d"], dtype=torch.float8_e4m3fn)[:, :, ::2]
    assert re.search(words, mod.gluon_fp8_supported(q, k, k, p["causal"]))


def test_fp8_attention_takes_a_program_and_refuses_gluon_with_the_reason():
    """The hook in `_fp8.fp8_attention`: an unknown program is refused; "gluon" where it cannot run raises the
    predicate's reason (here: no CUDA GPU, or the interpreter's CPU); the default, "auto", takes the Triton program
    where the Gluon one cannot run."""
    import inspect

    from kernels import get_local_kernel

    mod = get_local_kernel(SOURCE.parents[1])
    fp8 = importlib.import_module(mod.__name__ + "._fp8")
    assert inspect.signature(fp8.fp8_attention).parameters["program"].default == "auto"
    q = torch.zeros(1, 128, 2, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="program must be"):
        fp8.fp8_attention(q, q, q, program="cutlass")
    if fp8.fp8_problem(q, q, q, None, None, None, torch.bfloat16) is None:  # under the interpreter: CPU tensors run
        with pytest.raises(ValueError, match="CUDA GPU"):
            fp8.fp8_attention(q, q, q, program="gluon")
        assert torch.equal(fp8.fp8_attention(q, q, q), fp8.fp8_attention(q, q, q, program="triton"))
        # exp_poly is the Gluon program's: where that one cannot run it is refused, never dropped
        with pytest.raises(ValueError, match="exp_poly is an option of the Gluon FP8 program.*CUDA GPU"):
            fp8.fp8_attention(q, q, q, exp_poly=4)
        with pytest.raises(ValueError, match="exp_poly is an option of the Gluon FP8 program.*triton"):
            fp8.fp8_attention(q, q, q, exp_poly=2, program="triton")
        with pytest.raises(ValueError, match="pingpong is an option of the Gluon FP8 program.*CUDA GPU"):
            fp8.fp8_attention(q, q, q, pingpong=True)
        with pytest.raises(ValueError, match="v_wait_early is an option of the Gluon FP8 program.*CUDA GPU"):
            fp8.fp8_attention(q, q, q, v_wait_early=True)
        # its default (None: `FP8_EXP_POLY` on the Gluon program) and 0 (off) ask nothing of the Triton program
        assert torch.equal(fp8.fp8_attention(q, q, q, exp_poly=0), fp8.fp8_attention(q, q, q))
    with pytest.raises(ValueError, match="exp_poly is 0, 2 or 4"):
        fp8.fp8_attention(q, q, q, exp_poly=3)
    assert fp8._gluon_problem(q, q, q, False) is not None
