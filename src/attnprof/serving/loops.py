"""The two serving loops `attnprof serve` measures, as data: **as-shipped** and **production**.

- `as-shipped`: what a default transformers user gets — `generate` with the dynamic cache, continuous batching
  (`init_continuous_batching`) with its defaults (no CUDA graphs for eager/sdpa: they need a mask).
- `production`: decode captured in CUDA graphs, the way vLLM/SGLang/transformers' own serving run it — `generate`
  with `cache_implementation="static"` and `CompileConfig(mode="reduce-overhead")` (inductor's CUDA graphs), and
  continuous batching with `ContinuousBatchingConfig(use_cuda_graph=True)` and its paged cache.

Every row carries its loop's name. A loop that cannot run here is a row with the reason (`unavailable`), never the
other loop under its name: CUDA graphs need a CUDA device ("no CUDA graphs on cpu"); a transformers without
`CompileConfig` or `use_cuda_graph` says which option it lacks.

Production decode is timed as `(t(N2) − t(N1)) / (N2 − N1)` over whole `generate` calls (the compiled loop streams
tokens a step late, so a streamer's gaps are not its step time), median of `reps` pairs after two warm calls that
compile and capture; the first call's seconds are reported apart (the cold part).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch

LOOPS = ("as-shipped", "production")
KV_SUFFIX = " (kv "  # a row over an FP8 static cache is named "<impl> (kv fp8)" (`kv_row_name`)


def kv_row_name(impl: str, kv_dtype: str) -> str:
    return f"{impl}{KV_SUFFIX}{kv_dtype})"


def parse_loops(text: str) -> list[str]:
    from attnprof.errors import UsageError

    loops = [x.strip() for x in str(text).split(",") if x.strip()]
    bad = [x for x in loops if x not in LOOPS]
    if bad or not loops:
        raise UsageError(f"--loop {text!r}: choose from {', '.join(LOOPS)} (comma-separated)")
    return list(dict.fromkeys(loops))


def unavailable(loop: str, mode: str, device: str) -> str | None:
    """Why `loop` cannot run `mode` here (None when it can)."""
    if loop != "production":
        return None
    if not device.startswith("cuda"):
        return ("no CUDA graphs on cpu: the production loop captures decode in CUDA graphs (static cache + "
                "torch.compile reduce-overhead, continuous batching use_cuda_graph); run it on a GPU")
    import transformers

    if mode == "decode":
        try:
            from transformers import CompileConfig  # noqa: F401
        except ImportError:
            return f"transformers {transformers.__version__} has no CompileConfig (static cache + compile)"
    if mode == "continuous":
        from transformers import ContinuousBatchingConfig

        if "use_cuda_graph" not in {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}:
            return (f"transformers {transformers.__version__}'s ContinuousBatchingConfig has no use_cuda_graph: "
                    "continuous batching cannot capture CUDA graphs here")
    return None


def _generation_config(new: int, max_len: int, compile_: bool, backend: str = "inductor", *, check: bool = False,
                       prefill_chunk: int | None = None, own_cache: bool = False):
    from transformers import GenerationConfig

    kw = dict(do_sample=False, max_new_tokens=new, min_new_tokens=new, eos_token_id=None, pad_token_id=0)
    if not own_cache:  # else the caller passes its static cache (past_key_values)
        kw.update(cache_implementation="static", max_cache_len=max_len)  # one KV length for every call
    if prefill_chunk:  # transformers' chunked prefill: the prompt in pieces of this many tokens
        kw["prefill_chunk_size"] = prefill_chunk
    if check:  # the untimed first call keeps its logits: a NaN (a mask the kernel refused inside the graph) fails
        kw.update(return_dict_in_generate=True, output_logits=True)
    if compile_:
        from transformers import CompileConfig

        kw["compile_config"] = CompileConfig(backend=backend, mode="reduce-overhead" if backend == "inductor" else None)
        kw["compile_config"]._compile_all_devices = True  # a CPU compiles too when asked (tests, `backend="eager"`)
    else:
        kw["disable_compile"] = True  # static cache alone (the CPU plumbing test; a GPU would compile by itself)
    return GenerationConfig(**kw)


def measure_static_decode(model, impl: str, *, batch: int, context: int, new_tokens: int, device: str,
                          seed: int = 0, reps: int = 3, compile_: bool = True, backend: str = "inductor",
                          prefill_chunk: int | None = None, kv_dtype: str | None = None, share: bool = False):
    """The production `generate`: static cache (+ compile reduce-overhead); ms/token from whole calls (see above).
    `kv_dtype` "fp8"/"fp8_e5m2": the static cache is `models.fp8_cache.Fp8StaticCache` (FP8 bytes, reset before
    each call), which only an implementation reading FP8 can attend over (serve --kv-dtype).

    A number from a step that did not run as one compiled graph is not a production number: when dynamo hits its
    recompile limit during the calls (it then runs the function unfused, as a graph-breaking attention did at batch
    16 on the H200: 0.25x SDPA), or the first call's logits are not finite, the point fails (CheckFailed) with the
    reason. Graph breaks are counted into the point (`graph_breaks`). `prefill_chunk` (`memory_fit.prefill_chunk`):
    the prompt is prefilled in pieces of that many tokens, so a batch whose decode fits but whose one-shot prefill
    would not is still measured; ms/token is the difference of two calls, so the prefill's cost cancels out. With
    `share`, one more pair of calls runs under the profiler (`serving.share.production_share`): where a decode step's
    time goes, kernel by kernel, and the fused attention kernels' part of it."""
    from torch._dynamo.utils import counters

    from attnprof.errors import CheckFailed
    from attnprof.run import recompile_limit_hits
    from attnprof.serving.throughput import Point, _prompt

    n2 = new_tokens
    n1 = max(2, n2 // 4)
    if n2 - n1 < 1:
        raise CheckFailed(f"decode {impl} production: --new-tokens {n2} is too few to time (needs >= 3)")
    ids = _prompt(model.config, batch, context, device, seed)  # [B, S]
    max_len = context + n2 + 8
    cache = None
    if kv_dtype:
        from attnprof.models.fp8_cache import Fp8StaticCache, cache_argument

        # V head-dim-contiguous, as K: stored keys-contiguous (`v_keys`, the layout the kernel's FP8 decode reads
        # fastest in its own benchmark) serve's step took 2.2 ms of attention at batch 16 x 8k on the H100, against
        # 1.3 ms for this layout and 1.5 for the bf16 cache (docs/results/kernel-fp8-decode)
        cache = Fp8StaticCache(model.config, max_cache_len=max_len, kv_dtype=kv_dtype)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    def call(new: int, check: bool = False) -> float:
        own = {}
        if cache is not None:
            cache.reset()
            own[cache_argument(model)] = cache
        sync()
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids),
                             generation_config=_generation_config(new, max_len, compile_, backend, check=check,
                                                                 prefill_chunk=prefill_chunk, own_cache=bool(own)),
                             **own)
        sync()
        seconds = time.perf_counter() - t
        if check:
            bad = sum(int((~torch.isfinite(x)).sum()) for x in out.logits)
            if bad:
                raise CheckFailed(f"decode {impl} production: {bad} non-finite logits in the first call (a NaN "
                                  "output of the attention inside the compiled step)")
            out = out.sequences
        if tuple(out.shape) != (batch, context + new):
            raise CheckFailed(f"decode {impl} production: asked for {new} new tokens per row, got "
                              f"{out.shape[1] - context}")
        return seconds

    if compile_:  # a fresh compile per row: dynamo does not guard on SDPA's backend flags
        torch._dynamo.reset()
        model.__dict__.pop("_compiled_call", None)
    breaks_before = sum(counters["graph_break"].values())
    # no inference_mode here: generate runs under no_grad itself, and inference tensors in a static cache that
    # inductor's CUDA graphs captured are a known source of trouble (the H200 probe's recipe ran without it)
    with recompile_limit_hits() as hits:  # which also puts back a limit a chunked prefill raised (5.17: 64)
        first = call(n2, check=True)  # compile + graph capture, cuDNN plans: the cold part
        call(n2)
        per_token = []
        for _ in range(reps):
            a, b = call(n1), call(n2)
            per_token.append((b - a) / (n2 - n1))
        if share:  # after the timed calls: the profiler's overhead stays out of the timings
            from attnprof.serving.share import production_share

            try:
                prof = production_share(lambda: call(n1), lambda: call(n2), n2 - n1, device)
            except Exception as e:  # the profile is extra: a failure costs its column, said here, not the row
                import sys

                prof = None
                print(f"attnprof serve: decode {impl} production: no attention share ({type(e).__name__}: "
                      f"{str(e).splitlines()[0][:200] if str(e) else ''}); the row keeps its timing", file=sys.stderr)
    if hits:
        raise CheckFailed(f"decode {impl} production: dynamo hit its recompile limit ({hits[0]}), so the step ran "
                          "unfused: not a production number")
    s = statistics.median(per_token)
    if s <= 0:
        raise CheckFailed(f"decode {impl} production: timing noise, t(N2) <= t(N1); raise --new-tokens")
    ms = s * 1e3
    tokens = batch * (n2 - n1)
    return Point(impl=impl, mode="decode", batch=batch, context=context, new_tokens=n2, tokens=tokens,
                 seconds=s * (n2 - n1), step_ms=ms,
                 itl_ms={"p50": ms, "p99": max(per_token) * 1e3, "min": min(per_token) * 1e3,
                         "max": max(per_token) * 1e3},
                 itl_repeat_ms={}, cold_s=first, loop="production", prefill_chunk=prefill_chunk,
                 share=prof if share else None,
                 graph_breaks=sum(counters["graph_break"].values()) - breaks_before if compile_ else None,
                 kv_dtype=kv_dtype)


