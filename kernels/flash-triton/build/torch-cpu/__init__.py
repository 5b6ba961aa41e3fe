"""flash-triton: FlashAttention-style fused attention forward in Triton, with flash-attn's three entry points.

    flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, ...)            dense  [B, S, H, D]
    flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)  packed [total, H, D]
    flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None, ...)

Same signatures, defaults and return values as flash-attn's (`flash_attn_interface.py`), so code written for
kernels-community/flash-attn (transformers' continuous batching among it) calls these unchanged. GQA (Hq a multiple
of Hkv), causal bottom-right aligned (query i sees keys j <= i + Sk - Sq; rows that see no key are zeros).

Which program runs (`choose_config` says, before launch): the prefill program (`_kernel.py`, Triton; its Gluon twin
in `_gluon.py` on sm_90 for aligned causal shapes) for prefill, the split-KV decode program (`_decode.py`) for
`flash_attn_with_kvcache` and for `flash_attn_func` calls whose query rows of one GQA group fit one decode tile
(Sq x Hq/Hkv <= 64: decode and short appends, where the prefill program would leave most of the GPU idle).

Every input is checked before launch and refused with a ValueError that says why: fp16/bf16 only, head dim 64,
80, 96, 128 or 256 (80 and 96 padded to 128 columns inside, Triton programs only), a contiguous head dim, consistent shapes, one device; flash-attn arguments this kernel does not implement
(dropout, ALiBi, rotary) are refused by name (`_checks.py`). Logit soft-capping, sliding windows and attention sinks
(`softcap`, `window_size`, `s_aux`) are computed as flash-attn computes them, on the Triton and decode programs and
the varlen Gluon program (`_features.py` says which runs by default). On the CPU the kernels run
only under Triton's interpreter, which must be on (TRITON_INTERPRET=1) when this module is loaded, because
`@triton.jit` decides then whether it compiles or interprets.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import NamedTuple

import torch
import triton

from ._checks import FP8_MAX, dtype_problem, head_dim_problem, refuse_unsupported, tma_layout
from ._config import (
    GLUON_WINDOW,
    GLUON_WS_256_VARLEN,
    GLUON_WS_VARLEN,
    INTERPRETED,
    SUPPORTED_DTYPES,
    SUPPORTED_HEAD_DIMS,
    Config,
    block_d,
    default_config,
    gluon_preferred,
    gluon_shape_problem,
    l2_heads,
    p_pack_problem,
)
from ._features import (
    GLUON_BY_DEFAULT,
    PLAIN,
    Features,
    effective,
    gluon_problem,
    is_plain,
    kernel_args,
    parse_features,
    sinks_only,
    small_window,
    softcap_switches,
    varlen_gluon_meta,
)
from ._fp8 import FP8_HEAD_DIMS, fp8_attention
from ._kernel import attention_fwd
from ._kvcache import flash_attn_with_kvcache, kvcache_attention
from ._launch import fast_launch_problem, launcher, rebase
from ._plan import plan_tensor
from ._splits import DEFAULT_FP8 as DEFAULT_FP8_DECODE
from ._splits import DecodeConfig, cdiv, sm_count
from ._varlen import flash_attn_varlen_func, gluon_feature_args, gluon_varlen_unsupported, varlen_attention

ACCEPTS_STRIDED = True  # any batch/seq/head strides with a contiguous head dim: callers may pass views, no copies
MODEL_FEATURES = ("softcap", "window_size", "s_aux")  # flash-attn's arguments computed as flash-attn does (_features)
# flash_attn_with_kvcache reads a dense FP8 v_cache stored with the keys contiguous (`_kvcache.v_keys`: Vᵀ tiles, no
# byte-wise gather of the value tile; 1.03-1.07x the head-dim-contiguous FP8 cache on an H100): a caller's FP8 cache
# may store V so (attnprof's `Fp8StaticCache(v_keys=True)` can; its `serve` keeps V head-dim-contiguous, measured
# faster end to end)
FP8_V_KEYS_CONTIGUOUS = True
__all__ = ["FP8_HEAD_DIMS", "fp8_attention", "MODEL_FEATURES", "FP8_V_KEYS_CONTIGUOUS", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "attention", "varlen_attention",
           "kvcache_attention", "Config", "DecodeConfig", "DEFAULT_FP8_DECODE", "default_config", "choose_config", "check_inputs",
           "gluon_unsupported", "gluon_varlen_unsupported", "tma_layout", "fast_launch_problem", "SUPPORTED_HEAD_DIMS", "SUPPORTED_DTYPES",
           "INTERPRETED"]

_DECODE_ROWS = 64  # Sq x G rows up to which flash_attn_func takes the decode program (one decode M tile)


def choose_config(q: torch.Tensor, k: torch.Tensor, causal: bool) -> Config | DecodeConfig:
    """The config `flash_attn_func` launches for these inputs: the decode program when a GQA group's query rows fit
    one decode tile, a Gluon program when one takes them and was measured faster at this head dim, mask and length
    (`gluon_preferred`), else the tuned Triton program (`default_config`)."""
    d = q.shape[-1]
    sq, sk = q.shape[1], k.shape[1]
    if sq * (q.shape[2] // max(k.shape[2], 1)) <= _DECODE_ROWS:
        return DecodeConfig()
    aligned = sq % 128 == 0 and sk % 128 == 0 and not (causal and sq > sk)
    cfg = gluon_preferred(d, causal, sk, aligned)
    if cfg is not None and gluon_unsupported(q, k, causal, cfg) is None:
        return cfg
    return default_config(d, q.device)


def gluon_unsupported(q: torch.Tensor, k: torch.Tensor, causal: bool, cfg: Config) -> str | None:
    """None when the Gluon program (`_gluon.py`) can run these (already checked) inputs with `cfg`, else why not."""
    if q.device.type != "cuda" or INTERPRETED:
        return "the Gluon program needs a CUDA GPU (Gluon has no interpreter)"
    layout = tma_layout(q, k, k)  # v is checked by `attention`
    if problem := gluon_shape_problem(cfg, q.shape[-1], layout):
        return problem
    if layout is None:
        return ("the Gluon program reads q, k, v through TMA as contiguous [B, S, H, D] tensors or as [B, S, H, D] "
                "views of contiguous [B, H, S, D] ones (these have other strides)")
    major, minor = torch.cuda.get_device_capability(q.device)
    if (major, minor) != (9, 0):
        return f"the Gluon program uses wgmma, which only sm_90 has (this GPU is sm_{major}{minor})"
    try:
        import triton.experimental.gluon  # noqa: F401
    except ImportError:
        return f"Triton {triton.__version__} has no Gluon"
    if (cfg.persistent or cfg.varlen) and not cfg.warp_specialize:
        return "persistent and varlen need the warp-specialized Gluon program (warp_specialize=True)"
    if cfg.persistent and cfg.varlen:
        return "the varlen Gluon program is not persistent"
    if cfg.joint_release and (cfg.persistent or not cfg.warp_specialize):
        return "joint_release is an option of the warp-specialized Gluon program (not persistent)"
    if cfg.poly_exp or cfg.overlap or cfg.lazy_rescale:
        return "poly_exp, overlap and lazy_rescale are options of the Triton program, not of the Gluon ones"
    if cfg.warp_specialize and not ((cfg.block_m, cfg.num_warps) == (128, 4) or (cfg.varlen and cfg.block_m == 192
                                                                                   and cfg.num_warps == 4)):
        return (f"the warp-specialized Gluon program takes block_m 128 with num_warps 4 (two consumer warpgroups of "
                f"64 rows and a producer warp; its varlen form also 192, three consumers), got {cfg.block_m} with "
                f"{cfg.num_warps} warps")
    if not cfg.warp_specialize and cfg.block_m != 16 * cfg.num_warps:
        return f"block_m must be 16 x num_warps (one warpgroup per 64 rows), got {cfg.block_m} with {cfg.num_warps} warps"
    if cfg.varlen:  # any lengths: the varlen program masks the sequence ends and zeroes rows that see no key
        if k.shape[1] < cfg.block_n:  # its last key block is shifted back inside the sequence: needs a whole one
            return (f"the varlen Gluon program needs Sk >= {cfg.block_n} in a dense call (got {k.shape[1]}): a shorter "
                    "key block would read the next sequence's rows")
        return None
    sq, sk = q.shape[1], k.shape[1]
    if sq % cfg.block_m or sk % cfg.block_n:
        return (f"the Gluon program needs Sq a multiple of {cfg.block_m} and Sk of {cfg.block_n} "
                f"(got {sq}, {sk}): its TMA tiles never cross a sequence end")
    if causal and sq > sk:
        return f"the Gluon program needs Sq <= Sk when causal (got {sq} > {sk}): it has no rows that see no key"
    return None


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, _fp32_ok: bool = False) -> str | None:
    """None when the kernel can take these tensors, else the reason it refuses them."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            return f"{name} is a {type(t).__name__}, not a torch.Tensor"
        if t.dim() != 4:
            return f"{name} must be 4-D [B, S, H, D], got shape {tuple(t.shape)}"
        if t.dtype not in SUPPORTED_DTYPES and not (_fp32_ok and t.dtype == torch.float32):
            return dtype_problem(name, t.dtype)
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            return (f"{name} must have a contiguous last (head) dimension, got strides {t.stride()} for shape "
                    f"{tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        return f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    if not (q.device == k.device == v.device):
        return f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}"
    b, sq, hq, d = q.shape
    if k.shape != v.shape:
        return f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}"
    bk, sk, hkv, dk = k.shape
    if bk != b:
        return f"batch of q ({b}) and k/v ({bk}) differ"
    if dk != d:
        return f"head dim of q ({d}) and k/v ({dk}) differ"
    if d not in SUPPORTED_HEAD_DIMS:
        return head_dim_problem(d)
    if hkv == 0 or hq % hkv:
        return f"query heads ({hq}) must be a multiple of kv heads ({hkv}) for GQA"
    if q.device.type == "cpu" and not INTERPRETED:
        return ("CPU tensors need Triton's interpreter, and it was off when this kernel was loaded: "
                "set TRITON_INTERPRET=1 before loading the kernel")
    if q.device.type not in ("cpu", "cuda"):
        return f"device {q.device} is not supported (CUDA, or the CPU through Triton's interpreter)"
    return None


