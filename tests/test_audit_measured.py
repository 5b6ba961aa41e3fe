"""The measured audit on the CPU: a tiny Llama's generate under the watcher, grouped by call site and phase; each
site's call replayed on every SDPA arm; a planted slow backend flagged (exit 1) and the fix passing (exit 0); the
regret cache keyed by versions; bad input as one line, exit 2. The regret numbers are whatever this CPU measures:
the tests check the plumbing, never a timing."""

from __future__ import annotations

import json
import time

import pytest
import torch
import torch.nn.functional as F

from attnprof.audit import arm_timing, expect_fused, regret_cache, watch
from attnprof.audit.phases import build_generator, effective_sq, group_sites, record_phases
from attnprof.audit.regret import Plan, measure
from attnprof.audit.replay import replay
from attnprof.cli import main
from attnprof.files import read_json
from attnprof.measure import timing
from attnprof.variants.base import Variant

FAST = Plan(samples=2, reps=3, warmup=1)


@pytest.fixture(scope="module")
def tiny():
    model, refused = build_generator("tiny-llama", device="cpu", dtype="fp32")
    assert refused is None
    return model


@pytest.fixture(scope="module")
def generated(tiny):
    return record_phases(tiny, "tiny-llama", phases=("prefill", "decode"), batch=1, prompt=12, new_tokens=3,
                         dtype="fp32")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


PLANTED_S = 1.0  # the planted backend's extra cost per call: ~10^4 × a tiny-llama SDPA call, far above any stall


@pytest.fixture
def slow_math(monkeypatch):
    """Plant a slow backend: the arm that replays SDPA's math backend costs PLANTED_S more per call. The delay is
    planted in the measuring clock (`measure.timing.clock`), not slept: every arm still runs and is timed for real,
    but the planted cost does not shrink beside the other arms' times when a loaded machine stretches those, as a
    planted sleep of a few ms does once the other arms' calls stall for as long."""
    real = arm_timing.SDPA_ARMS["sdpa-math"]
    planted = [0.0]

    def slow(inputs):
        planted[0] += PLANTED_S
        return real.fn(inputs)

    monkeypatch.setattr(timing, "clock", lambda: time.perf_counter() + planted[0])
    monkeypatch.setitem(arm_timing.SDPA_ARMS, "sdpa-math",
                        Variant(name="sdpa-math", fn=slow, supports=real.supports, family=real.family))


def test_generate_is_grouped_by_call_site_and_phase(generated):
    assert generated.new_tokens == 3
    sites = generated.sites()
    assert [s.shape_class for s in sites] == ["prefill", "decode"]
    prefill, decode = sites
    for s in sites:
        assert s.module == "model.layers.*.self_attn" and s.modules == {"model.layers.0.self_attn",
                                                                         "model.layers.1.self_attn"}
        assert "sdpa_attention" in s.location and s.ran() == {"cpu_flash": len(s.calls)}
    assert len(prefill.calls) == 2 and prefill.n_first == 1  # two layers, one shape: one first call, one repeat
    assert len(decode.calls) == 4 and decode.n_first == 2  # two steps, each at a new KV length
    assert [c.k_shape[2] for c in decode.calls] == [13, 13, 14, 14] and {c.q_shape[2] for c in decode.calls} == {1}
    assert group_sites(generated.calls, ("decode",)) and len(group_sites(generated.calls, ("append",))) == 0


def test_padded_batch_decode_with_folded_gqa_heads_is_still_decode(tiny):
    run = record_phases(tiny, "tiny-llama", phases=("decode",), batch=2, prompt=10, new_tokens=2, dtype="fp32")
    decode = [s for s in run.sites() if s.shape_class == "decode"]
    assert decode and all(effective_sq(c) == 1 for c in decode[0].calls)
    assert all(c.mask == "bool" for c in decode[0].calls)


def test_replay_rebuilds_the_call_and_moves_to_new_lengths(generated):
    rec = generated.sites()[1].representative()
    workload, inputs = replay(rec)
    assert tuple(inputs.q.shape) == rec.q_shape and inputs.q.stride() == rec.strides["q"]
    assert inputs.k.stride() == rec.strides["k"] and inputs.scale == pytest.approx(rec.scale)
    with watch(observe="every") as calls:
        F.scaled_dot_product_attention(inputs.q, inputs.k, inputs.v, scale=inputs.scale, enable_gqa=True)
    assert calls[0].envelope() == rec.envelope() and calls[0].backend == rec.backend
    _, longer = replay(rec, kv_len=40)
    assert longer.k.shape[2] == 40 and longer.q.shape[2] == 1 and longer.k.is_contiguous()
    pre = generated.sites()[0].representative()
    w, x = replay(pre, kv_len=20)  # a prefill grows its queries with its keys, in its [B, S, H, D] layout
    assert x.q.shape[2] == x.k.shape[2] == 20 and not x.q.is_contiguous() and w.transposed and x.causal