def _gain_range(base: dict, row: dict) -> tuple[float, float] | None:
    """(lowest, highest) speed-up of `row` over `base` from their per-rep ms/token spread (production decode)."""
    b, r = base.get("itl_ms") or {}, row.get("itl_ms") or {}
    if not all(k in d and d[k] > 0 for d in (b, r) for k in ("min", "max")):
        return None
    return b["min"] / r["max"], b["max"] / r["min"]


def comparisons(loop: str, decode: list[dict], stream: list[dict]) -> str:
    """Per loop: each implementation's gain over eager and over sdpa, computed from the rows; a decode gain whose
    rep spread overlaps 1.0× is called inconclusive."""
    bits = []
    cells: dict[tuple[int, int], dict[str, dict]] = {}  # (context, batch) -> impl -> row
    for r in decode:
        if r["status"] == "ok":
            cells.setdefault((r["context"], r["batch"]), {})[r["impl"]] = r
    named = len({context for context, _ in cells}) > 1  # several contexts: each cell says its own
    for (context, batch), rows in sorted(cells.items()):
        where = f"decode batch {batch}" + (f" context {context}" if named else "")
        for impl, r in rows.items():
            if impl == "eager":
                continue
            said = []
            for base in ("eager", "sdpa", *([impl.split(KV_SUFFIX)[0]] if KV_SUFFIX in impl else [])):
                b = rows.get(base)
                if b is None or base == impl or not b["tokens_per_s"]:
                    continue
                g = r["tokens_per_s"] / b["tokens_per_s"]
                span = _gain_range(b, r)
                verdict = " (inconclusive: the reps' spread overlaps 1.0×)" if span and span[0] <= 1.0 <= span[1] \
                    else ""
                said.append(f"{g:.2f}× {base}" + (f" [{span[0]:.2f}–{span[1]:.2f}]" if span else "") + verdict)
            if said:
                bits.append(f"{where}: {impl} {r['step_ms']:.3g} ms/token, " + ", ".join(said))
    ok = {r["impl"]: r for r in stream if r["status"] == "ok" and r.get("completed")}
    for impl, r in ok.items():
        said = [f"{r['output_tokens_per_s'] / ok[b]['output_tokens_per_s']:.2f}× {b}" for b in ("eager", "sdpa")
                if b in ok and b != impl and ok[b]["output_tokens_per_s"]]
        if said and impl != "eager":
            bits.append(f"continuous batching: {impl} {r['output_tokens_per_s']:.0f} output tok/s, " + ", ".join(said)
                        + " (one stream per implementation: no spread to test)")
    cold = _cold_vs_steady(stream)
    text = f"{loop} loop, gains: " + "; ".join(bits) + "." if bits else ""
    return (text + (" " if text and cold else "") + cold).strip()


