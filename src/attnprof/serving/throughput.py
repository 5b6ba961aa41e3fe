"""Prefill and decode tokens per second per attention implementation, and the share of each step spent in attention.

Why both numbers: a kernel that makes attention 10× faster only makes the model faster by as much time as attention
took. Prefill at long context is attention-heavy (the S² term), decode at small batch is dominated by reading the
weights once per token, so the same kernel gives very different end-to-end gains. Next to every measured tokens/s we
put the attention share of the step (from the profiler: the kernels launched inside the model's attention function,
classified by role with `profiling.classify`) so the gain can be checked against Amdahl's law:
predicted speed-up = 1 / (1 − share_eager · (1 − attention_time_impl / attention_time_eager)).

Prefill is one forward over `[B, S]` prompt tokens that builds the KV cache (logits for the last position only, as a
server does). Decode is `model.generate` with the KV cache: tokens/s is counted from the output ids and timed between
the first and the last new token, so the prefill is not in it. The same call is timed twice: the first pass meets
its KV lengths for the first time (a backend that builds something per new shape, such as cuDNN's execution plan
per sequence length, pays for it there), the repeat pass meets them again. Decode is profiled twice as well: warm
steps over lengths already seen, and cold steps of a prompt whose KV lengths this point never used.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch.profiler import record_function

from attnprof.errors import CheckFailed
from attnprof.measure.memory import cuda_peak
from attnprof.measure.timing import percentile, time_call
from attnprof.serving.share import STEP_RANGE, Share, profile_share, profiled_share


@dataclass(frozen=True)
class Point:
    """One implementation at one (batch, context): tokens counted from real outputs, and how long they took."""

    impl: str
    mode: str  # "prefill" | "decode"
    batch: int
    context: int
    status: str = "ok"  # an `attnprof.run.Status` value: ok | rejected | oom | error
    reason: str | None = None
    new_tokens: int = 0  # decode: tokens generated per sequence
    tokens: int = 0  # counted from the outputs
    seconds: float = 0.0  # the time those tokens took
    step_ms: float = 0.0  # one forward step (prefill) or one decode step (first pass), median
    itl_ms: dict[str, float] = field(default_factory=dict)  # decode, first pass: time between tokens, p50 / p99
    # decode, repeat pass: the identical `generate` again, over KV lengths the first pass already met
    itl_repeat_ms: dict[str, float] = field(default_factory=dict)
    share: Share | None = None  # profiled steps over shapes already seen (warm)
    # decode: profiled steps of a `cold_context`-token prompt, whose KV lengths this point had not met before
    cold_share: Share | None = None
    cold_context: int | None = None
    peak_mib: float | None = None
    loop: str = "as-shipped"  # `serving.loops.LOOPS`
    cold_s: float | None = None  # production: the first call (compile, graph capture) in seconds
    graph_breaks: int | None = None  # production: dynamo's graph breaks while compiling the step (0: one graph)
    prefill_chunk: int | None = None  # production decode: the prompt prefilled in pieces of this many tokens
    kv_dtype: str | None = None  # production decode over an FP8 static cache ("fp8", "fp8_e5m2"); None: the model's

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def attention_share(self) -> float | None:
        """Attention time over the step: on a GPU over the timed wall time of the step (idle gaps included), on a
        CPU over the profiled step's op time (the same run, so noise from other processes cancels)."""
        if self.share is None:
            return None
        whole = self.share.busy_ms if self.share.basis == "cpu-ops" else self.step_ms
        return min(1.0, self.share.attention_ms / whole) if whole > 0 else None

    def to_json(self) -> dict:
        return {"impl": self.impl, "loop": self.loop, "mode": self.mode, "batch": self.batch, "context": self.context,
                "status": self.status, "reason": self.reason, "new_tokens": self.new_tokens, "tokens": self.tokens,
                "seconds": self.seconds, "tokens_per_s": self.tokens_per_s, "step_ms": self.step_ms,
                "itl_ms": self.itl_ms, "itl_repeat_ms": self.itl_repeat_ms, "attention_share": self.attention_share,
                "share": self.share.to_json() if self.share else None,
                "cold_share": self.cold_share.to_json() if self.cold_share else None,
                "cold_context": self.cold_context, "peak_mib": self.peak_mib, "cold_s": self.cold_s,
                "graph_breaks": self.graph_breaks, "prefill_chunk": self.prefill_chunk, "kv_dtype": self.kv_dtype}


