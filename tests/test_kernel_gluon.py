"""flash-triton's Gluon program (`_gluon.py`, sm_90 only) checked without a GPU: Triton compiles it ahead of time for
sm_90 here, and the machine code must keep the schedule the program exists for. Its numerics run on the GPU
(`tests/test_kernel_cuda.py`, paths `gluon*`); Gluon has no interpreter.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import torch

gluon = pytest.importorskip("triton.experimental.gluon")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402

SOURCE = Path(__file__).resolve().parents[1] / "kernels" / "flash-triton" / "torch-ext" / "flash_triton" / "_gluon.py"
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
SMEM_PER_SM = 232448  # H100/H200: the most shared memory one CTA may allocate (227 KiB)


def _module():
    spec = importlib.util.spec_from_file_location("flash_triton_gluon", SOURCE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _source(fn, sig, const):
    try:
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    except ImportError:  # pragma: no cover - older layouts of the package
        from triton.compiler import ASTSource as Source
    names = fn.arg_names
    return Source(fn, sig, {(names.index(k),): v for k, v in const.items()})


_COMPILED: dict = {}  # the arguments of a compile -> (kernel, SASS, resource usage): several tests compare against
# the same plain program, compiled once per session


def compile_sm90(block_m: int, block_n: int, head_dim: int, warps: int, stages: int, causal: bool, tmp: Path,
                 **options):
    key = (block_m, block_n, head_dim, warps, stages, causal, tuple(sorted(options.items())))
    if key not in _COMPILED:
        _COMPILED[key] = _compile_sm90(block_m, block_n, head_dim, warps, stages, causal, tmp, **options)
    return _COMPILED[key]


def _compile_sm90(block_m: int, block_n: int, head_dim: int, warps: int, stages: int, causal: bool, tmp: Path,
                  ws: bool = False, persistent: bool = False, heads_in_rows: bool = False, joint: bool = False,
                  sinks: bool = False, window: bool = False, lpt: bool = False, exp_poly: int = 0,
                  timeline: bool = False, split_mask: bool = False, pingpong: bool = False, v_wait_early: bool = False):
    mod = _module()
    fn = mod.attention_fwd_sm90_wsp if persistent else mod.attention_fwd_sm90_ws if ws else mod.attention_fwd_sm90
    q_rows = block_m // 2 if ws else block_m  # the warp-specialized form loads Q and stores O per 64-row half

    def desc(rows: int) -> str:
        layout = gl.NVMMASharedLayout.get_default_for([rows, head_dim], gl.bfloat16)
        return f"tensordesc<bf16[{rows}, {head_dim}],{layout!r}>"

    sig = {n: "i32" for n in fn.arg_names}
    args = dict(desc_q=desc(q_rows), desc_o=desc(q_rows), desc_k=desc(block_n), desc_v=desc(block_n),
                qk_scale="fp32", O="*bf16", Plan="*i32")
    sig.update({k: v for k, v in args.items() if k in sig})  # the persistent form: O through a pointer, its tile plan
    const = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal,
                 num_warps=warps)
    # the programs' defaulted constexprs, as the launcher passes them (HEADS_IN_ROWS: [B, S, H, D] views of
    # [B, H, S, D] tensors, descriptors over [B*H*S, D]; JOINT_RELEASE: the K/V release of TUNING.md step 12)
    const.update({k: v for k, v in (("HEADS_IN_ROWS", heads_in_rows), ("JOINT_RELEASE", joint), ("WINDOW", window),
                                    ("LPT", lpt), ("EXP_POLY", exp_poly), ("SPLIT_MASK", split_mask),
                                    ("PINGPONG", pingpong), ("V_WAIT_EARLY", v_wait_early))
                  if k in fn.arg_names})
    if "Timeline" in fn.arg_names:  # the schedule's diagnostic buffer: None when off, as launched
        const["TIMELINE"] = timeline
        if timeline:
            sig["Timeline"] = "*i64"
        else:
            const["Timeline"] = None
    if persistent and not window:  # the persistent program's window sides: None when off, as launched
        const.update(win_left=None, win_right=None)
    if "Sinks" in fn.arg_names:  # the dense warp-specialized program's one model feature: None when off, as launched
        const["SINKS"] = sinks
        if sinks:
            sig["Sinks"] = "*fp32"
        else:
            const["Sinks"] = None
    sig.update({k: "constexpr" for k in const})
    kernel = triton.compile(_source(fn, sig, const), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=warps))
    cubin = tmp / "k.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    sass = subprocess.run([str(BIN / "nvdisasm"), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    usage = subprocess.run([str(BIN / "cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True,
                           text=True, check=True).stdout
    return kernel, sass, usage


@pytest.mark.parametrize("shape", [(64, 64, 128, 4, 3, True), (128, 128, 128, 8, 2, True), (64, 128, 64, 4, 2, False)],
                         ids=lambda s: f"{s[0]}x{s[1]}-d{s[2]}-w{s[3]}-s{s[4]}-{'causal' if s[5] else 'full'}")
def test_compiles_for_sm90_with_the_softmax_under_the_second_matmul(shape, tmp_path):
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    kernel, sass, usage = compile_sm90(*shape, tmp_path)
    # The point of the program: S_j is waited for while P_{j-1} V_{j-1} is still in flight (one group
    # outstanding), so the softmax of block j runs under that matmul. Triton's own kernel only ever waits for 0.
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass
    assert sass.count("HGMMA") >= 3  # QKᵀ of block 0, QKᵀ and PV in the loop, PV of the last block
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    local = int(re.search(r"LOCAL:(\d+)", usage).group(1))
    assert local == 0, f"register spills ({regs} registers, {local} bytes of local memory)"
    assert kernel.metadata.shared <= SMEM_PER_SM


@pytest.mark.parametrize("shape", [(128, 64, 128, 4, 3, True), (128, 128, 128, 4, 2, True), (128, 128, 64, 4, 2, False),
                                   (128, 64, 256, 4, 2, True)],
                         ids=lambda s: f"{s[0]}x{s[1]}-d{s[2]}-s{s[4]}-{'causal' if s[5] else 'full'}")
@pytest.mark.parametrize("persistent", [False, True], ids=["per-tile", "persistent"])
def test_warp_specialized_form_compiles_with_register_handoff_and_no_spills(shape, persistent, tmp_path):
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    if persistent and shape[2] == 256:
        pytest.skip("head dim 256 is refused on the persistent form (gluon_shape_problem)")
    kernel, sass, usage = compile_sm90(*shape, tmp_path, ws=True, persistent=persistent)
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass  # each consumer keeps the in-warpgroup overlap
    assert "USETMAXREG" in sass  # the producer warp gives its registers to the consumers (setmaxnreg)
    # the consumers' loop synchronizes per warpgroup (named barrier of 128 threads), never the whole CTA
    assert re.search(r"BAR\.SYNC\.DEFER_BLOCKING 0x[1-9a-f], 0x80", sass)
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    local = int(re.search(r"LOCAL:(\d+)", usage).group(1))
    assert stack == 0 and local == 0, f"register spills: {usage.strip()}"
    assert kernel.metadata.shared <= SMEM_PER_SM


@pytest.mark.parametrize("shape", [(128, 128, 128, 4, 3, True), (128, 64, 256, 4, 2, True)],
                         ids=["d128", "d256"])
def test_sinks_on_the_warp_specialized_form_keep_its_schedule(shape, tmp_path):
    """Sinks (gpt-oss) join the denominator after the last block: the loop, the register handoff and the
    no-spill budget of the plain program stay."""
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    kernel, sass, usage = compile_sm90(*shape, tmp_path, ws=True, sinks=True)
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass and "USETMAXREG" in sass
    assert int(re.search(r"LOCAL:(\d+)", usage).group(1)) == 0, usage
    plain = compile_sm90(*shape, tmp_path, ws=True)[1]
    assert sass.count("MUFU.EX2") > plain.count("MUFU.EX2")  # the sink's exp2 and the rescale's: it is computed


@pytest.mark.parametrize("shape", [(64, 64, 64, 4, 3, True), (64, 128, 64, 4, 2, True), (64, 64, 128, 4, 3, True)],
                         ids=lambda s: f"{s[0]}x{s[1]}-d{s[2]}-s{s[4]}")
def test_one_warpgroup_program_takes_a_window_and_sinks_in_lpt_order_with_its_schedule(shape, tmp_path):
    """A sliding window and sinks on the one-warpgroup program (small windows: several 64-row CTAs per SM) and the
    LPT tile order change the loop's bounds, masks and tile coordinates only: the in-warpgroup overlap stays, nothing
    spills, and the window's mask and the sink's exponentials are in the code."""
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    kernel, sass, usage = compile_sm90(*shape, tmp_path, sinks=True, window=True, lpt=True, heads_in_rows=True)
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass
    assert int(re.search(r"LOCAL:(\d+)", usage).group(1)) == 0, usage
    assert kernel.metadata.shared <= SMEM_PER_SM
    plain = compile_sm90(*shape, tmp_path)[1]
    assert sass.count("MUFU.EX2") > plain.count("MUFU.EX2")  # the sink's exp2 and its rescale
    assert sass.count("ISETP") > plain.count("ISETP")  # the window's edges are compared


@pytest.mark.parametrize("shape,ws", [((128, 128, 64, 4, 3, True), True), ((64, 128, 64, 4, 2, True), False)],
                         ids=["ws-d64-causal", "one-wg-d64-causal"])
def test_exp_poly_moves_a_quarter_of_the_exponentials_to_the_fma_pipes_keeping_the_schedule(shape, ws, tmp_path):
    """`Config.exp_poly=4` on the dense programs (the head-dim-64 defaults: one-warpgroup 64x128 below 8k keys, the
    warp-specialized one from 8k): one score exponential in four leaves the special-function unit (MUFU.EX2 down by
    about a quarter), the in-warpgroup overlap and the register handoff stay, nothing spills."""
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    kernel, sass, usage = compile_sm90(*shape, tmp_path, ws=ws, exp_poly=4)
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass and ("USETMAXREG" in sass) == ws
    assert int(re.search(r"LOCAL:(\d+)", usage).group(1)) == 0, usage
    plain = compile_sm90(*shape, tmp_path, ws=ws)[1]
    ex2, ex2_plain = sass.count("MUFU.EX2"), plain.count("MUFU.EX2")
    assert 0.6 * ex2_plain < ex2 < 0.85 * ex2_plain, (ex2, ex2_plain)
    assert sass.count("FFMA") > plain.count("FFMA")  # the polynomial's three FMAs per moved exponential


def test_split_mask_walks_the_unmasked_blocks_without_the_mask_test(tmp_path):
    """`Config.split_mask` (causal): the key loop in two, the blocks every row sees whole with no mask test, then the
    diagonal ones; each loop keeps the in-warpgroup overlap and the consumers spill nothing (the loop body twice)."""
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    kernel, sass, usage = compile_sm90(128, 128, 128, 4, 3, True, tmp_path, ws=True, split_mask=True)
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") >= 2 * compile_sm90(
        128, 128, 128, 4, 3, True, tmp_path, ws=True)[1].count("WARPGROUP.DEPBAR.LE gsb0, 0x1")
    assert "USETMAXREG" in sass and int(re.search(r"LOCAL:(\d+)", usage).group(1)) == 0, usage


def key_loops(sass: str) -> list[list[str]]:
    """The innermost loops of a SASS listing (a label to a backward branch to it, nothing nested) that hold a
    `WARPGROUP.DEPBAR.LE gsb0, 0x1`: the consumers' key loops, each as its instructions."""
    items, label_at, loops = [], {}, []
    for line in sass.splitlines():
        if m := re.match(r"\s*(\.L_x_\d+):", line):
            label_at[m.group(1)] = len(items)
        elif re.match(r"\s*/\*[0-9a-f]{4}\*/", line):
            ins = line.split("*/")[1].strip().rstrip(" ;")
            if (m := re.search(r"BRA `\((\.L_x_\d+)\)", ins)) and label_at.get(m.group(1), len(items)) < len(items):
                loops.append(items[label_at[m.group(1)]:] + [ins])
            items.append(ins)
    loops = [body for body in loops if any("DEPBAR.LE gsb0, 0x1" in x for x in body)]
    return [body for body in loops if not any(len(o) < len(body) and o[-1] in body for o in loops)]


