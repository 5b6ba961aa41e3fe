"""`flash_attn_varlen_func`: the prefill program over packed sequences of any lengths, flash-attn's signature.

Serving stacks do not pad a batch of prompts to one length: they pack the tokens of every sequence into one
`[total, H, D]` tensor and say where each sequence starts (`cu_seqlens`, `[B + 1]` int32, cumulative). This is the
same Triton program as `flash_attn_func` (`_kernel.py`, `VARLEN=True`): one CTA per (sequence, query head, query
tile), reading its sequence's offsets and lengths on the device, so nothing is read back to the host and the
call can be captured in a CUDA graph as long as `max_seqlen_q` (the grid) stays the same. Query and key lengths
may differ per sequence (the causal diagonal is bottom-right in each), and may be 0 or 1.

On sm_90, tensors with head dim 128 (and 64 when causal), contiguous or `[total, H, D]` views of contiguous
`[H, total, D]` ones (transformers' continuous batching), take the warp-specialized Gluon program over the packed
sequences instead (`_gluon_varlen.py`; 0.99x the dense Gluon program per sequence, TUNING.md step 8, against
0.81x for the Triton one); `config=` forces either.

Strided inputs are taken as they are (transformers passes `[total, H, D]` views of `[1, H, S, D]` tensors): the
program reads through the token and head strides; only the head dim must be contiguous. TMA loads are used when
the tensors are plain contiguous `[total, H, D]` on Hopper, pointer loads otherwise. Output rows of tokens past
`cu_seqlens_q[-1]` are left unwritten, as in flash-attn.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ._checks import common_problem, device_problem, index_problem, refuse_unsupported, tensor_problem, tma_layout
from ._config import (
    INTERPRETED,
    Config,
    block_d,
    default_config,
    gluon_preferred,
    gluon_shape_problem,
    p_pack_problem,
)
from ._features import (
    GLUON_BY_DEFAULT,
    PLAIN,
    Features,
    effective,
    gluon_problem,
    kernel_args,
    parse_features,
    softcap_switches,
    varlen_gluon_meta,
)
from ._kernel import attention_fwd
from ._splits import cdiv


def varlen_problem(q, k, v, cu_seqlens_q, cu_seqlens_k) -> str | None:
    """None when the packed tensors and offsets are consistent, else why not (shapes only: no host sync)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if problem := tensor_problem(name, t, 3, "[total_tokens, H, D]"):
            return problem
    if k.shape != v.shape:
        return f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}"
    if problem := common_problem(q, k, {"q": q, "k": k, "v": v}):
        return problem
    if problem := index_problem("cu_seqlens_q", cu_seqlens_q, None, q.device):
        return problem
    if problem := index_problem("cu_seqlens_k", cu_seqlens_k, cu_seqlens_q.shape[0], q.device):
        return problem.replace("rows", "entries (as many as cu_seqlens_q)")
    if cu_seqlens_q.shape[0] < 1:
        return "cu_seqlens_q must have B + 1 >= 1 entries"
    return device_problem(q)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, softmax_scale: float | None = None,
                     causal: bool = False, *, config: Config | None = None, features: Features = PLAIN,
                     s_aux: torch.Tensor | None = None) -> torch.Tensor:
    """The launch behind `flash_attn_varlen_func`, with an optional explicit `config` (either program).
    q `[total_q, Hq, D]`, k/v `[total_k, Hkv, D]` -> out `[total_q, Hq, D]`. `features` and the sinks `s_aux` as in
    `attention` (the Triton program, or the Gluon one as `_features.py` says)."""
    if problem := varlen_problem(q, k, v, cu_seqlens_q, cu_seqlens_k):
        raise ValueError(f"flash-triton flash_attn_varlen_func: {problem}")
    # a window that keeps every key is no window (the packed totals bound every sequence's lengths)
    features = effective(features, q.shape[0], k.shape[0], bool(causal))
    if config is not None and (why := p_pack_problem(config, q.dtype, packed=True) or config.gluon and (
            gluon_problem(features, True) or gluon_varlen_unsupported(q, k, v, config))):
        raise ValueError(f"flash-triton flash_attn_varlen_func: {config.label()}: {why}")
    max_seqlen_q = int(max_seqlen_q)
    if max_seqlen_q < 0:
        raise ValueError(f"flash-triton flash_attn_varlen_func: max_seqlen_q must be >= 0, got {max_seqlen_q}")
    total_q, hq, d = q.shape
    hkv = k.shape[1]
    batch = cu_seqlens_q.shape[0] - 1
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if out.numel() == 0 or batch == 0 or max_seqlen_q == 0:
        return out
    scale = d ** -0.5 if softmax_scale is None else float(softmax_scale)
    if config is not None:
        cfg = config
    elif features.any and not GLUON_BY_DEFAULT:
        cfg = default_config(d, q.device)
    else:
        cfg = softcap_switches(_default_varlen_config(q, k, v, bool(causal)), features, d, q.dtype)
    if cfg.gluon:
        _launch_gluon_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, out, scale, bool(causal), cfg,
                             features, s_aux)
        return out
    # the Triton program's TMA reads the 2-D view [total, H*D] only; a padded head dim (80, 96): pointer loads
    use_tma = cfg.use_tma and _packed_layout(q, k, v) == "rows" and block_d(d) == d
    if cfg.use_tma != use_tma:
        cfg = dataclasses.replace(cfg, use_tma=use_tma)
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        # 2-D views [total, H*D]: a tile is BLOCK rows of one head's D columns (rows past the last sequence read 0)
        desc_q = TensorDescriptor(q, [total_q, hq * d], [hq * d, 1], [cfg.block_m, d])
        desc_k = TensorDescriptor(k, [k.shape[0], hkv * d], [hkv * d, 1], [cfg.block_n, d])
        desc_v = TensorDescriptor(v, [v.shape[0], hkv * d], [hkv * d, 1], [cfg.block_n, d])
    else:
        desc_q = desc_k = desc_v = None
    grid = (cdiv(max_seqlen_q, cfg.block_m), batch * hq)
    attention_fwd[grid](
        q, k, v, out, desc_q, desc_k, desc_v, scale * math.log2(math.e),
        0, q.stride(0), q.stride(1),
        0, k.stride(0), k.stride(1),
        0, v.stride(0), v.stride(1),
        0, out.stride(0), out.stride(1),
        hq, hq // hkv, max_seqlen_q, 0, cu_seqlens_q, cu_seqlens_k, s_aux, *kernel_args(features, scale),
        HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=bool(causal), USE_TMA=use_tma, **features.meta(),
        WARP_SPECIALIZE=cfg.warp_specialize, OVERLAP=cfg.overlap, POLY_EXP=cfg.poly_exp,
        LAZY_RESCALE=cfg.lazy_rescale, VARLEN=True, BLOCK_D=block_d(d),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def _default_varlen_config(q, k, v, causal: bool) -> Config:
    """The varlen Gluon program where it takes the tensors and was measured faster (`gluon_preferred` with unknown,
    so possibly ragged, lengths: head dim 128, and 64 when causal; TUNING.md steps 8 and 11), else the Triton one."""
    cfg = gluon_preferred(q.shape[-1], causal, 0, aligned=False)
    if cfg is not None and gluon_varlen_unsupported(q, k, v, cfg) is None:
        return cfg
    return default_config(q.shape[-1], q.device)


def _packed_layout(q, k, v) -> str | None:
    """`tma_layout` of packed `[total, H, D]` tensors: "rows" (all contiguous: 2-D `[total, H*D]`), "heads" (all
    views of contiguous `[H, total, D]` tensors, as transformers' continuous batching passes them: `[H*total, D]`),
    or None (other strides, or no rows: TMA needs a non-empty tensor)."""
    if any(t.shape[0] == 0 for t in (q, k, v)):
        return None
    return tma_layout(q[None], k[None], v[None])


def gluon_varlen_unsupported(q, k, v, cfg: Config) -> str | None:
    """None when the warp-specialized Gluon program over packed sequences (`_gluon_varlen.py`) can run these
    (already checked) tensors with `cfg`, else why not."""
    if q.device.type != "cuda" or INTERPRETED:
        return "the Gluon program needs a CUDA GPU (Gluon has no interpreter)"
    if torch.cuda.get_device_capability(q.device) != (9, 0):
        return "the Gluon program uses wgmma, which only sm_90 has"
    if not (cfg.warp_specialize and not cfg.persistent and cfg.num_warps == 4 and cfg.block_m in (128, 192)):
        return ("the varlen Gluon program is the warp-specialized one: block_m 128 (two consumer warpgroups) or 192 "
                "(three), num_warps 4, not persistent")
    layout = _packed_layout(q, k, v)
    if layout is None:
        return ("the Gluon program reads 16-byte aligned [total, H, D] tensors through TMA, all contiguous or all "
                "views of contiguous [H, total, D] ones (these have other strides)")
    return gluon_shape_problem(cfg, q.shape[-1], layout)


def gluon_feature_args(f: Features, scale: float, s_aux) -> tuple[float, tuple]:
    """The varlen Gluon program's qk_scale (cap·log2(e) under soft-capping: it caps the raw scores itself) and its
    runtime feature arguments (Sinks, softcap_in, win_left, win_right)."""
    cap_in, cap_out, win_left, win_right = kernel_args(f, scale)
    return (cap_out if f.softcap > 0 else scale * _LOG2E), (s_aux, cap_in, win_left, win_right)


_LOG2E = math.log2(math.e)


def _launch_gluon_varlen(q, k, v, cu_q, cu_k, max_seqlen_q, out, scale: float, causal: bool, cfg: Config,
                         f: Features = PLAIN, s_aux=None) -> None:
    from ._gluon import tma_desc
    from ._gluon_varlen import attention_fwd_sm90_ws_varlen

    d = q.shape[-1]
    hq, hkv = q.shape[1], k.shape[1]
    heads = _packed_layout(q, k, v) == "heads"  # [H*total, D]; else [total, H*D]
    grid = (cdiv(max_seqlen_q, cfg.block_m), (cu_q.shape[0] - 1) * hq)  # 80, 96: zero-padded 128-wide tiles
    qk_scale, features = gluon_feature_args(f, scale, s_aux)
    attention_fwd_sm90_ws_varlen[grid](
        tma_desc(q[None], 64, heads),  # one 64-row Q slice per consumer warpgroup
        tma_desc(k[None], cfg.block_n, heads),
        tma_desc(v[None], cfg.block_n, heads), out, out.stride(0),
        qk_scale, hq, hq // hkv, cu_q, cu_k, q.shape[0], k.shape[0], *features, 1,  # L2_HEADS: not LPT
        HEAD_DIM=block_d(d), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, CAUSAL=causal,
        num_warps=cfg.num_warps, HEADS_IN_ROWS=heads, HEAD_DIM_VALID=d, JOINT_RELEASE=cfg.joint_release,
        **varlen_gluon_meta(f, cfg),
    )


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, s_aux=None):
    """Packed variable-length attention forward, as flash-attn's `flash_attn_varlen_func`.

    q `[total_q, Hq, D]`, k/v `[total_k, Hkv, D]` (Hq a multiple of Hkv), `cu_seqlens_q`/`cu_seqlens_k` `[B + 1]`
    int32 cumulative lengths, `max_seqlen_q` an int >= the longest query sequence (`max_seqlen_k` is accepted and
    not needed). Returns out `[total_q, Hq, D]`. Causal is bottom-right aligned per sequence. `deterministic` is
    accepted (the forward always is); `softcap`, `window_size` and `s_aux` as flash-attn computes them
    (`_features.py`); dropout, ALiBi, probabilities and a paged `block_table` raise ValueError.
    """
    refuse_unsupported("flash_attn_varlen_func", dropout_p=dropout_p, alibi_slopes=alibi_slopes,
                       return_attn_probs=return_attn_probs, block_table=block_table)
    f = parse_features("flash_attn_varlen_func", q, softcap, window_size, s_aux)
    return varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, causal, features=f,
                            s_aux=s_aux)
