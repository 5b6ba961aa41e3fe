"""Model features of flash-attn's API that change the attention itself: logit soft-capping, a sliding window, sinks.

Why: real model families need them. Gemma 2 caps its logits (`softcap`: cap·tanh(scale·q·kᵀ / cap)) and, like
Mistral and Gemma 3, runs some layers on a sliding window; gpt-oss adds a learned per-head "sink" logit to every
softmax denominator (`s_aux`). transformers hands them to a flash-attn kernel as `softcap`, `window_size` and
`s_aux`, and a kernel that refuses them cannot serve those models.

Semantics are flash-attn's (`flash_attn_interface.py`): `window_size=(left, right)`, -1 for an unbounded side, keeps
key j for query i when i' - left <= j <= i' + right, with i' = i + Sk - Sq the query's position (bottom-right, as
causal); causal and a window combine. `s_aux` is `[Hq]` (any float dtype), the sink's logit, unscaled: the row's
probabilities are exp(s_ij) / (Σ_j exp(s_ij) + exp(s_aux[h])), so a row that sees no key is 0. The programs take
them as constexpr switches (`SOFTCAP`, `WINDOW`, `SINKS`: the plain path compiles exactly as before) and runtime
values (`kernel_args`).

Which programs take them: the Triton prefill program (dense and varlen), the split-KV decode program (dense and
paged caches) and, of the sm_90 Gluon programs, the warp-specialized varlen one (`_gluon_varlen.py`; it also runs
dense calls), the one-warpgroup one a window and sinks (`_gluon.attention_fwd_sm90`, aligned Sq <= Sk) and the
dense warp-specialized one sinks alone. An explicit config naming another Gluon program with a feature is refused
with that reason.

Where a call with a feature goes by default: the program the plain call would take when that is the Triton or the
decode program; where the plain call takes a Gluon program, the varlen Gluon program (`GLUON_BY_DEFAULT`), faster
than the Triton program with every feature on the GPU (its features match the fp64 oracle at head dims 64/128/256;
softcap 598 µs against the Triton program's 875 at 2x4096, head dim 128, on an H100; TUNING.md step 18,
`docs/results/kernel-features/`); FLASH_TRITON_GLUON_FEATURES=0 keeps them on the Triton program. An explicit Gluon
varlen config takes it either way. Before any of that, `effective` drops a window side that keeps every key (a
prompt shorter than the window): such a call is plain attention and runs as one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass

import torch

_UNBOUNDED = 1 << 30  # a window side past every key: -1 in flash-attn's API
GLUON_BY_DEFAULT = os.environ.get("FLASH_TRITON_GLUON_FEATURES") != "0"  # read once, when the module is loaded
_LOG2E = math.log2(math.e)
# The largest softcap the varlen Gluon program runs without a running max (`CAP_BOUND`, `varlen_gluon_meta`). A capped logit lies in [-cap, cap]: against the fixed reference r = max(cap - 30, 0), every exp lies in
# [e^(-cap-r), e^(cap-r)], inside fp32's and bf16's normal range (e^-87.3 ... e^88.7) with room for the sums
# (Sk·|v| up to ~3e25 under e^30) for any cap up to 55. Gemma 2 caps at 50, Grok at 30.
CAP_BOUND_MAX = 55.0


@dataclass(frozen=True)
class Features:
    """What a call asks beyond plain attention (the sinks tensor itself travels with the call)."""

    softcap: float = 0.0
    window: tuple[int, int] = (-1, -1)
    sinks: bool = False

    @property
    def any(self) -> bool:
        return self.softcap > 0 or self.window != (-1, -1) or self.sinks

    def meta(self) -> dict:
        """The programs' constexpr switches."""
        return dict(SOFTCAP=self.softcap > 0, WINDOW=self.window != (-1, -1), SINKS=self.sinks)

    def label(self) -> str:
        bits = [f"softcap {self.softcap:g}"] if self.softcap > 0 else []
        bits += [f"window {self.window}"] if self.window != (-1, -1) else []
        return ", ".join(bits + (["sinks"] if self.sinks else [])) or "none"