def _sass_loops():
    """`kernels/flash-triton/sass_loops.py`, the key-loop counts the SASS tests and TUNING.md read."""
    spec = importlib.util.spec_from_file_location("sass_loops", SOURCE.parents[2] / "sass_loops.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SASS_LOOPS = _sass_loops()


def exps_under_the_product(body: list[str]) -> tuple[int, int]:
    """(exponentials, those issued before the wait for P_{j-1}·V_{j-1}) in a key loop's instructions (`key_loops`):
    the wait is the loop's `WARPGROUP.DEPBAR.LE gsb0, 0x0`, the exponentials its `MUFU.EX2` (`sass_loops.loop_stats`)."""
    stats = SASS_LOOPS.loop_stats(body)
    return stats["exps"], stats["exps_under_pv"]


@pytest.mark.parametrize("program", ["ws-d128-causal", "ws-d64-full", "one-wg-window-sinks", "varlen-d128",
                                     "persistent-d64-window-sinks"])
def test_the_values_waited_for_early_keep_the_exponentials_under_the_product(program, tmp_path):
    """`Config.v_wait_early` (TUNING.md step 31): ptxas hoists the wait for P_{j-1}·V_{j-1} to the top of its basic
    block, above most of S_j's exponentials, so the softmax runs after that product instead of under it; the values'
    mbarrier wait at the end of the softmax ends the block, and every exponential of the key loop is issued before
    the product is waited for. The same products and exponentials, no more spilled."""
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    if program.startswith("varlen"):
        from test_kernel_serving_sm90 import compile_gluon_varlen

        def sass_of(early: bool) -> tuple[str, str]:
            kernel = compile_gluon_varlen(True, False, 128, 128, v_wait_early=early)
            cubin = tmp_path / "v.cubin"
            cubin.write_bytes(kernel.asm["cubin"])
            return tuple(subprocess.run([str(BIN / tool), *flags, str(cubin)], capture_output=True, text=True,
                                        check=True).stdout
                         for tool, flags in (("nvdisasm", ["-c"]), ("cuobjdump", ["--dump-resource-usage"])))
    else:
        shape, options = {"ws-d128-causal": ((128, 128, 128, 4, 3, True), dict(ws=True)),
                          "ws-d64-full": ((128, 128, 64, 4, 3, False), dict(ws=True)),
                          "one-wg-window-sinks": ((64, 64, 64, 4, 2, True), dict(window=True, sinks=True)),
                          "persistent-d64-window-sinks": ((128, 128, 64, 4, 3, True),
                                                          dict(ws=True, persistent=True, window=True, sinks=True)),
                          }[program]

        def sass_of(early: bool) -> tuple[str, str]:
            return compile_sm90(*shape, tmp_path, **options, v_wait_early=early)[1:]

    (sass, usage), (plain, plain_usage) = sass_of(True), sass_of(False)
    loops, plain_loops = key_loops(sass), key_loops(plain)
    assert loops and len(loops) == len(plain_loops)
    for body, plain_body in zip(loops, plain_loops):
        exps, under = exps_under_the_product(body)
        plain_exps, plain_under = exps_under_the_product(plain_body)
        assert exps == plain_exps and under == exps, (exps, under)
        assert plain_under < plain_exps, "without the option the wait no longer rises: is it still needed?"
    assert sass.count("GMMA") == plain.count("GMMA") and sass.count("MUFU.EX2") == plain.count("MUFU.EX2")
    spills = [int(re.search(rf"{kind}:(\d+)", u).group(1)) for u in (usage, plain_usage) for kind in ("STACK", "LOCAL")]
    assert spills[0] <= spills[2] and spills[1] <= spills[3], (usage, plain_usage)


def test_the_one_warpgroup_refill_sets_both_expects_before_both_loads(tmp_path):
    """The one-warpgroup program refills a K/V stage from its own key loop (`_load_kv`): both mbarriers' expected
    bytes, then both TMA loads. Triton puts a warpgroup barrier between any two of these single-thread operations, so
    this order pays one fewer barrier a key block than expect, load, expect, load."""
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    for shape, options in (((64, 64, 64, 4, 2, True), dict(window=True, sinks=True)), ((64, 64, 128, 4, 3, True), {})):
        (body,) = key_loops(compile_sm90(*shape, tmp_path, **options)[1])
        refill = [("expect" if "SYNCS.ARRIVE.TRANS64" in x else "load") for x in body
                  if "SYNCS.ARRIVE.TRANS64" in x and "A1T0" not in x or "UTMALDG" in x]
        assert refill == ["expect", "expect", "load", "load"], (shape, refill)


def test_the_persistent_key_loop_pays_no_more_barriers_per_block_than_the_dense_one(tmp_path):
    """Gluon puts a warpgroup barrier (`BAR.SYNC`) before each mbarrier arrive of a 4-warp partition: the persistent
    program releases Q in its peeled last block, not in every block under a predicate, so its key loop carries the
    dense loop's barriers (two with Triton 3.9: K and V released; Triton 3.6 adds one before the keys' wait), no
    more."""
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    counts = {}
    for options in (dict(ws=True), dict(ws=True, persistent=True)):
        loops = key_loops(compile_sm90(128, 128, 128, 4, 3, True, tmp_path, **options)[1])
        assert loops, options
        counts[bool(options.get("persistent"))] = {sum("BAR.SYNC" in x for x in body) for body in loops}
    assert len(counts[False]) == 1 and counts[True] == counts[False], counts


@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_persistent_program_takes_a_window_and_sinks_keeping_its_schedule(head_dim, tmp_path):
    """`WINDOW` and `SINKS` on the persistent program (each tile's key blocks from its rows' window start, the
    window's edges masked, the sink after the last block): the in-warpgroup overlap in both consumers, the register
    handoff, no local memory; the plain program's SASS does not change (the window sides are None there)."""
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    kernel, sass, usage = compile_sm90(128, 128, head_dim, 4, 3, True, tmp_path, ws=True, persistent=True,
                                       window=True, sinks=True)
    plain = compile_sm90(128, 128, head_dim, 4, 3, True, tmp_path, ws=True, persistent=True)[1]
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") >= 2 and "USETMAXREG" in sass
    assert int(re.search(r"LOCAL:(\d+)", usage).group(1)) == 0, usage
    assert sass.count("HGMMA") == plain.count("HGMMA") and sass.count("MUFU.EX2") > plain.count("MUFU.EX2")


@pytest.mark.parametrize("persistent", [False, True], ids=["dense", "persistent"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_pingpong_issues_each_consumers_matmuls_in_its_turn(head_dim, persistent, tmp_path):
    """`Config.pingpong`: in the key loop a consumer waits for its turn after its keys arrived, issues QKᵀ and the
    last block's P·V, hands the turn on and only then waits for S (the in-warpgroup overlap kept); the turn's two
    barriers are the only shared memory it adds and the consumers spill nothing."""
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    kernel, sass, usage = compile_sm90(128, 128, head_dim, 4, 3, True, tmp_path, ws=True, persistent=persistent,
                                       pingpong=True)
    plain_kernel, plain, _ = compile_sm90(128, 128, head_dim, 4, 3, True, tmp_path, ws=True, persistent=persistent)
    assert kernel.metadata.shared == plain_kernel.metadata.shared + 32  # two 8-byte barriers, 16-byte aligned
    assert int(re.search(r"LOCAL:(\d+)", usage).group(1)) == 0 and "USETMAXREG" in sass, usage
    # in issue order: ... HGMMA (P·V, the last of its group) -> an arrive (the turn handed on) -> wait for S
    ops = [line.split(";")[0].split("*/")[-1].strip() for line in sass.splitlines()
           if "HGMMA" in line or "SYNCS.ARRIVE" in line or "DEPBAR.LE gsb0" in line]
    handoffs = [i for i, op in enumerate(ops[:-2]) if op.startswith("HGMMA") and "tnspB" in op and "gsb0" in op
                and "SYNCS.ARRIVE" in ops[i + 1] and ops[i + 2].endswith("gsb0, 0x1")]
    assert len(handoffs) >= 2, ops  # each consumer's loop
    # the first turn given, a handoff in each consumer's loop (the persistent one peels its last block: two)
    assert sass.count("SYNCS.ARRIVE") == plain.count("SYNCS.ARRIVE") + (5 if persistent else 3)
    assert sass.count("HGMMA") == plain.count("HGMMA") and sass.count("MUFU.EX2") == plain.count("MUFU.EX2")


def test_the_timeline_stamps_each_tile_and_leaves_the_schedule_alone(tmp_path):
    """`TIMELINE` (`attention(..., timeline=)`): the global timer read at the program's start and after its partitions
    joined, the SM id, four 64-bit stores by one thread; the consumers' loop compiles as without it."""
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    kernel, sass, usage = compile_sm90(128, 128, 128, 4, 3, True, tmp_path, ws=True, timeline=True)
    ptx = kernel.asm["ptx"]
    assert ptx.count("%globaltimer") == 2 and ptx.count("%smid") == 1, ptx.count("%globaltimer")
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass and "USETMAXREG" in sass
    assert int(re.search(r"LOCAL:(\d+)", usage).group(1)) == 0, usage
    plain_kernel, plain, _ = compile_sm90(128, 128, 128, 4, 3, True, tmp_path, ws=True)
    assert "%globaltimer" not in plain_kernel.asm["ptx"]
    assert sass.count("HGMMA") == plain.count("HGMMA") and sass.count("MUFU.EX2") == plain.count("MUFU.EX2")


def test_the_persistent_programs_timeline_stamps_each_tile_and_leaves_the_schedule_alone(tmp_path):
    """The persistent form's `TIMELINE`: the timer read before each tile's Q is waited for and after its O is stored,
    the SM id (written by consumer 0); the schedule, the register handoff and the matmul and exponential counts as
    without it. In the head-major layout (`HEADS_IN_ROWS`: `[B, S, H, D]` views of `[B, H, S, D]` tensors, what the
    `kernel` variant hands over), which the persistent form reads too."""
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    kernel, sass, usage = compile_sm90(128, 128, 128, 4, 3, True, tmp_path, ws=True, persistent=True, timeline=True,
                                       heads_in_rows=True)
    ptx = kernel.asm["ptx"]
    assert ptx.count("%globaltimer") >= 2 and ptx.count("%smid") == 1, ptx.count("%globaltimer")
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass and "USETMAXREG" in sass
    assert int(re.search(r"LOCAL:(\d+)", usage).group(1)) == 0, usage
    plain_kernel, plain, _ = compile_sm90(128, 128, 128, 4, 3, True, tmp_path, ws=True, persistent=True,
                                          heads_in_rows=True)
    assert "%globaltimer" not in plain_kernel.asm["ptx"]
    assert sass.count("HGMMA") == plain.count("HGMMA") and sass.count("MUFU.EX2") == plain.count("MUFU.EX2")


def test_lpt_order_keeps_the_warp_specialized_schedule(tmp_path):
    """`Config.lpt` reorders the tiles on a one-dimensional grid; the consumers' schedule and register budget stay."""
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    kernel, sass, usage = compile_sm90(128, 128, 128, 4, 3, True, tmp_path, ws=True, lpt=True)
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass and "USETMAXREG" in sass
    assert int(re.search(r"LOCAL:(\d+)", usage).group(1)) == 0, usage


def test_lpt_tile_order_visits_every_tile_once_heaviest_first():
    """`tile_order`'s LPT mapping, run as plain Python (the same integer arithmetic): a permutation of the
    (query block, head) grid, each section of `l2_heads` heads taking every head's heaviest block before any lighter
    one, the partial last section included."""
    for n_m, n_bh, l2 in ((16, 128, 32), (5, 7, 4), (3, 6, 8), (4, 4, 1)):
        l2 = min(l2, n_bh)
        order = [_lpt_python(t, n_m, n_bh, l2) for t in range(n_m * n_bh)]
        assert sorted(order) == [(m, bh) for m in range(n_m) for bh in range(n_bh)]
        sections = {}
        for m, bh in order:
            sections.setdefault(bh // l2, []).append(m)
        for ms in sections.values():
            assert ms == sorted(ms, reverse=True)  # heaviest (last query block, causal) first within a section


def _lpt_python(tile: int, n_m: int, n_bh: int, l2: int) -> tuple[int, int]:
    """`_gluon.tile_order(LPT=True, CAUSAL=True)` in Python (kept in step with it by the GPU tests' oracle checks)."""
    span = l2 * n_m
    section, within = divmod(tile, span)
    width = l2 if section < n_bh // l2 else n_bh % l2
    block, residual = divmod(within, width)
    return n_m - 1 - block, section * l2 + residual


def test_consumers_release_keys_after_qk_and_values_after_pv(tmp_path):
    """TUNING.md step 13: each consumer warpgroup arrives on a stage's `k_empty` once its QKᵀ is done and on its
    `v_empty` after P·V, so the producer refills K a whole P·V earlier; the 2-stage head-dim-256 tiles had the TMA
    latency of every refill in the loop. `JOINT_RELEASE` keeps the schedule before (one arrival, after P·V)."""
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    arrivals = {}
    for joint in (False, True):
        _, sass, _ = compile_sm90(128, 64, 256, 4, 2, True, tmp_path, ws=True, joint=joint)
        arrivals[joint] = sass.count("SYNCS.ARRIVE.TRANS64.A1T0")  # mbarrier.arrive(count=1)
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass
    # per consumer: block 0's keys, then block j's keys and block j-1's values in the loop; joint: one per loop trip
    assert arrivals == {False: 6, True: 2}


@pytest.mark.parametrize("ws", [False, True], ids=["one-warpgroup", "warp-specialized"])
def test_heads_major_views_compile_with_the_same_schedule(ws, tmp_path):
    """The `HEADS_IN_ROWS` form (views of PyTorch's [B, H, S, D] layout) changes only the tile coordinates."""
    if not (BIN / "nvdisasm").exists():
        pytest.skip("this Triton wheel ships no nvdisasm")
    shape = (128, 128, 128, 4, 2, True) if ws else (64, 64, 128, 4, 3, True)  # block_m = 16 x warps without ws
    kernel, sass, usage = compile_sm90(*shape, tmp_path, ws=ws, heads_in_rows=True)
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass
    assert int(re.search(r"LOCAL:(\d+)", usage).group(1)) == 0
    assert kernel.metadata.shared <= SMEM_PER_SM


def test_padded_head_dims_read_past_the_row_only_in_the_heads_view():
    """Head dims 80 and 96 on the Gluon programs: tiles 128 wide over the [B*H*S, D] view, whose columns past D lie
    outside the tensor (TMA reads zeros there, a TMA store drops them); over [B*S, H*D] they would be the next
    head's columns, so that view is refused."""
    mod = _module()
    t = torch.empty(2, 4, 8, 80, dtype=torch.bfloat16).transpose(1, 2)  # [B, S, H, D] view of [B, H, S, D]
    desc = mod.tma_desc(t, 64, True)
    assert list(desc.shape) == [2 * 4 * 8, 80] and list(desc.block_shape) == [64, 128]
    assert list(mod.tma_desc(torch.empty(2, 8, 4, 128, dtype=torch.bfloat16), 64, False).block_shape) == [64, 128]
    with pytest.raises(ValueError, match="next head"):
        mod.tma_desc(t.contiguous(), 64, False)


def test_sass_loops_counts_what_issues_before_and_after_the_products_wait():
    """`kernels/flash-triton/sass_loops.py`'s per-loop counts on a hand-written key loop: two exponentials under the
    product, one after its wait; after the wait: the wait itself to the loop's end plus the loop's start up to its
    first product."""
    body = ["SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4], R1", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, gsb0",
            "WARPGROUP.DEPBAR.LE gsb0, 0x1", "BAR.SYNC.DEFER_BLOCKING 0x0, 0x80", "MUFU.EX2 R1, R1", "MUFU.EX2 R2, R2",
            "WARPGROUP.DEPBAR.LE gsb0, 0x0", "MUFU.EX2 R3, R3", "BRA `(.L_x_1)"]
    assert SASS_LOOPS.loop_stats(body) == dict(instructions=9, barriers=1, exps=3, exps_under_pv=2, after_wait=4)
