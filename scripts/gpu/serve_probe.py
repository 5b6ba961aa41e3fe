#!/usr/bin/env python3
"""GPU probe for issue 16: what transformers' production loops give on the H200, before `attnprof serve` uses them.

Today `attnprof serve` measures `generate` and continuous batching without CUDA graphs, a loop that is host-bound
(llama-1b decodes at ~25-31 ms per token at batch 1 where the weights alone need ~0.6 ms). Before the serving code is
rebuilt on the loops production runs, this probe answers, on the GPU's own transformers (5.17 there, 5.24 here):

  generate, batch 1 (one prompt of --context tokens): decode ms/token for
    - plain      `generate` as shipped (dynamic cache, no compile): eager, sdpa pinned to flash;
    - static     static cache without compile (`disable_compile=True`): sdpa (does a fixed KV length alone remove
                 cuDNN's per-length plan cost?), sdpa pinned to flash (refused: a static cache always passes a mask);
    - compiled   the production recipe: `cache_implementation="static"` + `CompileConfig(mode="reduce-overhead")`
                 (transformers compiles the decode forward itself; prefill stays eager): eager, sdpa, sdpa-efficient.
    ms/token = (t(N2 new tokens) - t(N1 new tokens)) / (N2 - N1), median of --reps (3), so prefill is not in it;
    the first call (compile + CUDA-graph capture for `compiled`) is reported apart as warm-up.
  continuous batching: serve.sh's 40-request Poisson stream (same seed, same generator as
    attnprof.serving.requests.poisson_stream) through `init_continuous_batching`, paged eager / paged sdpa (and sdpa
    pinned to efficient), each with `use_cuda_graph` off and on; output and total tokens/s, TTFT, TPOT and ITL
    (p50/p90/p99) from transformers' own per-token timestamps, failures with their reasons, the resolved config.
  names: which `attn_implementation` names continuous batching accepts, what it ran as, and whether 2 requests ran.
  dispatch: which SDPA kernel (auto and each backend pinned) runs for the two shapes transformers hands SDPA here:
    a static-cache decode step (bool mask over the whole cache) and a paged varlen step (additive mask).

Standalone on purpose: it imports nothing from attnprof (the serving code is being refactored), only torch and
transformers. Every part is independent: a failure is recorded with its reason and the probe goes on; parts that would
start after --budget-s are skipped with that reason (plan() orders the rows by priority). OUT/serve_probe.json is
rewritten after every row ("finished": false until the end), and a table is printed at the end.

    python3 scripts/gpu/serve_probe.py --out "$OUT/serve_probe"                 # on the H200
    python3 scripts/gpu/serve_probe.py --device cpu --model tiny --out /tmp/p   # plumbing check on a CPU
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network there: a hub kernel name must fail at once, not hang

import torch  # noqa: E402

PRESETS = {  # copied from attnprof.serving.models.PRESETS (llama-1b), plus a tiny one for the CPU check
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                     tie_word_embeddings=True),
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024),
}
GENERATE_ROWS = [  # (loop, impl); plan() interleaves them with STREAM_ROWS in order of priority
    ("plain", "eager"), ("plain", "sdpa-flash"), ("static", "sdpa"), ("static", "sdpa-flash"),
    ("compiled", "eager"), ("compiled", "sdpa"), ("compiled", "sdpa-efficient")]
STREAM_ROWS = [("eager", False), ("sdpa", False), ("eager", True), ("sdpa", True),
               ("sdpa-efficient", False), ("sdpa-efficient", True)]
CB_NAMES = ["paged|eager", "paged|sdpa", "eager", "sdpa", "flex_attention", "paged|flash_attention_2",
            "flash_attention_2", "kernels-community/flash-attn2"]
NEED_S = {"generate": 12, "compiled": 60, "stream": 25, "names": 3}  # seconds a part needs before it starts


def one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


def quantiles(xs: list[float]) -> dict:
    """p50/p90/p99 (linear interpolation, numpy's default, as vLLM reports them) and the mean; {} for no values."""
    if not xs:
        return {}
    s = sorted(xs)

    def q(p: float) -> float:
        pos = (len(s) - 1) * p / 100
        lo = int(pos)
        return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (pos - lo)

    return {"p50": q(50), "p90": q(90), "p99": q(99), "mean": statistics.fmean(s)}


def pinned(impl: str):
    """sdpa-<backend> pins SDPA with sdpa_kernel (process-wide flags, so the CB thread sees them too)."""
    if not impl.startswith("sdpa-"):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[impl[5:]]
    return sdpa_kernel([backend])


class Probe:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.t0 = args, time.perf_counter()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.data: dict = {"schema": "attnprof.serve_probe/1", "argv": sys.argv[1:], "finished": False,
                           "budget_s": args.budget_s, "env": {}, "names": [], "dispatch": [], "generate": [],
                           "continuous": [], "stream": None}

    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t0)

    def save(self) -> None:
        self.data["elapsed_s"] = round(time.perf_counter() - self.t0, 1)
        tmp = self.out / "serve_probe.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.out / "serve_probe.json")

    def row(self, table: str, base: dict, need_s: float, fn) -> None:
        """Run fn() -> dict into one row of `table`; a skip or a failure is a row with its reason."""
        t = time.perf_counter()
        if self.left() < need_s:
            row = {**base, "status": "skipped", "reason": f"probe budget: {self.left():.0f} s left, needs ~{need_s} s"}
        else:
            try:
                row = {**base, "status": "ok", **fn()}
            except Exception as exc:  # noqa: BLE001 — the probe's contract: record the reason and go on
                row = {**base, "status": "error", "reason": one_line(exc)}
            finally:
                if self.args.device.startswith("cuda"):
                    torch.cuda.empty_cache()
        row["part_s"] = round(time.perf_counter() - t, 2)
        self.data[table].append(row)
        print(f"[{time.perf_counter() - self.t0:6.1f}s] {table}: " + ", ".join(
            f"{k}={v}" for k, v in row.items() if not isinstance(v, (dict, list))), flush=True)
        self.save()