PLAIN = Features()
PLAIN_ARGS = (1.0, 1.0, _UNBOUNDED, _UNBOUNDED)  # `kernel_args(PLAIN, any scale)`


def is_plain(softcap, window_size, s_aux) -> bool:
    """Whether flash-attn's feature arguments are all at their defaults (a cheap test before `parse_features`)."""
    return (s_aux is None and (softcap is None or (type(softcap) in (float, int) and softcap == 0))
            and (window_size is None or (type(window_size) is tuple and window_size == (-1, -1))))


def parse_features(entry: str, q: torch.Tensor, softcap=0.0, window_size=(-1, -1), s_aux=None) -> Features:
    """The call's `Features`, or ValueError naming the argument that is malformed."""
    def bad(arg: str, why: str) -> ValueError:
        return ValueError(f"flash-triton {entry}: {arg} {why}")

    cap = 0.0 if softcap is None else softcap
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap) or cap < 0:
        raise bad(f"softcap={softcap!r}", "must be a finite number >= 0 (0 means none)")
    window = (-1, -1) if window_size is None else tuple(window_size)
    if len(window) != 2 or not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window):
        raise bad(f"window_size={window_size!r}", "must be two ints >= -1 (left, right; -1 means unbounded)")
    if s_aux is not None:
        hq = q.shape[-2] if isinstance(q, torch.Tensor) and q.dim() >= 2 else "Hq"
        if not isinstance(s_aux, torch.Tensor) or not s_aux.is_floating_point():
            raise bad("s_aux", f"must be a float tensor of the {hq} query heads' sink logits")
        if s_aux.dim() != 1 or s_aux.shape[0] != hq:
            raise bad("s_aux", f"must be [Hq] = [{hq}], got shape {tuple(s_aux.shape)}")
        if s_aux.device != q.device:
            raise bad("s_aux", f"is on {s_aux.device}, q on {q.device}")
        if s_aux.stride(0) != 1:
            raise bad("s_aux", "must be contiguous")
    f = Features(float(cap), window, s_aux is not None)
    return PLAIN if f == PLAIN else f  # the one PLAIN: callers test `is PLAIN`


@functools.lru_cache(maxsize=4096)
def effective(f: Features, sq: int, sk: int, causal: bool) -> Features:
    """`f` without the window sides that keep every key anyway, for `sq` queries over at most `sk` keys: a left side
    >= sk - 1 (no query sits past key sk - 1), a right side >= sq - 1 (the first query's position is sk - sq), or any
    right side under causal (the diagonal cuts first). Gemma's and Mistral's sliding layers on a prompt shorter than
    their window then run the plain programs (no masked loop; the Gluon ones by default); PLAIN when nothing is left."""
    if f.window == (-1, -1):
        return f
    left, right = f.window
    if left >= sk - 1:
        left = -1
    if right >= 0 and (causal or right >= sq - 1):
        right = -1
    g = dataclasses.replace(f, window=(left, right))
    return PLAIN if g == PLAIN else g


def kernel_args(f: Features, scale: float) -> tuple[float, float, int, int]:
    """(softcap_in, softcap_out, win_left, win_right) for the programs: logits = tanh(qk·softcap_in)·softcap_out in
    base 2 (log2(e) folded in), window sides with -1 as a bound past every key. `PLAIN_ARGS` for `PLAIN` without
    computing them: every launch asks."""
    if f is PLAIN:
        return PLAIN_ARGS
    cap_in, cap_out = (scale / f.softcap, f.softcap * _LOG2E) if f.softcap > 0 else (1.0, 1.0)
    left, right = (_UNBOUNDED if w < 0 else w for w in f.window)
    return cap_in, cap_out, left, right


