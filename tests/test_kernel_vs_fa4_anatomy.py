"""The FA4 benchmark's anatomy fit (benchmarks/kernel_vs_fa4_bench.py --anatomy): the line through µs against keys
gives back a known fixed cost and key-loop rate, per head dim and implementation."""

import importlib.util
import sys
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "kernel_vs_fa4_bench", Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_vs_fa4_bench.py"
)
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench  # its dataclasses look their module up
spec.loader.exec_module(bench)


def _rows(d: int, impl: str, fixed_us: float, loop_tfs: float, wobble: float = 0.0) -> list[dict]:
    rows = []
    for i, case in enumerate(c for c in bench.ANATOMY if c.d == d):
        per_key_us = 4.0 * case.b * case.hq * case.sq * d / (loop_tfs * 1e6)
        us = fixed_us + per_key_us * case.s + (wobble if i % 2 else -wobble)
        rows.append(dict(case=case.name, impl=impl, us=us, shape=bench.dataclasses.asdict(case)))
    return rows


def test_the_fit_recovers_each_implementations_fixed_cost_and_loop_rate():
    rows = _rows(128, "ours", 40.0, 600.0) + _rows(128, "FA4", 25.0, 650.0) + _rows(64, "ours", 30.0, 450.0, 0.5)
    fits = {(f["case"], f["impl"]): f for f in bench.anatomy_fits(rows)}
    assert set(fits) == {("anatomy fit d128", "ours"), ("anatomy fit d128", "FA4"), ("anatomy fit d64", "ours")}
    assert fits["anatomy fit d128", "ours"]["fixed_us"] == pytest.approx(40.0)
    assert fits["anatomy fit d128", "ours"]["loop_tfs"] == pytest.approx(600.0)
    assert fits["anatomy fit d128", "FA4"]["loop_tfs"] == pytest.approx(650.0)
    noisy = fits["anatomy fit d64", "ours"]
    assert noisy["loop_tfs"] == pytest.approx(450.0, rel=0.02) and noisy["r2"] < 1.0


def test_an_implementation_with_too_few_timed_points_gets_no_line():
    rows = _rows(128, "ours", 40.0, 600.0)
    for r in rows[2:]:
        r["us"] = None  # refused or failed
    assert bench.anatomy_fits(rows) == []


def test_the_timeline_summary_reads_busy_tail_and_per_block_cost():
    """Two SMs: SM 0 runs tiles of 1 and 3 key blocks back to back, SM 1 one tile of 2 blocks and then idles. A tile
    costs 1 µs + 2 µs per block; the span is SM 0's 10 µs; SM 1 is done after 5 µs, so the tail is 5 µs and the busy
    fraction (3 + 7 + 5) / (2 x 10)."""
    us = 1000
    rec = [(0, 3 * us, 0, 1), (3 * us, 10 * us, 0, 3), (0, 5 * us, 1, 2)]
    t = bench.timeline_summary(rec)
    assert t["tiles"] == 3 and t["sms"] == 2 and t["span_us"] == pytest.approx(10.0)
    assert t["tail_us"] == pytest.approx(5.0) and t["busy"] == pytest.approx(15 / 20)
    assert t["tile_fixed_us"] == pytest.approx(1.0) and t["us_per_block"] == pytest.approx(2.0)


def test_an_explore_config_that_computes_something_else_is_told_apart():
    """`agreement`: each explore row's output against the default's; bf16 rounding stays under `AGREE`, a wrong tile
    (one head's rows zero) does not."""
    import torch

    x = torch.randn(2, 256, 4, 64, generator=torch.Generator().manual_seed(0))
    rounded = x.to(torch.bfloat16)
    wrong = x.clone()
    wrong[:, :, 1] = 0
    impls = {"ours (default)": lambda: x, "ours rounded": lambda: rounded, "ours wrong": lambda: wrong}
    err = bench.agreement(impls, ["ours rounded", "ours wrong"])
    assert err["ours rounded"] < bench.AGREE < err["ours wrong"], err
    assert bench.agreement({"ours rounded": lambda: x}, ["ours rounded"]) == {}


def test_the_explore_sets_are_configs_the_kernel_takes():
    """`explore_configs` on every case, with the default each plain case gets on an H100 (`choose_config` there: the
    warp-specialized program, or the one-warpgroup one): every explore row is a `Config` the kernel constructs (its
    option rules hold), and the schedules under test (`v_wait_early`, `pingpong`, `persistent`) are among them."""
    import dataclasses
    import types

    from attnprof.variants import kernel_hub

    mod = kernel_hub.load(kernel_hub.parse_spec(str(Path(__file__).resolve().parents[1] / "kernels" / "flash-triton")))
    known = mod._config
    labels = set()
    for default in (known.GLUON_WS, known.GLUON_WS_LPT, known.GLUON_64x64):
        gpu = types.SimpleNamespace(_config=known, choose_config=lambda q, k, causal, cfg=default: cfg)
        for case in bench.CASES + bench.ANATOMY:
            out = bench.explore_configs(gpu, case, None, None)
            assert all(isinstance(c, mod.Config) for c in out.values()), (case, out)
            labels |= set(out)
            if not (case.decode or case.softcap or case.window != (-1, -1) or case.sinks):
                assert out["default v-wait-early"] == dataclasses.replace(default, v_wait_early=True), case
    assert {"default pingpong", "default pingpong v-wait-early", "default persistent", "ws v-wait-early", "varlen ws v-wait-early",
            "one-wg 64x64 s2 v-wait-early", "varlen ws 192 v-wait-early", "default persistent v-wait-early", "ws persistent v-wait-early"} <= labels, labels