class _Plan(NamedTuple):
    """What `attention` decided for one call signature (`_plan`)."""

    kind: str  # "empty", "decode", "bf16-interpreter", "gluon" or "triton"
    cfg: Config | DecodeConfig | None = None
    layout: str | None = None  # `tma_layout` of q, k, v
    serial: int = 0  # the launchers' and `_DESCS`' key: an int hashes faster than the signature, and is never reused
    out_shape: tuple = ()  # the output `attention` allocates: q's layout (a `[B, S, H, D]` view of `[B, H, S, D]`
    out_strides: tuple = ()  # storage for "heads", else contiguous), made with one `torch.empty_strided`
    strides: tuple = ()  # the Triton program's 12 stride arguments (q, k, v, out)
    out_like_q: bool = False  # the output's strides are q's exactly: `torch.empty_like(q)` makes it (half the host
    # time of `empty_strided`'s argument parsing)


_PLANS: dict[tuple, _Plan] = {}  # call signature -> what `attention` decided for it
_MAX_PLANS = 4096
_SERIALS = itertools.count(1)  # a plan's key for the launchers and `_DESCS`: an int hashes faster than the signature


def _signature(q, k, v, causal, config, fp32_ok, f: Features = PLAIN, s_aux=None) -> tuple | None:
    """Everything `_plan` decides from: shapes, strides, dtypes, devices, 16-byte alignment (TMA), the mask, the
    config, the model features (and the sinks' dtype and alignment). Not the values: the same signature always gets
    the same plan. None for non-tensors (checked the slow way)."""
    if not (type(q) is type(k) is type(v) is torch.Tensor):
        return None
    sinks = None if s_aux is None else (s_aux.dtype, s_aux.data_ptr() % 16)
    return (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, q.device,
            k.device, v.device, q.data_ptr() % 16, k.data_ptr() % 16, v.data_ptr() % 16, bool(causal), config, fp32_ok,
            f, sinks)


