"""Launch configurations of the prefill program (`_kernel.py`) and what this module was built for.

Shared by the dense entry point (`__init__.py`) and the packed one (`_varlen.py`): both launch the same Triton
program, so they share its tuned tile shapes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton

from ._kernel import attention_fwd

SUPPORTED_HEAD_DIMS = (64, 80, 96, 128, 256)
# The hand-scheduled sm_90 programs: their tiles and register budget are sized for these; 80 and 96 run on the
# warp-specialized program's zero-padded 128-wide tiles (read from `[B*H*S, D]` views, where TMA fills the padding),
# 256 on its 128x64 tiles with 2 stages (TUNING.md steps 12 and 13).
GLUON_HEAD_DIMS = (64, 80, 96, 128, 256)
SMEM_PER_CTA = 232448  # H100/H200: the most shared memory one CTA may allocate (227 KiB)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
# Whether this module's kernels were built for Triton's CPU interpreter (fixed when the module was loaded).
INTERPRETED = not isinstance(attention_fwd, triton.runtime.jit.JITFunction)


@dataclass(frozen=True)
class Config:
    """Launch shape of one kernel: tile sizes, warps, software-pipelining depth, TMA loads or pointers."""

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    use_tma: bool = True
    warp_specialize: bool = False  # Triton's automatic producer/consumer warp split of the key loops
    overlap: bool = False  # the unmasked key loop pipelined by hand: next block's QKᵀ issued before this softmax
    poly_exp: bool = False  # half the unmasked exponentials as a polynomial on the FMA pipes (FlashAttention-4)
    lazy_rescale: bool = False  # skip the accumulator rescale until a row max grew by > 8 (FlashAttention-4)
    gluon: bool = False  # the hand-scheduled sm_90 program in `_gluon.py` (block_m = 16 * num_warps, TMA always);
    # with warp_specialize: its two-consumer-warpgroup form (block_m 128, num_warps 4, plus a TMA producer warp)
    persistent: bool = False  # that form with one CTA per SM walking a longest-first tile plan (`_plan.py`; the
    # producer runs into the next tile)
    varlen: bool = False  # a dense call through that form's varlen program (`_gluon_varlen.py`): any lengths, the
    # sequence ends masked (the dense Gluon programs need lengths that are multiples of the tile)
    joint_release: bool = False  # a K/V stage refilled only after both its K and V were used (the default releases
    # K after QKᵀ, V after P·V); kept to measure against (TUNING.md step 13)
    cap_bound: bool = True  # the varlen form soft-caps without a running max (`_features.CAP_BOUND_MAX`, step 19);
    # False: the online softmax as for plain calls, kept to measure against
    p_pack_alu: bool = False  # the varlen form rounds P to bf16 on the integer pipe instead of F2FP (bf16 only;
    # TUNING.md steps 21-22: alone it loses, with cap_poly=4 it wins)
    lpt: bool = False  # the dense Gluon programs' causal and windowed tiles in FlashAttention's LPT order, heads
    # grouped in sections whose K/V fit in L2 (`l2_heads`; `_gluon.tile_order`)
    cap_poly: int = 0  # with cap_bound: one exponential in cap_poly (2, 4) as a polynomial on the FMA pipes (steps
    # 20, 22). A default softcap-alone call at head dims 80-128 takes cap_poly=4 and, in bf16, p_pack_alu
    # (`_features.softcap_switches`)
    split_mask: bool = False  # the dense warp-specialized Gluon program's causal key loop in two: the blocks every
    # row sees whole with no mask test, then the diagonal ones (TUNING.md step 28)
    exp_poly: int = 0  # the dense Gluon programs' online softmax: one score exponential in exp_poly (2, 4) as a
    # polynomial on the FMA pipes (TUNING.md step 28; in bf16 it lost at every shape on an H100, step 29: off)
    pingpong: bool = False  # the dense warp-specialized Gluon program's (and its persistent form's) two consumers
    # issue each key block's matmuls in turns, so one's run under the other's softmax (FlashAttention-3's warpgroup
    # ping-pong; TUNING.md step 30)
    v_wait_early: bool = False  # the Gluon programs wait for each key block's values at the end of its softmax,
    # which keeps ptxas from hoisting the wait for P_{j-1}·V_{j-1} above S_j's exponentials (`_gluon._v_wait_early`;
    # TUNING.md step 31)

    def __post_init__(self):
        if self.cap_poly not in (0, 2, 4):
            raise ValueError(f"cap_poly is 0 (every exponential on the special-function unit), 2 or 4, got {self.cap_poly}")
        if self.exp_poly not in (0, 2, 4):
            raise ValueError(f"exp_poly is 0 (every exponential on the special-function unit), 2 or 4, got {self.exp_poly}")
        if self.exp_poly and not self.dense_gluon:
            raise ValueError("exp_poly is an option of the dense Gluon programs (gluon=True, not varlen or persistent)")
        if self.pingpong and not (self.dense_ws or self.persistent):
            raise ValueError("pingpong is an option of the dense warp-specialized Gluon program and its persistent "
                             "form (gluon=True, warp_specialize=True, not varlen)")
        if self.v_wait_early and not self.gluon:
            raise ValueError("v_wait_early is an option of the Gluon programs (gluon=True)")
        if self.split_mask and not self.dense_ws:
            raise ValueError("split_mask is an option of the dense warp-specialized Gluon program (gluon=True, "
                             "warp_specialize=True, not varlen or persistent)")
        if self.cap_poly and not (self.gluon and self.varlen and self.cap_bound):
            raise ValueError("cap_poly is an option of the varlen Gluon program's bounded softcap (gluon=True, "
                             "warp_specialize=True, varlen=True, cap_bound=True)")

    @property
    def dense_gluon(self) -> bool:
        """A dense Gluon program: the one-warpgroup or the warp-specialized one, neither varlen nor persistent."""
        return self.gluon and not self.varlen and not self.persistent

    @property
    def dense_ws(self) -> bool:
        """The dense warp-specialized Gluon program (`_gluon.attention_fwd_sm90_ws`)."""
        return self.dense_gluon and self.warp_specialize

    def label(self) -> str:
        return (f"{self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages} {'tma' if self.use_tma else 'ptr'}"
                + (" ws" if self.warp_specialize else "") + (" ov" if self.overlap else "") + (" px" if self.poly_exp else "")
                + (" lz" if self.lazy_rescale else "") + (" gluon" if self.gluon else "")
                + (" persistent" if self.persistent else "") + (" varlen" if self.varlen else "")
                + (" joint" if self.joint_release else "") + ("" if self.cap_bound else " online-max")
                + (f" poly/{self.cap_poly}" if self.cap_poly else "") + (" alu-pack" if self.p_pack_alu else "")
                + (f" exp-poly/{self.exp_poly}" if self.exp_poly else "") + (" split-mask" if self.split_mask else "")
                + (" lpt" if self.lpt else "") + (" pingpong" if self.pingpong else "")
                + (" v-wait-early" if self.v_wait_early else ""))


def p_pack_problem(cfg: Config, dtype: torch.dtype, packed: bool = False) -> str | None:
    """Why `Config.p_pack_alu` cannot apply to this call (None when it is off or can): only the warp-specialized
    varlen Gluon program has it (`packed`: a `flash_attn_varlen_func` call, where a Gluon config runs that program),
    and only for bf16 (the high half of an fp32 is a bf16, not an fp16)."""
    if not cfg.p_pack_alu:
        return None
    if not (cfg.gluon and cfg.warp_specialize and (cfg.varlen or packed)):
        return "p_pack_alu is a switch of the warp-specialized varlen Gluon program (gluon, warp_specialize, varlen)"
    if dtype != torch.bfloat16:
        return f"p_pack_alu rounds P to bf16 (got {str(dtype).removeprefix('torch.')})"
    return None


# Chosen on the H200 (see TUNING.md): head dim -> config. TMA needs compute capability 9.0+. 80 and 96 run padded to
# 128 columns with masked pointer loads (a TMA box must be a power of two wide); 256 takes 128x64 tiles on 8 warps
# (TUNING.md step 10: 478-499 TF/s on the H200, 3.2x 64x32 tiles).
_TUNED = {
    64: Config(block_m=64, block_n=128, num_warps=4, num_stages=2, use_tma=True),
    80: Config(block_m=64, block_n=64, num_warps=4, num_stages=3, use_tma=False),
    96: Config(block_m=64, block_n=64, num_warps=4, num_stages=3, use_tma=False),
    128: Config(block_m=64, block_n=64, num_warps=4, num_stages=3, use_tma=True),
    256: Config(block_m=128, block_n=64, num_warps=8, num_stages=2, use_tma=True),
}


def gluon_shape_problem(cfg: Config, head_dim: int, layout: str | None) -> str | None:
    """None when the Gluon program `cfg` names can be built at this head dim for tensors in this TMA `layout`
    (`tma_layout`), else why not (shared by the dense and packed entry points)."""
    if head_dim not in GLUON_HEAD_DIMS:
        return (f"the Gluon programs are built for head dims {', '.join(map(str, GLUON_HEAD_DIMS))} (got {head_dim}: "
                "the Triton program takes it)")
    if head_dim in (80, 96, 256) and (not cfg.warp_specialize or cfg.persistent):
        return (f"head dim {head_dim} runs only on the warp-specialized Gluon program, not persistent (256: its "
                "[128, 256] accumulator needs the two consumer warpgroups; 80, 96: its zero-padded tiles)")
    width = block_d(head_dim)  # 80, 96 take 128-wide tiles
    if cfg.warp_specialize and cfg.block_m == 192 and width > 64:
        return "three consumer warpgroups (block_m 192) fit their registers at head dim 64 only"
    if cfg.warp_specialize:
        smem = 2 * (cfg.block_m * width + 2 * cfg.num_stages * cfg.block_n * width)  # Q halves + K/V stages
        if smem > SMEM_PER_CTA:
            return (f"{cfg.label()} needs {smem // 1024} KiB of shared memory at head dim {head_dim}, more than a CTA "
                    f"may have ({SMEM_PER_CTA // 1024} KiB): fewer stages or a narrower key block")
        if cfg.block_n * width > 16384:
            return (f"block_n {cfg.block_n} x head dim {width} > 16384: a consumer's scores and accumulator would "
                    "not stay in its registers")
    if width != head_dim and layout != "heads":
        return (f"head dim {head_dim} on the Gluon program needs head-major storage ([B, S, H, D] views of contiguous "
                "[B, H, S, D] tensors; packed, [total, H, D] views of [H, total, D]): TMA zero-fills the padding "
                "columns past D there, in the token-major layout they are the next head's")
    return None


# The warp-specialized Gluon program (TUNING.md step 6): a 128-row tile, two consumer warpgroups, a TMA producer warp.
GLUON_WS = Config(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True, warp_specialize=True)
# Causal head dim 128 with 2k-8k keys: the same program in FlashAttention's LPT tile order (TUNING.md step 30: 1.00 /
# 1.05 / 1.10x the grid order at 2k / 4k / 8k on an H100, 1.02-1.07x in step 29's run; 0.87x at 1k, 0.94-0.97x at 16k)
GLUON_WS_LPT = dataclasses.replace(GLUON_WS, lpt=True)
LPT_KEYS = (2048, 8192)

GLUON_WS_VARLEN = dataclasses.replace(GLUON_WS, varlen=True)
GLUON_WS_256 = dataclasses.replace(GLUON_WS, block_n=64, num_stages=2)  # Q + 2 x (K + V) at 256: 192 KiB
GLUON_WS_256_VARLEN = dataclasses.replace(GLUON_WS_256, varlen=True)
GLUON_64 = Config(block_m=64, block_n=128, num_warps=4, num_stages=2, gluon=True)  # one warpgroup, 64x128 tiles
GLUON_64x64 = Config(block_m=64, block_n=64, num_warps=4, num_stages=3, gluon=True)  # 112 KiB at D 128: 2 CTAs/SM
# A sliding window of at most `_features.SMALL_WINDOW` keys (and sinks beside it): the one-warpgroup program on 64x64
# tiles, which walks 3 key blocks per 64 rows at a 128-key window where the warp-specialized varlen program walks 2
# blocks of 128 per 64 rows, and fits 2 (head dim 128) to 4 (64) CTAs per SM, so one tile's prologue and epilogue run
# under another's loop (TUNING.md step 25: gpt-oss's 128-key window 0.61 -> 1.28x FlashAttention-4, an H100). Head
# dim 64 on 2 stages (step 30: 1.50x / 1.52x FA4 at gpt-oss's window and 0.97x / 0.98x at a 1024-key one in two runs
# on an H100, against 3 stages' 1.29x and 0.92x; its window-and-sinks fp64 oracle test passed there), 128 on 3 (2 lost
# at 128: 0.91x / 0.78x against 0.97x / 0.88x at windows 512 / 1024)
GLUON_WINDOW = {64: dataclasses.replace(GLUON_64x64, num_stages=2), 128: GLUON_64x64}


def gluon_preferred(head_dim: int, causal: bool, sk: int, aligned: bool) -> Config | None:
    """The Gluon program measured faster than the Triton one for this head dim, mask and key length on the H200, or
    None (the Triton program). `aligned`: the lengths are multiples of the tile, so the dense Gluon programs take
    them; otherwise the varlen form masks the ends. From TUNING.md steps 6, 11, 12 and 13 (× SDPA auto, the Triton
    program in parentheses):
      - head dim 128: causal 0.90-1.08 (0.80-0.89), not causal 0.88-1.00 (0.70-0.78), ragged 0.95-0.97 (0.86-0.88);
        causal up to 1k keys the one-warpgroup program on 64x64 tiles, two CTAs per SM (0.92-0.93 against the
        warp-specialized one's 0.89-0.90; from 2k keys 0.87 against 0.93-0.96); causal 2k-8k keys its tiles in LPT
        order (`LPT_KEYS`, step 30);
      - head dim 64, causal: the one-warpgroup program 64x128 below 8k keys (0.98 against 0.89-0.93), the
        warp-specialized one from 8k (1.01-1.04 against 0.96-0.98), ragged its varlen form (0.90 against 0.79);
      - head dim 64, not causal: the one-warpgroup program 0.92-0.98 (0.91-0.94); ragged stays on the Triton
        program (1.07 against 1.01);
      - head dims 80 and 96 on zero-padded 128-wide tiles 0.95-1.02 (0.64-0.73), ragged the varlen form 0.89-0.99;
      - head dim 256 on 128x64 tiles, 2 stages, K and V released apart: 0.91-1.01 (0.70-0.73), ragged the varlen
        form 0.82-0.94."""
    if head_dim == 128 and causal and aligned and sk <= 1024:
        return GLUON_64x64
    if head_dim == 128 and causal and aligned and LPT_KEYS[0] <= sk <= LPT_KEYS[1]:
        return GLUON_WS_LPT
    if head_dim in (128, 96, 80):
        return GLUON_WS if aligned else GLUON_WS_VARLEN
    if head_dim == 256:
        return GLUON_WS_256 if aligned else GLUON_WS_256_VARLEN
    if head_dim == 64 and causal:
        if not aligned:
            return GLUON_WS_VARLEN
        return GLUON_WS if sk >= 8192 else GLUON_64
    if head_dim == 64 and aligned:
        return GLUON_64
    return None


L2_BYTES = 50 * 2**20  # what FlashAttention's LPT scheduler counts on for K/V in an H100's/H200's L2


def l2_heads(sk: int, head_dim: int, itemsize: int, heads: int) -> int:
    """How many heads an LPT section groups (`_gluon.tile_order`): the largest power of two whose K/V (sk keys, K and
    V rows of `head_dim`) fit in `L2_BYTES`, at least 1 and at most `heads` (batch x query heads), as FlashAttention's
    SingleTileLPTScheduler sizes its swizzle."""
    per_head = max(sk * 2 * block_d(head_dim) * itemsize, 1)
    n = max(L2_BYTES // per_head, 1)
    return min(1 << (n.bit_length() - 1), max(heads, 1))


def block_d(head_dim: int) -> int:
    """The head dim padded to the power of two the programs' tiles use (80, 96 -> 128)."""
    return 1 << (head_dim - 1).bit_length()


def default_config(head_dim: int, device: torch.device) -> Config:
    """The tuned Triton config for this head dim; pointer loads where TMA is unavailable (pre-Hopper, interpreter)."""
    cfg = _TUNED[head_dim]  # check_inputs refused any other head dim
    tma_ok = (device.type == "cuda" and not INTERPRETED and torch.cuda.get_device_capability(device)[0] >= 9)
    if cfg.use_tma and not tma_ok:
        cfg = dataclasses.replace(cfg, use_tma=False)
    return cfg