def varlen_gluon_meta(f: Features, cfg) -> dict:
    """The varlen Gluon program's constexpr switches for a call with `f` on the `Config` `cfg`: `meta` plus
    `CAP_BOUND`, soft-capping without a running max (`cfg.cap_bound` and a cap up to `CAP_BOUND_MAX`), and with it
    `CAP_POLY` (`cfg.cap_poly`: one exp2 in that many on the FMA pipes; 0 without the bound), and `P_PACK_ALU`
    (`cfg.p_pack_alu`: P rounded to bf16 on the integer pipe; `_config.p_pack_problem` refuses it where it cannot
    apply), and `V_WAIT_EARLY` (`cfg.v_wait_early`)."""
    bound = cfg.cap_bound and 0 < f.softcap <= CAP_BOUND_MAX
    return dict(f.meta(), CAP_BOUND=bound, CAP_POLY=cfg.cap_poly if bound else 0, P_PACK_ALU=cfg.p_pack_alu,
                V_WAIT_EARLY=cfg.v_wait_early)


def softcap_switches(cfg, f: Features, head_dim: int, dtype: torch.dtype):
    """The default varlen Gluon config `cfg` for a call with `f`, with the bounded softcap's switches where they
    were measured faster: softcap alone (no window, no sinks) at head dims 80-128 (128-wide tiles) takes one exp2
    in four as a polynomial on the FMA pipes (`Config.cap_poly`) and, in bf16, P rounded on the integer pipe
    (`Config.p_pack_alu`): softcap 30 at 2x4096, head dim 128, 598.6 -> 575.0 µs on an H100 (0.78 -> 0.81 of the
    plain call; TUNING.md step 22). With a window and sinks beside the cap the same switches lost (328.1 -> 346.6
    µs), and at head dim 256 (1.02 -> 0.97): there the default stays. A config named by the caller is never
    changed."""
    if not (cfg.gluon and cfg.varlen and cfg.cap_bound and 80 <= head_dim <= 128 and 0 < f.softcap <= CAP_BOUND_MAX
            and f.window == (-1, -1) and not f.sinks):
        return cfg
    return dataclasses.replace(cfg, cap_poly=4, p_pack_alu=dtype == torch.bfloat16)


SMALL_WINDOW = 1024  # keys a window spans (left + right) up to which the one-warpgroup program takes it by default
# (TUNING.md step 28, an H100: at 1024 keys it took 534 / 662 µs against the varlen program's 603 / 881 at head dims
# 128 / 64; at 2048 it lost, 1,013 against 994)


def small_window(f: Features, causal: bool) -> bool:
    """A sliding window spanning at most `SMALL_WINDOW` keys per row, without softcap (sinks may come with it): by
    default the one-warpgroup Gluon program's (`_config.GLUON_WINDOW`) where the lengths are multiples of 64 and
    Sq <= Sk. Under causal an unbounded right side (what `effective` leaves of any right side) adds nothing."""
    left, right = f.window
    if f.softcap > 0 or left < 0 or (right < 0 and not causal):
        return False
    return left + max(right, 0) <= SMALL_WINDOW


def sinks_only(f: Features) -> bool:
    """Sinks and no other feature: the dense warp-specialized Gluon program computes those too."""
    return f.sinks and f.softcap <= 0 and f.window == (-1, -1)


def gluon_problem(f: Features, varlen: bool, ws: bool = False, one_wg: bool = False,
                  persistent: bool = False) -> str | None:
    """Why this Gluon program cannot take these features (None: plain attention, the varlen program, sinks alone on
    the dense warp-specialized one, `ws`: not persistent, or a window and sinks without softcap on the one-warpgroup
    one, `one_wg`, and on the persistent one, `persistent`)."""
    if not f.any or varlen or (ws and sinks_only(f)) or ((one_wg or persistent) and f.softcap <= 0):
        return None
    return (f"of the Gluon programs only the warp-specialized varlen one computes every model feature, the "
            f"one-warpgroup and the persistent ones a window and sinks, the dense warp-specialized one sinks alone "
            f"(asked for {f.label()}); pick the varlen one with varlen=True")