def amdahl(share_base: float, attention_base_ms: float, attention_new_ms: float) -> float:
    """End-to-end speed-up predicted when only the attention part of a step changes."""
    if attention_base_ms <= 0:
        return 1.0
    return 1.0 / (1.0 - share_base * (1.0 - attention_new_ms / attention_base_ms))


# ------------------------------------------------------------------------------------ implementations to compare --

DEFAULT_IMPLS = "eager,sdpa,kernel"


def resolve_impls(spec: str | None, device: str, *, config=None, dtype: str = "bf16", context: int = 1024) -> list:
    """Names → `models.attention.AttentionImpl`s (eager, sdpa, sdpa-<backend>, flex_attention, kernel, pkg.mod:fn),
    eager first: it is the baseline every gain is measured against. An unknown name is a UsageError.

    Without `spec`: eager, sdpa, and the stage-four kernel when it can run here. Asked for by name, an implementation
    that cannot run comes back rejected with the reason (a row in the report), never silently replaced. `config` (the
    model's) lets every implementation be refused up front with its own reason (`Variant.supports`, SDPA's checks)."""
    from attnprof.models import attention, attention_workload
    from attnprof.models.features import refuse_not_taken

    workload = None
    if config is not None:
        workload = attention_workload(config, batch=1, seq=context, dtype=dtype, device=device)
    impls = attention.resolve_impls(spec or DEFAULT_IMPLS, device, workload=workload)
    if config is not None:  # softcap, sliding windows, sinks: a variant's call cannot take them
        impls = refuse_not_taken(impls, config)
    out = [impl for impl in impls if spec or impl.rejected is None]
    out.sort(key=lambda i: i.name != "eager")
    return out


# ------------------------------------------------------------------------------------------- prefill and decode --

def _prompt(config, batch: int, context: int, device: str, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, config.vocab_size, (batch, context), generator=gen).to(device)  # [B, S]


def measure_prefill(model, impl: str, *, batch: int, context: int, device: str, seed: int = 0, reps: int = 5,
                    share: bool = True) -> Point:
    """One forward over `[batch, context]` prompt tokens that fills the KV cache; tokens/s from the median call."""
    ids = _prompt(model.config, batch, context, device, seed)  # [B, S]

    def step():
        return model(input_ids=ids, use_cache=True, logits_to_keep=1)

    with torch.inference_mode():
        with cuda_peak(device, empty_cache=True) as peak:
            out = step()
            cached = _cache_of(out).get_seq_length()
            if tuple(out.logits.shape[:2]) != (batch, 1) or cached != context:
                raise CheckFailed(f"prefill {impl}: cache holds {cached} tokens and logits {tuple(out.logits.shape)} "
                                  f"for a [{batch}, {context}] prompt")
            bad = int((~torch.isfinite(out.logits)).sum())
            if bad:  # a broken attention must not pass as a fast one: the point is an error with this reason
                raise RuntimeError(f"prefill {impl}: non-finite output: {bad} NaN/Inf logits of {out.logits.numel()}")
            del out
            timing = time_call(step, device, warmup=1, reps=reps)
        prof = profile_share(step, model, device, steps=1) if share else None
    tokens = batch * cached
    return Point(impl=impl, mode="prefill", batch=batch, context=context, tokens=tokens,
                 seconds=timing.p50 / 1e3, step_ms=timing.p50, share=prof, peak_mib=peak.total_mib)