def test_measure_times_every_arm_and_caches_by_versions(generated, cache_dir, monkeypatch):
    sites = generated.sites()
    first = measure(sites, device="cpu", steps=3, plan=FAST)
    arms = {a.arm: a for a in first[1].arms}
    assert set(arms) == {"sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"}
    assert arms["sdpa-math"].backend == "math" and arms["sdpa-flash"].backend == "cpu_flash"
    assert arms["sdpa-cudnn"].status == "rejected" and "no CPU kernel" in arms["sdpa-cudnn"].reason
    assert len(arms["sdpa-math"].first_ms) == 2 and arms["sdpa-math"].repeat_p50 > 0
    assert not any(a.cached for r in first for a in r.arms)
    again = measure(sites, device="cpu", steps=3, plan=FAST)
    assert all(a.cached for r in again for a in r.arms)
    assert [a.repeat_p50 for a in again[0].arms] == [a.repeat_p50 for a in first[0].arms]
    monkeypatch.setattr(regret_cache, "versions", lambda device: "another torch")
    assert not any(a.cached for r in measure(sites, device="cpu", steps=3, plan=FAST) for a in r.arms)
    assert json.loads((cache_dir / "regret.json").read_text())["schema"] == regret_cache.SCHEMA


def test_planted_slow_backend_fails_and_the_fix_passes(tmp_path, cache_dir, slow_math, capsys):
    base = ["audit", "--device", "cpu", "--model", "tiny-llama", "--seq", "12", "--new-tokens", "3", "--measure",
            "--require", "measured", "--tolerance", "10"]
    assert main([*base, "--pin", "math", "--out", str(tmp_path / "run1"), "--json"]) == 1
    err = capsys.readouterr().err
    assert "check failed: --require measured: 2 call site(s)" in err and "[decode]: ran math" in err
    data = read_json(tmp_path / "run1" / "audit.json", "attnprof.audit/")
    assert data["mode"] == "phases" and data["fix_flag"] == "--pin flash"
    by_class = {r["site"]["shape_class"]: r for r in data["sites"]}
    decode = by_class["decode"]
    assert decode["verdict"] == "over" and decode["ran"] == {"math": 4} and decode["best_backend"] == "cpu_flash"
    assert decode["regret_ms_per_token"] > 0 and "--pin decode=flash" in decode["fixes"][0]
    assert "**OVER**" in (tmp_path / "run1" / "audit.md").read_text()
    assert main([*base, "--pin", "flash", "--out", str(tmp_path / "run2")]) == 0
    fixed = read_json(tmp_path / "run2" / "audit.json")
    assert {r["verdict"] for r in fixed["sites"]} == {"ok"} and fixed["violations"] == 0
    assert all(r["ran"] == {"cpu_flash": r["site"]["calls"]} for r in fixed["sites"])


def test_expect_fused_measured(tiny, cache_dir, slow_math):
    ids = torch.randint(3, 500, (1, 10))
    with expect_fused(allow="measured", tolerance=10) as calls:
        tiny.generate(input_ids=ids, max_new_tokens=2, min_new_tokens=2, do_sample=False, pad_token_id=0)
    assert len(calls) == 4
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with pytest.raises(AssertionError, match=r"ran math; fastest sdpa"):
        with sdpa_kernel([SDPBackend.MATH]), expect_fused(allow="measured", tolerance=10):
            tiny(input_ids=ids)
    with pytest.raises(ValueError, match="tolerance must be > 0"):
        with expect_fused(allow="measured", tolerance=0):
            pass


@pytest.mark.parametrize("args, says", [
    (["--phase", "prefill,verify"], "unknown phase verify"),
    (["--phase", ""], "unknown phase (empty)"),
    (["--measure", "--tolerance", "0"], "--tolerance must be > 0"),
    (["--measure", "--tolerance", "-0.5"], "--tolerance must be > 0"),
    (["--pin", "fastest"], "--pin 'fastest'"),
    (["--pin", "verify=flash"], "--pin 'verify=flash'"),
    (["--variants", "flex"], "--variants adds arms to --measure"),
    (["--new-tokens", "0", "--phase", "decode"], "--new-tokens"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, args, says):
    assert main(["audit", "--device", "cpu", "--model", "tiny-llama", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("attnprof: error:") and says in err[-1] and "Traceback" not in "".join(err)


def test_no_model_and_a_model_that_cannot_generate_exit_2(tmp_path, capsys):
    assert main(["audit", "--device", "cpu", "--phase", "decode", "--out", str(tmp_path)]) == 2
    assert "add --model" in capsys.readouterr().err
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "intermediate_size": 64}))
    assert main(["audit", "--device", "cpu", "--model", str(cfg), "--phase", "decode", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "cannot build a causal LM" in err[-1] and "Traceback" not in "".join(err)


def test_a_pin_the_model_cannot_run_is_exit_2(tmp_path, capsys):
    # the CPU has no cuDNN: every SDPA call pinned to it raises "No available kernel"
    assert main(["audit", "--device", "cpu", "--model", "tiny-llama", "--seq", "8", "--new-tokens", "2",
                 "--pin", "decode=cudnn", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "cannot run pinned so" in err[-1] and "Traceback" not in "".join(err)


def user_attention(q, k, v, *, causal, scale):
    """A user's own attention (`--variants test_audit_measured:user_attention`): SDPA with k/v heads expanded."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)  # [B, Hkv, S, D] -> [B, Hq, S, D]
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal and q.shape[2] == k.shape[2], scale=scale)


def test_user_variant_is_an_arm_and_never_cached(generated, cache_dir):
    from attnprof.variants import load_user_variant

    user = load_user_variant("test_audit_measured:user_attention")
    for _ in range(2):
        regrets = measure(generated.sites(), device="cpu", steps=3, plan=FAST, variants=[user])
        arm = {a.arm: a for a in regrets[1].arms}[user.name]
        assert arm.ok and not arm.cached and len(arm.first_ms) == 2 and arm.backend == user.name
