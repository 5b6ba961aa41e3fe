"""Real decoder families through `audit`, `verify --model` and `serve` on the CPU: tiny configs, random weights.

Gemma 2 (attention softcap, sliding layers), Gemma 3 text (sliding layers), Mistral (a sliding window on every
layer), Qwen2, Qwen3, Llama, Phi-3 (sliding window) and gpt-oss (sinks, sliding layers, MoE), built by transformers
from their configs. An implementation the model class refuses (SDPA for Gemma 2 and gpt-oss in transformers 5.24) is
a `rejected` row in transformers' words, never a traceback; one that cannot take what the model's attention asks
for (softcap, sliding windows, sinks: a `package.module:function` variant) is refused up front with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `tests.broken` as a module:function spec

from attnprof.cli import main  # noqa: E402
from attnprof.models import load_config  # noqa: E402
from attnprof.models.features import forward_refusal, not_taken, refusal_on_forward, refuse_not_taken  # noqa: E402

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=256)
FAMILIES = {
    "gemma2": dict(BASE, model_type="gemma2", head_dim=16, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                   sliding_window=8),
    "gemma3": dict(BASE, model_type="gemma3_text", head_dim=16, sliding_window=8,
                   layer_types=["sliding_attention", "full_attention"]),
    "mistral": dict(BASE, model_type="mistral", sliding_window=8),
    "qwen2": dict(BASE, model_type="qwen2"),
    "qwen3": dict(BASE, model_type="qwen3", head_dim=16),
    "llama": dict(BASE, model_type="llama"),
    "phi3": dict(BASE, model_type="phi3", sliding_window=8, pad_token_id=0),
    "gpt_oss": dict(BASE, model_type="gpt_oss", head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                    sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                    max_position_embeddings=131072),  # 32 × its 4096 original positions: no YaRN warning
}
NO_SDPA = {"gemma2", "gpt_oss"}  # transformers 5.24: `_supports_sdpa = False` (5.17 let Gemma 2 run it)
SDPA_REFUSED = "does not support an attention implementation through torch.nn.functional.scaled_dot_product_attention"
# what a variant's call cannot take, per family (the sliding window of Mistral and Phi-3 is on every layer)
ASKS = {"gemma2": {"softcap", "sliding_window"}, "gemma3": {"sliding_window"}, "mistral": {"sliding_window"},
        "phi3": {"sliding_window"}, "gpt_oss": {"sliding_window", "s_aux"}}


def _sdpa_refused_here(family: str) -> bool:
    import transformers

    return family in NO_SDPA and not (family == "gemma2" and transformers.__version__.startswith("5.17"))


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("families")
    paths = {}
    for name, fields in FAMILIES.items():
        paths[name] = folder / f"{name}.json"
        paths[name].write_text(json.dumps(fields))
    return paths


def _run(tmp_path, *argv) -> tuple[int, dict]:
    out = tmp_path / "report"
    rc = main([*argv, "--device", "cpu", "--out", str(out)])
    name = {"audit": "audit.json", "verify": "verify.json", "serve": "serve.json"}[argv[0]]
    return rc, json.loads((out / name).read_text())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_not_taken_is_read_from_the_config(configs, family):
    config = load_config(str(configs[family]))
    assert set(not_taken(config)) == ASKS.get(family, set())
    if family == "gemma3":
        assert "on 1 of 2 layers" in not_taken(config)["sliding_window"]
    if family == "mistral":
        assert "on 2 of 2 layers" in not_taken(config)["sliding_window"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_audit_model_rows_or_the_refusal_in_transformers_words(tmp_path, configs, family, capsys):
    rc, data = _run(tmp_path, "audit", "--model", str(configs[family]), "--seq", "16")
    assert rc == 0
    rows = data["rows"]
    if _sdpa_refused_here(family):
        assert len(rows) == 1 and rows[0]["backend"] is None and data["model"]["attention_calls"] == 0
        assert SDPA_REFUSED in rows[0]["rejected"] and "transformers 5." in rows[0]["rejected"]
        assert "rejected" in (tmp_path / "report" / "audit.md").read_text()
    elif family == "gemma2":  # transformers 5.17 runs Gemma 2 on SDPA without its softcap: refused by us
        assert "SDPA has no softcap argument" in rows[0]["rejected"]
    else:
        assert len(rows) == FAMILIES[family]["num_hidden_layers"] and all(r["backend"] for r in rows)
        assert not any(r["rejected"] for r in rows)
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("family", list(FAMILIES))
def test_verify_model_rejects_with_the_reason_and_passes_the_rest(tmp_path, configs, family):
    rc, data = _run(tmp_path, "verify", "--model", str(configs[family]), "--dtype", "fp32", "--seed", "1",
                    "--impls", "eager,sdpa,tests.broken:correct", "--model-batch", "2", "--model-seq", "12",
                    "--decode-tokens", "2")
    results = {r["impl"]: r for r in data["model"]["results"]}
    sdpa, user = results["sdpa"], results["tests.broken:correct"]
    if family in NO_SDPA:
        assert sdpa["status"] == "rejected"
        assert SDPA_REFUSED in sdpa["reason"] or "SDPA has no softcap argument" in sdpa["reason"]
    else:
        assert sdpa["status"] == "pass", sdpa["reason"]
    if family in ASKS:
        assert user["status"] == "rejected"
        for feature in ASKS[family]:
            assert feature in user["reason"]
    else:
        assert user["status"] == "pass", user["reason"]
    assert rc == 0 and data["ok"] is True


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss", "mistral"])
def test_serve_rows_say_rejected_in_every_mode(tmp_path, configs, family):
    rc, data = _run(tmp_path, "serve", "--model", str(configs[family]), "--mode", "prefill,decode,continuous",
                    "--impls", "eager,sdpa", "--loop", "as-shipped", "--context", "8", "--batch", "1",
                    "--decode-batch", "1", "--decode-context", "8", "--new-tokens", "2", "--requests", "2",
                    "--prompt-median", "6", "--output-median", "2", "--no-share", "--reps", "1")
    assert rc == 0
    rows = {(m, r["impl"]): r for m in ("prefill", "decode") for r in data[m]}
    rows |= {("continuous", r["impl"]): r for r in data["continuous"]["results"]}
    for mode in ("prefill", "decode", "continuous"):
        assert rows[(mode, "eager")]["status"] == "ok"
        sdpa = rows[(mode, "sdpa")]
        if _sdpa_refused_here(family):
            assert sdpa["status"] == "rejected" and SDPA_REFUSED in sdpa["reason"]
        elif family != "gemma2":
            assert sdpa["status"] == "ok"


def test_a_softcapped_model_that_accepts_sdpa_is_refused_before_it_runs_without_softcap(tmp_path):
    """Gemma 3 accepts SDPA; with attn_logit_softcapping set, SDPA would run without it (what transformers 5.17 did
    for Gemma 2): refused with the reason, not a dispatch table of another model."""
    path = tmp_path / "gemma3-softcap.json"
    path.write_text(json.dumps(dict(FAMILIES["gemma3"], attn_logit_softcapping=20.0)))
    rc, data = _run(tmp_path, "audit", "--model", str(path), "--seq", "16")
    assert rc == 0 and "SDPA has no softcap argument" in data["rows"][0]["rejected"]
    rc = main(["audit", "--model", str(path), "--device", "cpu", "--out", str(tmp_path / "r2"), "--require", "fused"])
    assert rc == 1  # a rule over SDPA calls breaks when none ran


def test_refuse_not_taken_refuses_only_variant_backed_implementations(configs):
    from attnprof.models.attention import resolve_impls

    config = load_config(str(configs["gpt_oss"]))
    impls = {i.name: i for i in refuse_not_taken(resolve_impls("eager,sdpa,tests.broken:correct", "cpu"), config)}
    assert impls["eager"].rejected is None and impls["sdpa"].rejected is None
    assert "s_aux" in impls["tests.broken:correct"].rejected and "sinks" in impls["tests.broken:correct"].rejected


def test_forward_refusal_quotes_transformers_integration_and_nothing_else():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q = torch.zeros(1, 2, 3, 8)
    with refusal_on_forward() as said:
        sdpa_attention_forward(torch.nn.Module(), q, q, q, None, softcap=30.0)
    if not said:  # transformers 5.17 runs it without the softcap (models.features.sdpa_gap refuses that up front)
        pytest.skip("this transformers runs SDPA without softcap: no refusal to quote")
    assert "does not support `softcap`" in said[0] and "transformers 5." in said[0]
    with pytest.raises(ValueError, match="not a number"), refusal_on_forward():
        int("not a number")  # not transformers' attention refusing: it goes on
    with pytest.raises(ValueError) as other:
        int("not a number")
    assert forward_refusal(other.value) is None


def test_the_issue_command_ends_without_a_traceback(tmp_path, configs):
    """The reported command, as a new user runs it: a process, its stderr, its exit code."""
    done = subprocess.run([sys.executable, "-m", "attnprof", "audit", "--device", "cpu", "--model",
                           str(configs["gemma2"]), "--out", str(tmp_path / "a")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "rejected" in done.stdout