class _TokenClock:
    """A `generate` streamer that only notes when each new token reached the host (the put is after a sync)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.first_put = True

    def put(self, value) -> None:
        if self.first_put:  # generate hands over the prompt first
            self.first_put = False
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def measure_decode(model, impl: str, *, batch: int, context: int, new_tokens: int, device: str, seed: int = 0,
                   share: bool = True) -> Point:
    """`model.generate` (greedy, KV cache) of `new_tokens` per row after a `[batch, context]` prompt.

    After a 2-token warm-up (KV lengths `context`, `context + 1`) the call is timed twice with the same prompt: the
    first pass meets KV lengths up to `context + new_tokens - 1` for the first time; tokens/s and `itl_ms` come from
    it. The repeat pass (`itl_repeat_ms`) meets the same lengths again, so any cost paid once per new shape is gone
    from it. With `share`, 3 warm decode steps (lengths already seen) and 3 cold ones (a prompt of `cold_context`
    tokens: lengths this point never used) are profiled after the timing."""
    ids = _prompt(model.config, batch, context, device, seed)  # [B, S]
    with torch.inference_mode():
        with cuda_peak(device, empty_cache=True) as peak:
            _generate(model, ids, 2)  # warm-up, same prompt
            first = _timed_decode(model, impl, ids, new_tokens)
        repeat = _timed_decode(model, impl, ids, new_tokens)
        prof = cold = cold_len = None
        if share:
            prof = _decode_share(model, ids, device)
            cold_len = cold_context(context, new_tokens, DECODE_STEPS,
                                    getattr(model.config, "max_position_embeddings", None))
            if cold_len is not None:
                cold_ids = _prompt(model.config, batch, cold_len, device, seed)  # [B, S_cold]
                cold = _decode_share(model, cold_ids, device)
    gaps, again = _gaps_ms(first), _gaps_ms(repeat)
    tokens = batch * new_tokens - batch  # the first new token is the prefill's: not timed as decode
    return Point(impl=impl, mode="decode", batch=batch, context=context, new_tokens=new_tokens, tokens=tokens,
                 seconds=first[-1] - first[0], step_ms=percentile(gaps, 50),
                 itl_ms={"p50": percentile(gaps, 50), "p99": percentile(gaps, 99)},
                 itl_repeat_ms={"p50": percentile(again, 50), "p99": percentile(again, 99)},
                 share=prof, cold_share=cold, cold_context=cold_len, peak_mib=peak.total_mib)


DECODE_STEPS = 3  # decode steps per profile


def cold_context(context: int, new_tokens: int, steps: int, max_positions: int | None) -> int | None:
    """A prompt length whose `steps` profiled decode steps meet KV lengths the point's earlier calls never did.

    Those calls decoded over KV lengths `context + 1` … `context + new_tokens - 1`. Past them, `context + new_tokens +
    1`, when the model allows the `steps + 1` tokens after it; else below the prompt, where the decode steps never went
    (the prefill's query length differs from decode's, so its shapes are not these); None when neither fits."""
    longer = context + new_tokens + 1
    if not max_positions or longer + steps + 1 <= max_positions:
        return longer
    shorter = context - steps - 2  # its decode steps reach context - 1 at most
    return shorter if shorter >= 1 else None


def _generate(model, ids: torch.Tensor, new: int, streamer=None):
    """Greedy `generate` of exactly `new` tokens per row after `ids` [B, S] (no padding)."""
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                          do_sample=False, pad_token_id=0, eos_token_id=None, streamer=streamer)


def _timed_decode(model, impl: str, ids: torch.Tensor, new_tokens: int) -> list[float]:
    """One `generate` of `new_tokens`; the host time at which each new token arrived, checked against the output."""
    clock = _TokenClock()
    out = _generate(model, ids, new_tokens, streamer=clock)
    generated = out[:, ids.shape[1]:]  # [B, new]
    if generated.shape != (ids.shape[0], new_tokens) or len(clock.times) != new_tokens:
        raise CheckFailed(f"decode {impl}: asked for {new_tokens} new tokens per row, got "
                          f"{tuple(generated.shape)} ({len(clock.times)} streamed)")
    return clock.times


def _gaps_ms(times: list[float]) -> list[float]:
    return [(b - a) * 1e3 for a, b in zip(times, times[1:], strict=False)]


class _StepMarks:
    """A `generate` streamer that wraps the time between consecutive new tokens in `record_function(STEP_RANGE)`:
    the profiled steps are then the very decode steps that `generate` times (mask update, logits processing,
    cache bookkeeping included), not a hand-written loop that might take another path."""

    def __init__(self, steps: int) -> None:
        self.steps = steps  # complete ranges wanted: one per gap between new tokens
        self.seen = -1  # puts so far, the prompt's not counted
        self.open = None

    def put(self, value) -> None:
        self.seen += 1
        if self.seen == 0:  # the prompt
            return
        if self.open is not None:
            self.open.__exit__(None, None, None)
            self.open = None
        if self.seen <= self.steps:  # a range from this token to the next
            self.open = record_function(STEP_RANGE)
            self.open.__enter__()

    def end(self) -> None:
        if self.open is not None:
            self.open.__exit__(None, None, None)
            self.open = None


def _decode_share(model, ids: torch.Tensor, device: str, steps: int = DECODE_STEPS) -> Share:
    """Profile `steps` decode steps of a real `generate` call after the prompt `ids` [B, S]."""
    marks = _StepMarks(steps)
    return profiled_share(lambda: _generate(model, ids, steps + 1, streamer=marks), model, device, steps)


def _cache_of(out):
    """The KV cache of a forward's output: `cache` from transformers 5.2x, `past_key_values` before."""
    cache = out.get("cache")
    return cache if cache is not None else out.get("past_key_values")