def _plan(q, k, v, causal: bool, config, fp32_ok: bool, f: Features = PLAIN) -> tuple:
    """Check the inputs (ValueError with the reason) and decide the program (a `_Plan` of kind "empty", "decode",
    "bf16-interpreter", "gluon" or "triton"); the output's layout and the Triton program's strides are fixed by the
    signature. Model features (`_features.py`) run on the Triton and decode programs and the varlen Gluon program
    (`_feature_config`)."""
    reason = check_inputs(q, k, v, _fp32_ok=fp32_ok and INTERPRETED)
    if reason is not None:
        raise ValueError(f"flash-triton: {reason}")
    d, sk = q.shape[-1], k.shape[1]
    if q.numel() == 0 or sk == 0:
        return _Plan("empty")
    if isinstance(config, Config) and (reason := p_pack_problem(config, q.dtype) or config.gluon and (
            gluon_problem(f, config.varlen, config.warp_specialize and not config.persistent,
                          not (config.warp_specialize or config.varlen or config.persistent), config.persistent)
            or gluon_unsupported(q, k, causal, config) or _window_problem(q, k, f, config))):
        raise ValueError(f"flash-triton: {config.label()}: {reason}")  # choose_config checked its own pick
    cfg = config or choose_config(q, k, causal)
    if config is None and isinstance(cfg, Config) and cfg.gluon and f.any:
        cfg = _feature_config(q, k, causal, f, cfg)
    layout = tma_layout(q, k, v)
    if isinstance(cfg, Config) and cfg.gluon and layout is None:  # v's layout: choose_config saw q, k
        if config is not None:
            raise ValueError(f"flash-triton: {config.label()}: v's strides are neither q's nor k's TMA layout")
        cfg = default_config(d, q.device)
    bf16_interp = INTERPRETED and q.dtype == torch.bfloat16
    if bf16_interp and isinstance(cfg, DecodeConfig):
        if config is not None:
            raise ValueError("flash-triton: bfloat16 through Triton's interpreter runs only the dense program on "
                             "float32 copies (the interpreter gets bf16 tl.dot wrong); use float16 or a CUDA GPU "
                             "for the decode program")
        cfg = default_config(d, q.device)  # the CPU's bf16 path is the dense program, for any Sq
    if isinstance(cfg, DecodeConfig):  # k/v are a full dense cache: every sequence has Sk keys
        return _Plan("decode", cfg)
    if bf16_interp:
        return _Plan("bf16-interpreter", cfg)
    b, sq, hq, _ = q.shape
    out = (hq * sq * d, d, sq * d, 1) if layout == "heads" else (sq * hq * d, hq * d, d, 1)  # q's layout
    like = q.stride() == out
    if cfg.gluon:
        return _Plan("gluon", cfg, layout, next(_SERIALS), (b, sq, hq, d), out, out_like_q=like)
    if cfg.use_tma and (layout is None or block_d(d) != d):
        cfg = dataclasses.replace(cfg, use_tma=False)  # other strides, or a padded head dim: pointer loads
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out[:3])
    return _Plan("triton", cfg, layout, next(_SERIALS), (b, sq, hq, d), out, strides, like)