# ---------------------------------------------------------------------------------------------- the model --

def build_model(args):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(**PRESETS[args.model])
    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=getattr(torch, args.dtype))
    model.generation_config.eos_token_id = None  # random weights: never stop early, count every token asked for
    model.generation_config.pad_token_id = 0
    return model.eval()


def environment(model, args) -> dict:
    import transformers
    from transformers import ContinuousBatchingConfig, GenerationConfig
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "device": args.device,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "model": args.model,
           "params": sum(p.numel() for p in model.parameters()), "dtype": args.dtype,
           "attention_functions": sorted(ALL_ATTENTION_FUNCTIONS.valid_keys()),
           "cb_config_fields": [f.name for f in dataclasses.fields(ContinuousBatchingConfig)],
           "generation_config_has_max_cache_len": hasattr(GenerationConfig(), "max_cache_len"),
           "env_vars": {k: v for k, v in os.environ.items() if k.startswith(("TORCH_CUDNN", "TORCHINDUCTOR", "HF_"))}}
    if args.device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name()
    return env


# ------------------------------------------------------------------------------------------------ generate --

def generate_row(model, loop: str, impl: str, args) -> dict:
    from transformers import CompileConfig, GenerationConfig

    if loop == "compiled" and not args.device.startswith("cuda"):
        raise RuntimeError("compile mode='reduce-overhead' captures CUDA graphs: needs a CUDA device")
    n1, n2 = args.new_tokens
    max_len = args.context + n2 + 8

    def config(new: int) -> GenerationConfig:
        kw = dict(do_sample=False, max_new_tokens=new, min_new_tokens=new, eos_token_id=None, pad_token_id=0)
        if loop in ("static", "compiled"):
            kw.update(cache_implementation="static", max_cache_len=max_len)  # one cache length for every call
            # on CUDA a static cache makes generate compile its decode step by itself; `static` opts out
            if loop == "compiled":
                kw["compile_config"] = CompileConfig(mode="reduce-overhead")
            else:
                kw["disable_compile"] = True
        return GenerationConfig(**kw)

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (1, args.context), generator=gen).to(args.device)

    def call(new: int) -> float:
        sync()
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config(new))
        sync()
        if out.shape[1] != args.context + new:
            raise RuntimeError(f"generate returned {out.shape[1] - args.context} new tokens, asked for {new}")
        return time.perf_counter() - t

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    model.set_attn_implementation("eager" if impl == "eager" else "sdpa")
    if loop == "compiled":  # a fresh compile per row: dynamo does not guard on SDPA's backend flags
        torch._dynamo.reset()
        model.__dict__.pop("_compiled_call", None)
    with pinned(impl):
        first = call(n2)  # compile + graph capture for `compiled`; cuDNN plans for the lengths met
        second = call(n2)
        per_token = []
        for _ in range(args.reps):
            a, b = call(n1), call(n2)
            per_token.append((b - a) / (n2 - n1))
    ms = statistics.median(per_token) * 1e3
    row = {"ms_per_token": round(ms, 3), "tokens_per_s": round(1e3 / ms, 1) if ms > 0 else None,
           "note": None if ms > 0 else "timing noise: t(N2) <= t(N1); raise --new-tokens or --reps",
           "ms_per_token_reps": [round(x * 1e3, 3) for x in per_token],
           "first_call_s": round(first, 2), "second_call_s": round(second, 3), "call_n2_s": round(b, 3)}
    if args.device.startswith("cuda"):
        row["peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
        torch.cuda.reset_peak_memory_stats()
    return row


# ---------------------------------------------------------------------------------------------- dispatch --

def dispatch_row(model, sq: int, sk: int, mask_kind: str, args) -> dict:
    """Which SDPA kernel runs for the shapes transformers hands it (heads repeated: a mask turns GQA off), auto and
    pinned: kernel names from the profiler, or the refusal. q [1, H, sq, D], k/v [1, H, sk, D], mask [1, 1, sq, sk]."""
    from torch.profiler import ProfilerActivity, profile

    cfg = model.config
    heads, dim = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    dtype = getattr(torch, args.dtype)
    q, k, v = (torch.randn(1, heads, s, dim, device=args.device, dtype=dtype) for s in (sq, sk, sk))
    keep = torch.ones(sq, sk, dtype=torch.bool, device=args.device).tril(sk - sq)  # causal, bottom-right
    mask = keep if mask_kind == "bool" else torch.zeros(sq, sk, dtype=dtype, device=args.device).masked_fill(
        ~keep, torch.finfo(dtype).min)
    mask = mask[None, None]
    cuda = args.device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    out = {}
    for impl in ("sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"):
        try:
            with pinned(impl):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # plans built outside
                with profile(activities=acts) as prof:
                    torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                    if cuda:
                        torch.cuda.synchronize()
            ran = {e.name for e in prof.events() if (e.device_type.name == "CUDA") == cuda}
            named = {n for n in ran if any(w in n.lower() for w in ("attention", "fmha", "flash", "cudnn", "sdpa"))}
            out[impl] = sorted(named)[:4] or sorted(ran)[:4]
        except RuntimeError as exc:
            out[impl] = f"refused: {one_line(exc)}"
    return {"shape": f"q[1,{heads},{sq},{dim}] kv[1,{heads},{sk},{dim}] mask {mask_kind}[1,1,{sq},{sk}]",
            "kernels": out}


# ---------------------------------------------------------------------------------------- continuous batching --

def poisson_stream(args) -> list[tuple[float, int, int]]:
    """(arrival_s, prompt, output): the same draws as attnprof.serving.requests.poisson_stream for these flags."""
    rng = random.Random(args.seed)

    def lognormal(median: float, sigma: float, hi: int) -> int:
        return max(1, min(hi, round(rng.lognormvariate(math.log(median), sigma))))

    t, out = 0.0, []
    for _ in range(args.requests):
        out.append((round(t, 6), lognormal(args.prompt_median, args.prompt_sigma, args.max_prompt),
                    lognormal(args.output_median, args.output_sigma, args.max_output)))
        t += rng.expovariate(args.rate)
    return out


def paged_name(impl: str) -> str:
    """eager → paged|eager; sdpa → paged|sdpa where registered (5.17), plain sdpa where the prefix is gone (5.24)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if impl == "eager":
        return "paged|eager"
    return "paged|sdpa" if "paged|sdpa" in ALL_ATTENTION_FUNCTIONS.valid_keys() else "sdpa"


def cb_config(**kw):
    from transformers import ContinuousBatchingConfig

    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    if "auto_switch_to_flash" in fields:
        kw["auto_switch_to_flash"] = False  # measure what was asked for (5.24 switches to flash when it can)
    return ContinuousBatchingConfig(**{k: v for k, v in kw.items() if v is not None})


class ErrorLog(logging.Handler):
    """WARNING and ERROR lines of transformers' CB logger: a failed batch or a refused graph is often only there."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage().strip().splitlines()
        if text and len(self.lines) < 20:
            self.lines.append(f"{record.levelname}: {text[0][:240]}")


@contextlib.contextmanager
def manager_for(model, name: str, config, gen_config):
    log = ErrorLog()
    cb_logger = logging.getLogger("ContinuousBatchingLogger")
    cb_logger.addHandler(log)
    model.set_attn_implementation(name)
    manager = None
    try:
        manager = model.init_continuous_batching(generation_config=gen_config, continuous_batching_config=config)
        yield manager, log
    finally:
        if manager is not None:
            manager.stop(block=True, timeout=30, hard_stop=True)
            manager.destroy()
        cb_logger.removeHandler(log)
        model.set_attn_implementation("eager")


def resolved(manager) -> dict:
    c = manager.continuous_batching_config
    keys = ("use_cuda_graph", "use_async_batching", "max_blocks_per_request", "q_padding_interval_size",
            "kv_padding_interval_size", "num_blocks", "max_batch_tokens", "max_requests_per_batch", "block_size",
            "page_size", "varlen_compile_config", "decode_compile_config")
    return {k: getattr(c, k) for k in keys if hasattr(c, k)}


def graphs_captured(manager) -> int | None:
    """CUDA graphs held by the batch processor (private attributes: None when this version lays them out otherwise)."""
    io = getattr(getattr(manager, "batch_processor", None), "inputs_and_outputs", None)
    ios = [p.device_io for p in getattr(io, "io_pairs", [])] or [io]
    stores = [getattr(getattr(x, "graphs", None), "_storage", None) for x in ios]
    return sum(len(s) for s in stores) if all(isinstance(s, dict) for s in stores) else None


def fatal(manager) -> str:
    """The error that killed the generation thread, as ' (Type: message)', or ''."""
    error = getattr(getattr(manager, "background_thread_status", None), "fatal_error", None)
    return f" ({one_line(error)})" if error is not None else ""


def run_requests(manager, reqs, prompts, timeout_s: float):
    """Submit each request at its arrival time; collect until all are back, the thread dies or time runs out."""
    sent, results, failures = {}, {}, []
    t0, nxt = time.perf_counter(), 0
    while True:
        now = time.perf_counter() - t0
        while nxt < len(reqs) and reqs[nxt][0] <= now:
            submitted = time.perf_counter()
            rid = manager.add_request(prompts[nxt], request_id=f"r{nxt}", max_new_tokens=reqs[nxt][2],
                                      record_timestamps=True, eos_token_id=-1)
            if rid is None:
                failures.append((nxt, "refused by the manager (add_request returned None)" + fatal(manager)))
            else:
                sent[rid] = (nxt, submitted)
            nxt += 1
        if nxt == len(reqs) and len(results) == len(sent):
            return sent, results, failures
        if now > timeout_s or not manager.is_running():
            why = f"not finished within {timeout_s:g} s" if now > timeout_s else "the generation thread stopped"
            why += fatal(manager)
            failures += [(i, why) for rid, (i, _) in sent.items() if rid not in results]
            failures += [(i, f"never sent: {why}") for i in range(nxt, len(reqs))]
            return sent, results, failures
        wait = min(0.05, reqs[nxt][0] - now) if nxt < len(reqs) else 0.05
        out = manager.get_result(timeout=max(wait, 0.001))
        if out is not None and out.is_finished() and out.request_id in sent:
            results[out.request_id] = out


def stream_row(model, impl: str, graphs: bool, reqs, args) -> dict:
    from transformers import GenerationConfig

    rng = random.Random(args.seed)  # prompt tokens drawn as attnprof.serving.continuous.serve_stream does
    prompts = [[rng.randrange(3, model.config.vocab_size) for _ in range(p)] for _, p, _ in reqs]
    gen_config = GenerationConfig(do_sample=False, max_new_tokens=max(o for *_, o in reqs), eos_token_id=-1,
                                  pad_token_id=0)
    torch._dynamo.reset()  # drop compiled generate's graphs (and their memory pool) before the stream
    model.__dict__.pop("_compiled_call", None)
    config = cb_config(num_blocks=args.num_blocks, max_batch_tokens=args.max_batch_tokens, use_cuda_graph=graphs)
    with pinned(impl), manager_for(model, paged_name(impl), config, gen_config) as (manager, log):
        ran_as = model.config._attn_implementation
        t = time.perf_counter()
        manager.warmup()  # transformers' own: captures the largest varlen graph when graphs are on (no-op otherwise)
        warmup_s = time.perf_counter() - t
        manager.start()
        warm = [(0.0, 16 + j, 4) for j in range(2)]
        run_requests(manager, warm, [[3 + (i * 7) % 500 for i in range(16 + j)] for j in range(2)], 60)
        warm_requests_s = time.perf_counter() - t - warmup_s
        sent, results, failures = run_requests(manager, reqs, prompts, args.stream_timeout)
        graphs_n = graphs_captured(manager)
        config_used = resolved(manager)
    ttft, tpot, itl, e2el, starts, ends = [], [], [], [], [], []
    inp = outp = short = 0
    for rid, out in results.items():
        i, submitted = sent[rid]
        if out.error is not None:
            failures.append((i, str(out.error).strip().splitlines()[0][:300]))
            continue
        n = len(out.generated_tokens)
        stamps = list(out.timestamps or [])[:n]  # a token past max_new_tokens is stamped but not kept
        inp, outp, short = inp + len(out.prompt_ids), outp + n, short + (n < reqs[i][2])
        starts.append(submitted)
        if stamps:  # vLLM's definitions: TTFT to the first token, TPOT over the rest, ITL every gap
            ttft.append(stamps[0] - submitted)
            e2el.append(stamps[-1] - submitted)
            if len(stamps) > 1:
                tpot.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
            itl += [b - a for a, b in zip(stamps, stamps[1:])]
            ends.append(stamps[-1])
    seconds = max(ends) - min(starts) if ends else 0.0
    ms = lambda xs: {k: round(v * 1e3, 2) for k, v in quantiles(xs).items()}  # noqa: E731
    reasons: dict[str, int] = {}
    for _, why in failures:
        reasons[why] = reasons.get(why, 0) + 1
    completed = len(results) - sum(1 for o in results.values() if o.error is not None)
    return {"status": "ok" if not failures else "partial" if completed else "failed",
            "ran_as": ran_as, "requested_graphs": graphs, "config": config_used, "graphs_captured": graphs_n,
            "warmup_s": round(warmup_s, 2), "warm_requests_s": round(warm_requests_s, 2),
            "completed": completed, "failed": len(failures), "failure_reasons": reasons, "short": short,
            "input_tokens": inp, "output_tokens": outp, "seconds": round(seconds, 3),
            "output_tokens_per_s": round(outp / seconds, 1) if seconds else None,
            "total_tokens_per_s": round((inp + outp) / seconds, 1) if seconds else None,
            "ttft_ms": ms(ttft), "tpot_ms": ms(tpot), "itl_ms": ms(itl), "e2el_ms": ms(e2el), "log": log.lines}


def name_row(model, name: str, args) -> dict:
    """Does continuous batching take `name`, what does it run as, and do two short requests come back?"""
    from transformers import GenerationConfig

    gen_config = GenerationConfig(do_sample=False, max_new_tokens=3, eos_token_id=-1, pad_token_id=0)
    config = cb_config(num_blocks=16, max_batch_tokens=256, use_cuda_graph=False)
    with manager_for(model, name, config, gen_config) as (manager, log):
        row = {"ran_as": model.config._attn_implementation}
        manager.start()
        reqs = [(0.0, 12, 3), (0.0, 14, 3)]
        prompts = [[3 + (i * 11) % 500 for i in range(p)] for _, p, _ in reqs]
        sent, results, failures = run_requests(manager, reqs, prompts, 30)
        errors = [str(o.error).splitlines()[0][:200] for o in results.values() if o.error is not None]
        row.update(ran=len(results) - len(errors), failed=len(failures) + len(errors),
                   first_error=(errors or [why for _, why in failures] or [None])[0], log=log.lines[:5])
    return row


# ------------------------------------------------------------------------------------------------ the report --

def fmt(v) -> str:
    return "-" if v is None else str(v)


def table(data: dict) -> str:
    lines = [f"serve probe: {data['env'].get('model')} {data['env'].get('dtype')} on {data['env'].get('gpu', 'cpu')},"
             f" torch {data['env'].get('torch')}, transformers {data['env'].get('transformers')}",
             "", "generate, batch 1: loop impl | ms/token | tok/s | first call s | status"]
    for r in data["generate"]:
        lines.append(f"  {r['loop']:9s} {r['impl']:15s} | {fmt(r.get('ms_per_token')):>8} | "
                     f"{fmt(r.get('tokens_per_s')):>7} | {fmt(r.get('first_call_s')):>6} | {r['status']} "
                     f"{r.get('reason') or r.get('note') or ''}")
    lines += ["", "continuous batching: impl graphs ran-as | done/failed | out tok/s | total tok/s | TTFT p50/p99 ms | "
              "TPOT p50 ms | ITL p50/p99 ms | warm-up s | graphs"]
    for r in data["continuous"]:
        if "completed" not in r:
            lines.append(f"  {r['impl']:15s} {'on ' if r['graphs'] else 'off'} | {r['status']} {r.get('reason')}")
            continue
        t, p, i = r["ttft_ms"], r["tpot_ms"], r["itl_ms"]
        lines.append(f"  {r['impl']:15s} {'on ' if r['graphs'] else 'off'} {r['ran_as']:12s} | {r['completed']}/"
                     f"{r['failed']} | {r['output_tokens_per_s']} | {r['total_tokens_per_s']} | {t.get('p50')}/"
                     f"{t.get('p99')} | {p.get('p50')} | {i.get('p50')}/{i.get('p99')} | {r['warmup_s']} | "
                     f"{r['graphs_captured']} {r['config'].get('use_cuda_graph')} {r['status']} "
                     f"{next(iter(r['failure_reasons']), '')}")
    lines += ["", "SDPA dispatch for the shapes transformers passes (kernels, or the refusal):"]
    for r in data["dispatch"]:
        lines.append(f"  {r['case']}: {r.get('shape', '')} {r['status']} {r.get('reason') or ''}")
        for impl, got in (r.get("kernels") or {}).items():
            lines.append(f"    {impl:15s} {got}")
    lines += ["", "continuous-batching names: name -> ran as | requests ran/failed | first error"]
    for r in data["names"]:
        lines.append(f"  {r['name']:30s} -> {r.get('ran_as', '-')} | {r.get('ran', '-')}/{r.get('failed', '-')} | "
                     f"{r.get('first_error') or r.get('reason') or ''}")
    return "\n".join(lines)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out") + "/serve_probe")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="llama-1b", choices=sorted(PRESETS))
    p.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--parts", default="names,dispatch,generate,continuous")
    p.add_argument("--budget-s", type=float, default=225.0, help="no part starts when less than it needs is left")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--new-tokens", default="8,40", help="N1,N2: ms/token = (t(N2) - t(N1)) / (N2 - N1)")
    p.add_argument("--reps", type=int, default=3, help="timed (N1, N2) pairs per generate row; the median is kept")
    for flag, kind, default in (("--requests", int, 40), ("--rate", float, 32.0), ("--prompt-median", float, 384),
                                ("--prompt-sigma", float, 0.6), ("--max-prompt", int, 1536),
                                ("--output-median", float, 64), ("--output-sigma", float, 0.5),
                                ("--max-output", int, 160), ("--num-blocks", int, 512),
                                ("--max-batch-tokens", int, 2048), ("--stream-timeout", float, 60.0),
                                ("--seed", int, 0)):
        p.add_argument(flag, type=kind, default=default)
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    n = [int(x) for x in args.new_tokens.split(",")]
    if len(n) != 2 or not 1 <= n[0] < n[1]:
        p.error(f"--new-tokens takes N1,N2 with 1 <= N1 < N2, got {args.new_tokens!r}")
    args.new_tokens = n
    return args


def plan(model, reqs, args) -> list[tuple]:
    """Every row as (table, row keys, seconds it needs, run), in order of priority: the budget cuts from the end, so
    the cheap rows and the ones the issue's targets rest on come first: names, dispatch, plain and static generate,
    the stream with and without graphs, compiled eager and sdpa; then compiled sdpa-efficient and its stream rows."""
    rows = [("names", {"name": n}, NEED_S["names"], lambda n=n: name_row(model, n, args)) for n in CB_NAMES]
    # a static-cache decode step (bool mask over the whole cache); a paged sdpa varlen step (additive mask, one bucket)
    for case, sq, sk, kind in (("static-cache decode", 1, args.context + args.new_tokens[1] + 8, "bool"),
                               ("paged varlen step", 64, min(16384, 16 * args.context), "additive")):
        rows.append(("dispatch", {"case": case}, NEED_S["names"],
                     lambda sq=sq, sk=sk, kind=kind: dispatch_row(model, sq, sk, kind, args)))

    def gen(loop: str, impl: str) -> tuple:
        return ("generate", {"loop": loop, "impl": impl}, NEED_S["compiled" if loop == "compiled" else "generate"],
                lambda: generate_row(model, loop, impl, args))

    def stream(impl: str, graphs: bool) -> tuple:
        return ("continuous", {"impl": impl, "graphs": graphs}, NEED_S["stream"],
                lambda: stream_row(model, impl, graphs, reqs, args))

    # the four stream rows (~45 s together) go before the compiles (30-90 s each, less predictable)
    order = GENERATE_ROWS[:4] + STREAM_ROWS[:4] + GENERATE_ROWS[4:6] + GENERATE_ROWS[6:] + STREAM_ROWS[4:]
    rows += [gen(*r) if r in GENERATE_ROWS else stream(*r) for r in order]
    return rows


def main(argv=None) -> int:
    args = parse(argv)
    probe = Probe(args)
    parts = set(args.parts.split(","))
    try:
        model = build_model(args)
    except Exception as exc:  # noqa: BLE001 — nothing else can run; say why in the file and on stdout
        probe.data["error"] = f"model build failed: {one_line(exc)}"
        probe.save()
        print(probe.data["error"])
        return 1
    probe.data["env"] = environment(model, args)
    probe.data["env"]["build_s"] = round(time.perf_counter() - probe.t0, 1)
    probe.save()
    reqs = poisson_stream(args)
    probe.data["stream"] = {"requests": len(reqs), "rate": args.rate, "span_s": reqs[-1][0],
                            "prompt_tokens": sum(p for _, p, _ in reqs), "output_tokens": sum(o for *_, o in reqs),
                            "num_blocks": args.num_blocks, "max_batch_tokens": args.max_batch_tokens}
    for table_name, base, need, fn in plan(model, reqs, args):
        if table_name in parts:
            probe.row(table_name, base, need, fn)
    probe.data["finished"] = True
    probe.save()
    print("\n" + table(probe.data), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