def _cold_vs_steady(stream: list[dict]) -> str:
    """Per stream row: the cold part's TPOT p50 against the steady part's — where a once-per-shape cost (graph
    capture, cuDNN's plan per new KV length) would show; with the TORCH_CUDNN_SDPA_AVOID_RECOMPILE setting in force."""
    import os

    bits = []
    for r in stream:
        st = r.get("steady") or {}
        c = ((st.get("cold") or {}).get("latency") or {}).get("tpot_ms")
        w = (st.get("steady_latency") or {}).get("tpot_ms")
        if c and w and w["p50"] > 0:
            bits.append(f"{r['impl']} {c['p50']:.3g} vs {w['p50']:.3g} ms ({c['p50'] / w['p50']:.2f}×)")
    if not bits:
        return ""
    env = os.environ.get("TORCH_CUDNN_SDPA_AVOID_RECOMPILE")
    return ("Cold part vs steady state, TPOT p50: " + ", ".join(bits)
            + f" (TORCH_CUDNN_SDPA_AVOID_RECOMPILE={env if env is not None else 'unset'}).")


def on_masked_path(impl, model, device: str):
    """`impl` as the paths that always pass SDPA a mask see it (continuous batching, the static cache): transformers
    repeats K/V itself there (no `enable_gqa`), so a pinned SDPA backend is re-checked on that call — refused up front
    only for what it really refuses there (flash: the mask), not for GQA it never sees."""
    if not impl.name.startswith("sdpa-"):
        return impl
    import dataclasses as dc

    from attnprof.models import attention
    from attnprof.models.presets import attention_workload

    w = attention_workload(model.config, batch=1, seq=1024, dtype=_dtype_name(model), device=device, mask="pad-left")
    w = dc.replace(w, kv_heads=w.heads)
    return attention._pinned(impl.name[5:], device, w)


def repeats_kv(impl, loop: str) -> bool:
    """Whether `impl`'s attention copies each layer's K and V out to the query heads (a GQA model's cache, times
    heads / kv_heads, live for one layer at a time), as `memory_fit.model_point_bytes` counts it: transformers' eager
    always; its sdpa wherever SDPA is given a mask under compile (`use_gqa_in_sdpa`: no `enable_gqa` with a mask on
    CUDA), which the production loop's static cache always does. The kernel and the other variants read the KV heads
    in place (`tests/test_serve_loops.py` checks transformers still repeats)."""
    return impl.attn_implementation == "eager" or (loop == "production" and impl.attn_implementation == "sdpa")


def _dtype_name(model) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(model.dtype, "fp32")