def _window_problem(q, k, f: Features, cfg: Config) -> str | None:
    """Why the one-warpgroup or the persistent Gluon program cannot take this window (None when it can or nothing
    asks)."""
    if f.window == (-1, -1) or (cfg.warp_specialize and not cfg.persistent) or cfg.varlen or q.shape[1] <= k.shape[1]:
        return None
    return (f"a window on the {'persistent' if cfg.persistent else 'one-warpgroup'} Gluon program needs Sq <= Sk (got "
            f"{q.shape[1]} > {k.shape[1]}): every row must see a key; the varlen one (varlen=True) takes any lengths")


def _feature_config(q, k, causal: bool, f: Features, plain: Config) -> Config:
    """The program of a call with model features whose plain twin would run the Gluon program `plain`: that one for
    sinks alone when it is the dense warp-specialized program (the varlen one runs the same shapes ~4 % slower); the
    one-warpgroup program on 64x64 tiles for a small window (`_features.small_window`, with or without sinks) at
    head dims 64 and 128 when the lengths are multiples of 64 and Sq <= Sk (`_config.GLUON_WINDOW`); else the varlen
    Gluon program where it takes the tensors (unless FLASH_TRITON_GLUON_FEATURES=0: `_features.GLUON_BY_DEFAULT`),
    else the Triton one."""
    d = q.shape[-1]
    if GLUON_BY_DEFAULT and sinks_only(f) and plain.warp_specialize and not (plain.persistent or plain.varlen):
        return plain
    if GLUON_BY_DEFAULT and small_window(f, causal) and d in GLUON_WINDOW and q.shape[1] <= k.shape[1]:
        cfg = GLUON_WINDOW[d]
        if gluon_unsupported(q, k, causal, cfg) is None:  # lengths multiples of 64
            return cfg
    if GLUON_BY_DEFAULT:
        cfg = GLUON_WS_256_VARLEN if d == 256 else GLUON_WS_VARLEN
        if gluon_unsupported(q, k, causal, cfg) is None:
            return softcap_switches(cfg, f, d, q.dtype)
    return default_config(d, q.device)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None,
              causal: bool = False, *, config: Config | DecodeConfig | None = None, features: Features = PLAIN,
              s_aux: torch.Tensor | None = None, timeline: torch.Tensor | None = None,
              _fp32_ok: bool = False) -> torch.Tensor:
    """`flash_attn_func` with an explicit launch `config` (for tuning). `[B, S, H, D]` in and out, any strides with a
    contiguous head dim, never copied: TMA (and the Gluon program) read contiguous tensors and `[B, S, H, D]` views of
    contiguous `[B, H, S, D]` ones (`tma_layout`), other strides go through pointer loads. The output has q's layout
    in the second case (a view of a `[B, H, S, D]` tensor), else it is contiguous.

    The checks and the choice of program run once per call signature (shapes, strides, dtypes, alignment, mask,
    config; `_signature`) and are remembered: they were a third of a small call's host time. `features` (checked by
    `_features.parse_features`) and the sinks `s_aux` `[Hq]` are flash-attn's softcap, window_size and s_aux.
    `timeline`: a diagnostic of the schedule, for the dense warp-specialized Gluon program and its persistent form only
    (ValueError otherwise): a contiguous int64 CUDA tensor of 4 x (its tiles) elements, where each tile writes (global
    timer ns at its start, at its end, its SM, its key blocks) at 4 x its number: the program's linear id, or in the
    persistent form `off_bh * n_m + start_m` (`_gluon.py`)."""
    # _fp32_ok: only the interpreter's own bf16 path (below) runs float32 copies; callers cannot ask for it
    f = features
    if f is not PLAIN and isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() == 4 == k.dim():
        f = effective(f, q.shape[1], k.shape[1], bool(causal))  # a window that keeps every key is no window
    key = _signature(q, k, v, causal, config, _fp32_ok, f, s_aux)
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _plan(q, k, v, causal, config, _fp32_ok, f)
        if key is not None:
            if len(_PLANS) >= _MAX_PLANS:
                _PLANS.clear()
            _PLANS[key] = plan
    kind = plan.kind
    b, sq, hq, d = q.shape
    if timeline is not None:
        _check_timeline(timeline, kind, plan.cfg, b * hq, sq)
    if kind == "empty":
        return torch.zeros((b, sq, hq, d), dtype=q.dtype, device=q.device)
    if kind == "decode":
        return kvcache_attention(q, k, v, softmax_scale=softmax_scale, causal=causal, config=plan.cfg,
                                 softcap=f.softcap, window_size=f.window, s_aux=s_aux)
    cfg = plan.cfg
    if kind == "bf16-interpreter":
        # Triton's interpreter upcasts bf16 tl.dot operands wrongly (values ~1e8, relative error ~1e9): on the
        # CPU only, the program runs on float32 copies (every tl.dot then in fp32) and the result is rounded to
        # bf16. Never on a GPU, where bf16 is compiled and right.
        out = attention(q.float(), k.float(), v.float(), softmax_scale, causal, config=cfg, features=f, s_aux=s_aux,
                        _fp32_ok=True)
        return out.to(torch.bfloat16)
    layout = plan.layout
    # not cached (no signature), or with a timeline (the plan's fast launch has none): every launch through Triton's binder
    lkey = None if key is None or timeline is not None else plan.serial
    sk, hkv = k.shape[1], k.shape[2]
    scale = d ** -0.5 if softmax_scale is None else float(softmax_scale)
    # the output takes q's layout when q is a view of [B, H, S, D] (no copy on the way back to PyTorch's layout)
    if plan.out_like_q:
        out = torch.empty_like(q)
    else:
        out = torch.empty_strided(plan.out_shape, plan.out_strides, dtype=q.dtype, device=q.device)
    if kind == "gluon":
        _launch_gluon(q, k, v, out, scale, bool(causal), cfg, heads_in_rows=layout == "heads", key=lkey, f=f,
                      s_aux=s_aux, timeline=timeline)
        return out
    run = launcher(attention_fwd)
    grid = (cdiv(sq, cfg.block_m), b * hq)
    rest = (scale * _LOG2E, *plan.strides, hq, hq // hkv, sq, sk, None, None, s_aux,
            *kernel_args(f, scale))
    if cfg.use_tma:
        if run.launch_bases(lkey, grid, (q, k, v, out, q, k, v, *rest)):  # descriptors expanded from their bases
            return out
        from triton.tools.tensor_descriptor import TensorDescriptor

        def make():
            if layout == "heads":  # 2-D views [B*H*S, D]: a tile is BLOCK consecutive rows of one head
                return (TensorDescriptor(q, [b * hq * sq, d], [d, 1], [cfg.block_m, d]),
                        TensorDescriptor(k, [b * hkv * sk, d], [d, 1], [cfg.block_n, d]),
                        TensorDescriptor(v, [b * hkv * sk, d], [d, 1], [cfg.block_n, d]))
            # 2-D views [B*S, H*D]: a tile is BLOCK rows of one head's D columns
            return (TensorDescriptor(q, [b * sq, hq * d], [hq * d, 1], [cfg.block_m, d]),
                    TensorDescriptor(k, [b * sk, hkv * d], [hkv * d, 1], [cfg.block_n, d]),
                    TensorDescriptor(v, [b * sk, hkv * d], [hkv * d, 1], [cfg.block_n, d]))

        desc_q, desc_k, desc_v = _descs(lkey, (q, k, v), make)
    else:
        desc_q = desc_k = desc_v = None
    run(lkey, grid, (q, k, v, out, desc_q, desc_k, desc_v, *rest),
        dict(HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=bool(causal), USE_TMA=cfg.use_tma,
             **f.meta(), WARP_SPECIALIZE=cfg.warp_specialize, OVERLAP=cfg.overlap, POLY_EXP=cfg.poly_exp,
             LAZY_RESCALE=cfg.lazy_rescale, HEADS_IN_ROWS=cfg.use_tma and layout == "heads", BLOCK_D=block_d(d),
             num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    return out


_LOG2E = math.log2(math.e)
_DESCS: dict[int, tuple] = {}  # plan serial -> the TMA descriptors its first call made (templates, `_launch.rebase`)


def _descs(key, tensors: tuple, make) -> tuple:
    """The call's TMA descriptors over `tensors`: `make()` on a signature's first call, its descriptors rebased on
    the new tensors after that (same shapes, strides and alignment: the key says so)."""
    templates = _DESCS.get(key) if key is not None else None
    if templates is None:
        templates = make()
        if key is not None:
            if len(_DESCS) >= _MAX_PLANS:
                _DESCS.clear()
            _DESCS[key] = templates
        return templates
    return tuple(rebase(tpl, t) for tpl, t in zip(templates, tensors))


@functools.cache
def _gluon_programs() -> tuple:
    """The sm_90 Gluon programs, imported on first use (a Triton without Gluon never gets here: `gluon_unsupported`)."""
    from ._gluon import attention_fwd_sm90, attention_fwd_sm90_ws, attention_fwd_sm90_wsp, tma_desc
    from ._gluon_varlen import attention_fwd_sm90_ws_varlen

    return attention_fwd_sm90, attention_fwd_sm90_ws, attention_fwd_sm90_wsp, attention_fwd_sm90_ws_varlen, tma_desc


def _check_timeline(timeline, kind: str, cfg, heads: int, sq: int) -> None:
    """`attention(..., timeline=)`'s rules (ValueError with the reason); `heads` B x Hq, one tile (one record) per
    `block_m` queries of each. A persistent config that reaches a Gluon launch is warp-specialized
    (`gluon_unsupported` refuses it otherwise)."""
    if kind != "gluon" or not (cfg.dense_ws or cfg.persistent):
        runs = cfg.label() if isinstance(cfg, Config) else f"the {kind} path"
        raise ValueError(f"flash-triton attention: timeline= is a diagnostic of the dense warp-specialized Gluon "
                         f"program and its persistent form; this call runs {runs}")
    programs = heads * (sq // cfg.block_m)
    if timeline.dtype != torch.int64 or not timeline.is_contiguous() or timeline.numel() < 4 * programs:
        raise ValueError(f"flash-triton attention: timeline= takes a contiguous int64 tensor of at least 4 x "
                         f"{programs} elements (got {timeline.dtype}, {timeline.numel()})")


def _launch_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, scale: float, causal: bool,
                  cfg: Config, heads_in_rows: bool, key=None, f: Features = PLAIN, s_aux=None,
                  timeline=None) -> None:
    """Launch the Gluon program `cfg` names; model features `f` (and the sinks `s_aux`) on the varlen one, a window
    and sinks on the one-warpgroup one, sinks alone on the dense warp-specialized one too. `cfg.lpt`: causal or
    windowed tiles in FlashAttention's LPT order (`_gluon.tile_order`), on a one-dimensional grid. A repeat call
    passes the tensors where the TMA descriptors go (`Launcher.launch_bases`); the first call of a key, or one the
    direct launch cannot take, builds the descriptors (`_descs`)."""
    one_wg, ws, wsp, ws_varlen, tma_desc = _gluon_programs()
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale2 = scale * _LOG2E
    width = block_d(d)  # 80, 96: computed on zero-padded 128-wide tiles (`tma_desc`)
    lpt = cfg.lpt and (causal or f.window != (-1, -1)) and not cfg.persistent
    l2 = l2_heads(sk, d, q.element_size(), b * hq) if lpt else 1

    def grid_of(n_m: int) -> tuple:
        return (n_m * b * hq,) if lpt else (n_m, b * hq)

    if cfg.varlen:  # every sequence Sq queries and Sk keys, any lengths: the ends masked, O stored row by row
        run = launcher(ws_varlen)
        grid = grid_of(cdiv(sq, cfg.block_m))
        qk_scale, features = gluon_feature_args(f, scale, s_aux)
        rest = (out, d if heads_in_rows else hq * d, qk_scale, hq, hq // hkv, None, None, sq, sk, *features, l2)
        if run.launch_bases(key, grid, (q, k, v, *rest)):
            return
        dq, dk, dv = _descs(key, (q, k, v), lambda: (
            tma_desc(q, 64, heads_in_rows), tma_desc(k, cfg.block_n, heads_in_rows),  # 64-row Q slices
            tma_desc(v, cfg.block_n, heads_in_rows)))
        run(key, grid, (dq, dk, dv, *rest),
            dict(HEAD_DIM=width, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, CAUSAL=causal,
                 num_warps=cfg.num_warps, DENSE=True, HEADS_IN_ROWS=heads_in_rows, HEAD_DIM_VALID=d,
                 JOINT_RELEASE=cfg.joint_release, **varlen_gluon_meta(f, cfg), LPT=lpt))
        return
    if cfg.persistent:  # one CTA per SM, each walking the tiles of its plan (`_plan.lpt_plan`)
        n_m = sq // cfg.block_m
        ctas = min(n_m * b * hq, sm_count(q.device))
        windowed = f.window != (-1, -1)
        left, right = kernel_args(f, scale)[2:] if windowed else (None, None)
        plan = plan_tensor(q.device, n_m, b * hq, ctas, sq, sk, cfg.block_m, cfg.block_n, causal,
                           l2_heads(sk, d, q.element_size(), b * hq), (left, right) if windowed else None)
        run = launcher(wsp)
        grid = (ctas,)
        rest = (out, d if heads_in_rows else hq * d, scale2, hq, hq // hkv, sq, sk, plan, timeline,
                s_aux if f.sinks else None, left, right)
        if run.launch_bases(key, grid, (q, k, v, *rest)):
            return
        dq, dk, dv = _descs(key, (q, k, v), lambda: (
            tma_desc(q, cfg.block_m // 2, heads_in_rows), tma_desc(k, cfg.block_n, heads_in_rows),
            tma_desc(v, cfg.block_n, heads_in_rows)))
        run(key, grid, (dq, dk, dv, *rest),
            dict(HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, CAUSAL=causal,
                 num_warps=cfg.num_warps, TIMELINE=timeline is not None, HEADS_IN_ROWS=heads_in_rows,
                 PINGPONG=cfg.pingpong, WINDOW=windowed, SINKS=f.sinks, V_WAIT_EARLY=cfg.v_wait_early))
        return
    run = launcher(ws if cfg.warp_specialize else one_wg)
    grid = grid_of(sq // cfg.block_m)
    if cfg.warp_specialize:
        rest = (scale2, hq, hq // hkv, sq, sk, s_aux, l2, timeline)
        meta = {"JOINT_RELEASE": cfg.joint_release, "SINKS": f.sinks, "EXP_POLY": cfg.exp_poly,
                "TIMELINE": timeline is not None, "SPLIT_MASK": cfg.split_mask, "PINGPONG": cfg.pingpong,
                "V_WAIT_EARLY": cfg.v_wait_early}
    else:
        _, _, left, right = kernel_args(f, scale)
        rest = (scale2, hq, hq // hkv, sq, sk, l2, s_aux, left, right)
        meta = {"WINDOW": f.window != (-1, -1), "SINKS": f.sinks, "EXP_POLY": cfg.exp_poly,
                "V_WAIT_EARLY": cfg.v_wait_early}
    if run.launch_bases(key, grid, (q, k, v, out, *rest)):
        return
    q_rows = cfg.block_m // 2 if cfg.warp_specialize else cfg.block_m  # each consumer warpgroup loads its half
    dq, dk, dv, do = _descs(key, (q, k, v, out), lambda: (
        tma_desc(q, q_rows, heads_in_rows), tma_desc(k, cfg.block_n, heads_in_rows),
        tma_desc(v, cfg.block_n, heads_in_rows), tma_desc(out, q_rows, heads_in_rows)))
    run(key, grid, (dq, dk, dv, do, *rest),
        dict(HEAD_DIM=width, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, CAUSAL=causal,
             num_warps=cfg.num_warps, HEADS_IN_ROWS=heads_in_rows, LPT=lpt, **meta))


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, s_aux=None, q_descale=None,
                    k_descale=None, v_descale=None):
    """Fused attention forward, as flash-attn's `flash_attn_func`: q `[B, Sq, Hq, D]`, k/v `[B, Sk, Hkv, D]` ->
    out `[B, Sq, Hq, D]`. `softcap`, `window_size` and `s_aux` (sinks, `[Hq]`) as flash-attn computes them
    (`_features.py`); `deterministic` is accepted (the forward always is); dropout, ALiBi and returned probabilities
    raise ValueError naming the argument. e4m3 q, k, v with FlashAttention-3's `q_descale`/`k_descale`/`v_descale`
    (fp32 `[B, Hkv]` or one element) run the FP8 prefill (`_fp8.py`, head dims 64 and 128, bf16 out)."""
    if dropout_p or alibi_slopes is not None or return_attn_probs:
        refuse_unsupported("flash_attn_func", dropout_p=dropout_p, alibi_slopes=alibi_slopes,
                           return_attn_probs=return_attn_probs)
    if isinstance(q, torch.Tensor) and q.dtype in FP8_MAX:
        if not is_plain(softcap, window_size, s_aux):
            raise ValueError("flash-triton flash_attn_func (FP8): softcap, window_size and s_aux are not built for "
                             "the FP8 prefill")
        return fp8_attention(q, k, v, softmax_scale, causal, q_descale, k_descale, v_descale)
    if q_descale is not None or k_descale is not None or v_descale is not None:
        raise ValueError("flash-triton flash_attn_func: q_descale/k_descale/v_descale apply to FP8 (e4m3) q, k, v; "
                         f"these are {getattr(q, 'dtype', type(q).__name__)}")
    # the checks a plain call needs are two comparisons (host time per call: see `_launch.py`)
    f = PLAIN if is_plain(softcap, window_size, s_aux) else parse_features("flash_attn_func", q, softcap, window_size,
                                                                           s_aux)
    return attention(q, k, v, softmax_scale, causal, features=f, s_aux=s_aux)
