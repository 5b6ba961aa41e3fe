"""`attnprof serve`'s two loops on the CPU: as-shipped runs, production says why it cannot (no CUDA graphs on cpu),
every row names its loop, and the production decode plumbing (static cache, whole-call timing) runs uncompiled."""

from __future__ import annotations

import json

import pytest

from attnprof.cli import main
from attnprof.models import build_model
from attnprof.serving.loops import measure_static_decode, parse_loops, unavailable
from decode_points import static_decode_point
from test_serve_json_line import missing_metrics

TINY = ["serve", "--device", "cpu", "--model", "tiny-llama", "--json"]


def test_both_loops_are_named_and_production_says_why_on_cpu(capsys, tmp_path):
    f = tmp_path / "reqs.jsonl"
    f.write_text("\n".join(json.dumps({"prompt_tokens": p, "output_tokens": o}) for p, o in [(9, 3), (14, 2)]))
    code = main(TINY + ["--out", str(tmp_path / "o"), "--mode", "decode,continuous", "--decode-batch", "1",
                        "--decode-context", "8", "--new-tokens", "3", "--no-share", "--request-file", str(f),
                        "--rate", "50", "--impls", "eager,sdpa-math", "--slo-ttft-ms", "1e9", "--slo-tpot-ms", "1e-9"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    data = json.loads((tmp_path / "o" / "serve.json").read_text())
    assert code == 0 and data["loops"] == ["as-shipped", "production"]
    assert [(r["impl"], r["loop"], r["status"]) for r in data["decode"]] == [
        ("eager", "as-shipped", "ok"), ("sdpa-math", "as-shipped", "ok")]
    shipped = data["continuous"]["results"]
    assert [(r["impl"], r["loop"], r["completed"]) for r in shipped] == [
        ("eager", "as-shipped", 2), ("sdpa-math", "as-shipped", 2)]  # pinned SDPA runs paged sdpa now
    assert shipped[1]["ran_as"].endswith("sdpa")
    assert all(r["resolved"].get("use_cuda_graph") is not True for r in shipped)  # as shipped: no graphs asked
    for r in shipped:  # vLLM's metrics from the loop's timestamps; no request meets a 1e-9 ms TPOT SLO
        m = r["metrics"]
        assert m["completed"] == 2 and m["throughput"]["output_tokens"] == 3 + 2
        assert m["throughput"]["good"] == 0 and m["throughput"]["request_goodput"] == 0.0
        lat = m["latency"]
        assert lat["ttft_ms"]["n"] == 2 and lat["tpot_ms"]["p99"] >= lat["tpot_ms"]["p50"] > 0
    assert shipped[0]["steady"] is None and "covers every arrival" in shipped[0]["steady_note"]  # 2 requests
    assert data["continuous"]["stream"]["slo"] == {"ttft_ms": 1e9, "tpot_ms": 1e-9, "e2el_ms": None}
    prod = data["production"]
    rows = prod["decode"] + prod["continuous"]["results"]
    assert len(rows) == 4 and all(r["loop"] == "production" and r["status"] == "rejected" for r in rows)
    assert all("no CUDA graphs on cpu" in r["reason"] for r in rows)
    assert prod["answer"] and last["production"]["decode"][0]["status"] == "rejected"
    assert missing_metrics(data, last) == []  # the stdout line carries TPOT, goodput, ... as serve.json has them
    assert last["continuous"][0]["metrics"]["latency"]["tpot_ms"]["p50"] > 0
    md = (tmp_path / "o" / "serve.md").read_text()
    assert "`vllm bench serve`'s metrics [as-shipped]" in md and "TTFT ≤ 1e+09 ms, TPOT ≤ 1e-09 ms" in md
    assert "[as-shipped]" in md and "[production]" in md and "Production loop:" in md
    assert md.count("no CUDA graphs on cpu") >= 4
    assert not (tmp_path / "o" / "serve.partial.json").exists()  # the per-row checkpoint is gone once complete


def test_loop_flag(capsys, tmp_path):
    assert parse_loops("production, as-shipped,production") == ["production", "as-shipped"]
    assert unavailable("as-shipped", "decode", "cpu") is None
    assert "no CUDA graphs on cpu" in unavailable("production", "continuous", "cpu")
    code = main(["serve", "--device", "cpu", "--loop", "graphs", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--loop 'graphs'" in err[0]
    assert not (tmp_path / "o").exists() or not (tmp_path / "o" / "serve.json").exists()


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_production_decode_plumbing_static_cache_uncompiled(impl):
    model = build_model("tiny-llama", attn_implementation=impl)
    # 18 tokens between the two calls and the median of 3 pairs: with 6 and one pair, a busy 2-core CI machine once
    # timed t(N2) <= t(N1) (the plumbing test is not a timing test; the check for that case is loops.py's own)
    p = measure_static_decode(model, impl, batch=2, context=6, new_tokens=24, device="cpu", reps=3, compile_=False)
    assert p.loop == "production" and p.status == "ok"
    assert p.tokens == 2 * (24 - 6)  # batch × (N2 − N1), N1 = max(2, N2 // 4)
    assert p.step_ms > 0 and p.cold_s > 0 and p.tokens_per_s > 0
    assert p.to_json()["loop"] == "production"


def test_production_decode_share_by_name_from_the_difference_of_two_calls():
    """The production loop's share: two whole `generate` calls under the real profiler, 18 decode steps apart; per
    step, each op's self time is the difference over 18. SDPA's fused op is the attention; the gemms of the
    projections and the MLP are most of the rest, and the prompt's work (in both calls) cancels out."""
    model = build_model("tiny-llama", attn_implementation="sdpa")
    p = measure_static_decode(model, "sdpa", batch=2, context=40, new_tokens=24, device="cpu", reps=3,
                              compile_=False, share=True)  # 3 pairs: as the plumbing test, steady on a busy CI
    sh = p.share
    assert p.status == "ok" and sh is not None and sh.basis == "cpu-ops", p
    assert "fused_attention" in sh.roles and sh.roles.get("gemm", 0) > 0, sh.roles
    assert 0 < sh.attention_ms < sh.busy_ms and abs(sum(sh.roles.values()) - sh.busy_ms) < 1e-6, sh
    assert sh.backends == ("cpu_flash",) and sh.kernels and max(sh.kernels.values()) <= sh.busy_ms, sh
    # per step, not per call: a whole call's op time (prefill of 2 × 40 tokens and 24 steps) is far larger
    assert sh.busy_ms < p.step_ms * 5, (sh.busy_ms, p.step_ms)
    assert p.to_json()["share"]["kernels"] == sh.kernels


def test_a_failed_production_profile_costs_its_column_not_the_row(monkeypatch, capsys):
    import attnprof.serving.share as share

    def broken(*a, **kw):
        raise RuntimeError("CUPTI could not be initialised")
    monkeypatch.setattr(share, "production_share", broken)
    model = build_model("tiny-llama", attn_implementation="sdpa")
    p = measure_static_decode(model, "sdpa", batch=1, context=6, new_tokens=24, device="cpu", reps=3,
                              compile_=False, share=True)
    err = capsys.readouterr().err
    assert p.status == "ok" and p.share is None and p.step_ms > 0
    assert "no attention share (RuntimeError: CUPTI could not be initialised)" in err, err


@pytest.mark.parametrize("extra, message", [
    (["--slo-ttft-ms", "0"], "--slo-ttft-ms must be a positive number of milliseconds"),
    (["--slo-tpot-ms", "-5"], "--slo-tpot-ms must be a positive number of milliseconds"),
])
def test_bad_slo_is_one_line_and_exit_2(capsys, tmp_path, extra, message):
    code = main(["serve", "--device", "cpu", "--mode", "continuous", "--out", str(tmp_path / "o")] + extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "o" / "serve.json").exists()


def test_a_failed_request_is_counted_in_the_vllm_metrics_with_its_reason():
    from attnprof.serving.continuous import serve_stream
    from attnprof.serving.requests import Request

    model = build_model("tiny-llama", attn_implementation="eager")
    reqs = [Request(0.0, 8, 2), Request(60.0, 8, 2)]  # the second arrives after the deadline
    r = serve_stream(model, "eager", reqs, device="cpu", timeout_s=2.0)
    m = r.metrics
    assert m["requests"] == 2 and m["completed"] == 1 and m["failed"] == 1
    assert m["failures"][0]["index"] == 1 and "limit" in m["failures"][0]["reason"]


def test_steady_state_is_split_from_the_cold_part(capsys, tmp_path):
    code = main(TINY + ["--out", str(tmp_path / "o"), "--mode", "continuous", "--loop", "as-shipped", "--impls",
                        "sdpa", "--requests", "6", "--rate", "2", "--prompt-median", "8", "--output-median", "3",
                        "--warmup-requests", "2"])
    capsys.readouterr()
    (r,) = json.loads((tmp_path / "o" / "serve.json").read_text())["continuous"]["results"]
    st = r["steady"]
    assert st["warmup"] == "2 requests" and st["cold"]["requests"] == 2 and st["steady_requests"] == 4
    assert st["whole"]["completed"] == 6 and st["steady_throughput"]["duration_s"] > 0
    md = (tmp_path / "o" / "serve.md").read_text()
    assert "cold part apart" in md and "Cold part vs steady state, TPOT p50: sdpa " in md
    assert "TORCH_CUDNN_SDPA_AVOID_RECOMPILE=" in md
    code = main(TINY + ["--out", str(tmp_path / "p"), "--mode", "continuous", "--requests", "3",
                        "--warmup-requests", "2"])
    assert code == 2 and "--warmup-requests 2 leaves no steady part" in capsys.readouterr().err


def test_gains_over_eager_and_sdpa_and_inconclusive_when_the_spread_overlaps():
    from attnprof.serving.loops import comparisons

    def row(impl, ms, lo, hi):
        return {"impl": impl, "status": "ok", "batch": 1, "context": 64, "tokens_per_s": 1e3 / ms, "step_ms": ms,
                "itl_ms": {"p50": ms, "min": lo, "max": hi}}

    decode = [row("eager", 4.0, 3.9, 4.1), row("sdpa", 3.9, 3.8, 4.2), row("kernel", 2.0, 1.9, 2.1)]
    text = comparisons("production", decode, [])
    assert "sdpa 3.9 ms/token, 1.03× eager [0.93–1.08] (inconclusive" in text
    kernel = text.split("kernel")[1]
    assert "2.00× eager" in kernel and "1.95× sdpa" in kernel and "inconclusive" not in kernel
    stream = [{"impl": i, "status": "ok", "completed": 4, "output_tokens_per_s": v}
              for i, v in (("eager", 500.0), ("sdpa", 800.0), ("kernel", 1000.0))]
    text = comparisons("production", [], stream)
    assert text.startswith("production loop, gains:") and "kernel 1000 output tok/s, 2.00× eager, 1.25× sdpa" in text
    assert comparisons("as-shipped", [], []) == ""


def test_concurrency_sweep_draws_the_curve_per_loop(capsys, tmp_path):
    code = main(TINY + ["--out", str(tmp_path / "o"), "--mode", "continuous", "--impls", "sdpa", "--requests", "4",
                        "--rate", "50", "--prompt-median", "8", "--output-median", "3", "--sweep-concurrency", "1,3"])
    capsys.readouterr()
    assert code == 0
    data = json.loads((tmp_path / "o" / "serve.json").read_text())
    sweep = data["continuous"]["sweep"]
    assert sweep["axis"] == "concurrency" and [p["load"] for p in sweep["points"]] == [1, 3]
    for p in sweep["points"]:
        assert p["impl"] == "sdpa" and p["completed"] == 4 and p["failed"] == 0
        assert p["output_tokens_per_s_per_gpu"] > 0 and p["usd_per_m_output"] > 0 and p["tokens_per_s_per_user"] > 0
    assert sweep["pareto"]["sdpa"]  # at least one point on the front
    prod = data["production"]["continuous"]["sweep"]
    assert prod["points"] == [] and all("no CUDA graphs on cpu" in x["reason"] for x in prod["not_run"])
    md = (tmp_path / "o" / "serve.md").read_text()
    assert "### Concurrency sweep [as-shipped]" in md and "### Concurrency sweep [production]" in md
    assert main(["serve", "--device", "cpu", "--mode", "decode", "--sweep-concurrency", "2"]) == 2
    assert "add continuous to --mode" in capsys.readouterr().err


def test_a_pinned_backend_is_judged_on_the_masked_call_it_gets():
    from attnprof.models import attention
    from attnprof.serving.loops import on_masked_path

    model = build_model("tiny-llama", attn_implementation="eager")  # 4 query / 2 KV heads: GQA
    (math,) = attention.resolve_impls("sdpa-math", "cpu")
    again = on_masked_path(math, model, "cpu")
    assert again.name == "sdpa-math" and again.rejected is None
    (eager,) = attention.resolve_impls("eager", "cpu")
    assert on_masked_path(eager, model, "cpu") is eager


def test_an_unbuildable_config_is_one_line_and_exit_2(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 30, "num_attention_heads": 7}))
    code = main(["serve", "--device", "cpu", "--mode", "decode", "--model", str(cfg), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "config.json" in err[0], err
    assert "hidden_size 30 is not divisible by num_attention_heads 7" in err[0]  # attnprof.validate, up front
    assert not (tmp_path / "o" / "serve.json").exists()


def test_an_impl_refused_in_static_batches_but_served_in_the_stream_is_not_called_not_run():
    """The H200's production CB report (docs/results): sdpa-efficient is refused for GQA in a static batch but
    served all 40 requests paged; the report must not head it as "Not run"."""
    from pathlib import Path

    from attnprof.report.serve_report import markdown

    data = json.loads((Path(__file__).parents[1] / "docs/results/continuous-batching/production-cb.json").read_text())
    text = markdown(data)
    assert "Not run:" not in text
    assert "Refused in static batches, ran in continuous batching: sdpa-efficient" in text
    data["production"]["continuous"]["results"] = [r for r in data["production"]["continuous"]["results"]
                                                   if r["impl"] != "sdpa-efficient"]
    assert "Not run: sdpa-efficient" in markdown(data)


def test_production_decode_compiled_is_one_graph_per_step_at_batch_3():
    model = build_model("tiny-llama", attn_implementation="sdpa")
    p = static_decode_point(model, "sdpa", batch=3, context=6, new_tokens=12, device="cpu", reps=1, backend="eager")
    assert p.status == "ok" and p.graph_breaks == 0, p
    assert p.to_json()["graph_breaks"] == 0


def test_a_production_decode_past_dynamos_recompile_limit_is_a_failure_not_a_number():
    """The H200's batch-16 row (issue 30): an attention that broke the graph in every layer made the static cache's
    update recompile per layer past dynamo's limit, and the step ran unfused at 0.25x SDPA, reported as a number."""
    import torch
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from attnprof.errors import CheckFailed

    def breaking(module, *args, **kwargs):
        torch._dynamo.graph_break()  # what the adapter's raise at batch > 1 did inside the compiled step
        return sdpa_attention_forward(module, *args, **kwargs)

    AttentionInterface.register("attnprof_test_graph_break", breaking)
    AttentionMaskInterface.register("attnprof_test_graph_break", sdpa_mask)
    model = build_model("tiny-llama", attn_implementation="attnprof_test_graph_break")
    with torch._dynamo.config.patch(recompile_limit=1), pytest.raises(CheckFailed, match="recompile limit") as err:
        measure_static_decode(model, "breaking", batch=2, context=6, new_tokens=8, device="cpu", reps=1,
                              backend="eager")
    assert "not a production number" in str(err.value)


def test_a_decode_whose_one_shot_prefill_would_not_fit_is_prefilled_in_chunks():
    """Session 16's H100 grid (llama-1b bf16, 79.2 GiB): 128 x 8k and 64 x 32k ran out of memory asking for the
    MLP's 16 and 32 GiB in the prefill of the whole batch, while their KV caches (34 and 69 GB) fit; 64 x 8k and
    16 x 32k ran at once. The estimate keeps those as they ran and chunks the two that failed, with room to spare."""
    from attnprof.memory_fit import prefill_chunk
    from attnprof.models import load_config

    config = load_config("llama-1b")
    h100 = int(79.18 * 2**30)
    chunk = {(b, c): prefill_chunk(config, "bf16", "cuda", b, c, 32, memory=h100)
             for b, c in ((1, 32768), (64, 8192), (16, 32768), (128, 8192), (64, 32768), (128, 1024))}
    assert chunk[(1, 32768)] is None and chunk[(64, 8192)] is None and chunk[(16, 32768)] is None, chunk
    assert chunk[(128, 1024)] is None, chunk
    for cell in ((128, 8192), (64, 32768)):
        n = chunk[cell]
        assert n is not None and n & (n - 1) == 0 and 64 <= n < cell[1], chunk
        assert cell[0] * n * 3 * 8192 * 2 < 16 * 2**30, chunk  # a chunk's MLP well under what the whole batch asked
    assert prefill_chunk(config, "bf16", "cpu", 128, 8192, 32) is None  # the CPU: never chunked
    assert prefill_chunk(config, "bf16", "cuda", 128, 32768, 32, memory=h100) is None  # the cache alone does not fit


def test_sdpa_on_the_static_cache_is_charged_its_repeated_kv_and_the_kernel_is_not():
    """Session 17's H100 (79.18 GiB): at 64 x 32k SDPA ran out of memory asking for 8.01 GiB, one layer's K repeated
    from 8 to 32 heads beside the 64 GiB cache, while the kernel ran; 128 x 8k and 16 x 32k ran for both. The estimate
    now refuses that one cell for SDPA up front and keeps every cell that ran."""
    from attnprof.memory_fit import gib, model_point_bytes
    from attnprof.models import load_config
    from attnprof.models.attention import AttentionImpl
    from attnprof.serving.loops import repeats_kv

    config = load_config("llama-1b")
    h100 = int(79.18 * 2**30)

    def need(b, c, repeated):
        return model_point_bytes(config, "bf16", "cuda", b, c + 32, prefill=False, repeated_kv=repeated)

    assert need(64, 32768, False) < h100 < need(64, 32768, True)
    assert all(need(b, c, True) < h100 for b, c in ((128, 8192), (16, 32768), (64, 8192), (1, 32768)))
    assert gib((need(64, 32768, True) - need(64, 32768, False)) // 2) == gib(8.01 * 2**30)  # the OOM's 8.01 GiB
    sdpa, kernel, eager = (AttentionImpl("sdpa", "sdpa"), AttentionImpl("kernel", "attnprof_kernel"),
                           AttentionImpl("eager", "eager"))
    assert repeats_kv(sdpa, "production") and repeats_kv(eager, "production") and repeats_kv(eager, "as-shipped")
    assert not repeats_kv(kernel, "production") and not repeats_kv(sdpa, "as-shipped")


def test_transformers_sdpa_repeats_kv_when_compiled_with_a_mask(monkeypatch):
    """What `repeats_kv` assumes of the installed transformers: its sdpa function, traced by dynamo with a mask (the
    static cache's decode step), copies K/V out to the query heads instead of passing `enable_gqa`. Fails when a
    transformers release stops doing so; then the estimate should stop charging it."""
    import torch
    from transformers.integrations import sdpa_attention

    reps = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: (reps.append(n), real(x, n))[1])
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 4, True
    q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 1, 6, 8), torch.randn(1, 1, 6, 8)
    mask = torch.ones(1, 1, 1, 6, dtype=torch.bool)
    torch._dynamo.reset()
    out, _ = torch.compile(lambda *a: sdpa_attention.sdpa_attention_forward(module, *a, dropout=0.0, scaling=None),
                           backend="eager")(q, k, v, mask)
    assert out.shape == (1, 1, 4, 8) and reps and set(reps) == {4}, reps


def test_production_decode_prefills_in_the_chunks_it_is_given_and_decodes_the_same(capsys):
    """`prefill_chunk` reaches transformers' chunked prefill (compiled, as on the GPU, with the eager backend): the
    prompt's forwards are the chunk's length, the point records it, the step is still one graph, and the tokens are
    the one-shot prefill's."""
    import torch

    from attnprof.report.serve_report import _loop_sections
    from attnprof.serving.loops import _generation_config
    from attnprof.serving.throughput import _prompt

    model = build_model("tiny-llama", attn_implementation="sdpa")
    limit = torch._dynamo.config.recompile_limit
    # transformers 5.17 (the GPU's) raises dynamo's limit to 64 inside its chunked prefill and leaves it there; the
    # next row's recompile guard must still be judged by the limit it started with
    real = model._prefill

    def raising(*args, **kwargs):
        torch._dynamo.config.cache_size_limit = 64
        return real(*args, **kwargs)

    model._prefill = raising
    lengths: list[int] = []
    hook = model.register_forward_pre_hook(lambda mod, args, kw: lengths.append(kw["input_ids"].shape[1]),
                                           with_kwargs=True)
    try:
        p = measure_static_decode(model, "sdpa", batch=2, context=8, new_tokens=40, device="cpu", reps=3,
                                  backend="eager", prefill_chunk=4)
    finally:
        hook.remove()
        del model._prefill
        after, torch._dynamo.config.recompile_limit = torch._dynamo.config.recompile_limit, limit
    assert after == limit, (after, limit)
    assert p.status == "ok" and p.graph_breaks == 0 and p.prefill_chunk == 4, p
    assert p.to_json()["prefill_chunk"] == 4
    text = "\n".join(_loop_sections({"decode": [p.to_json()], "continuous": {"stream": None}}, "production"))
    assert "Prefilled in chunks of N tokens" in text and "sdpa 2 x 8: 4" in text, text
    from attnprof.report.serve_terminal import print_terminal

    capsys.readouterr()
    print_terminal({"model": {"name": "tiny-llama", "dtype": "fp32"}, "decode": [p.to_json()], "answer": "",
                    "continuous": {"results": []}})
    terminal = capsys.readouterr().out
    assert "Prefilled in chunks" in terminal and "sdpa 2 x 8: 4" in terminal, terminal
    assert max(map(len, terminal.splitlines())) <= 80, terminal
    assert 4 in lengths and 8 not in lengths, sorted(set(lengths))  # two chunks of 4, never the whole prompt
    ids = _prompt(model.config, 2, 8, "cpu", 0)
    got = {}
    for chunk in (None, 4):
        config = _generation_config(5, 8 + 5 + 8, False, prefill_chunk=chunk)
        got[chunk] = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    assert torch.equal(got[None], got[4])


def test_a_decode_row_inverted_by_timing_noise_is_measured_again(monkeypatch):
    """`decode_points.static_decode_point` (the tests' way to a row whose speed they do not check): a row whose two
    timed calls came out inverted is measured again; any other failure, or noise on every attempt, is raised."""
    from attnprof.errors import CheckFailed
    from attnprof.serving import loops

    outcomes = []

    def fake(*args, **kwargs):
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(loops, "measure_static_decode", fake)
    noise = CheckFailed("decode x production: timing noise, t(N2) <= t(N1); raise --new-tokens")
    outcomes[:] = [noise, noise, "row"]
    assert static_decode_point() == "row" and not outcomes
    outcomes[:] = [noise, CheckFailed("decode x production: dynamo hit its recompile limit"), "row"]
    with pytest.raises(CheckFailed, match="recompile limit"):
        static_decode_point()
    outcomes[:] = [noise, noise, noise]
    with pytest.raises(CheckFailed, match="timing noise"):
        static_decode_point()
