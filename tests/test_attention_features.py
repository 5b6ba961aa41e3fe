"""What a model's attention asks for and what each implementation does with it (`models.attention_features`), and
the sample lengths `audit --model` / `verify --model` accept: real transformers models from tiny configs, CPU.

The verdicts are measured: a shrunk copy of each model runs on eager with and without each feature and on each
implementation. Cost: ~10 s on a quiet 2-core machine (the probes are cached per config within the process)."""

from __future__ import annotations

import json

import pytest

from attnprof.cli import main
from attnprof.models import load_config
from attnprof.models.attention import resolve_impls
from attnprof.models.attention_features import (  # noqa: I001
    _build,
    _logits,
    _references,
    _shrunk,
    asked,
    attention_features,
    classify,
    layer_asks,
    window_check,
)

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=256)
CONFIGS = {  # the held-in families: Gemma 2 as the issue names it (softcap 50, window 256), Mistral, gpt-oss
    "gemma2": dict(BASE, model_type="gemma2", head_dim=16, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                   sliding_window=256, max_position_embeddings=1024),
    "mistral": dict(BASE, model_type="mistral", sliding_window=8),
    "gpt_oss": dict(BASE, model_type="gpt_oss", head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                    sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2,
                    max_position_embeddings=131072),
    "gemma3_softcap": dict(BASE, model_type="gemma3_text", head_dim=16, sliding_window=8, attn_logit_softcapping=20.0,
                           layer_types=["sliding_attention", "full_attention"] * 2),
    "short": dict(BASE, model_type="llama", max_position_embeddings=8),
}


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("features")
    out = {}
    for name, fields in CONFIGS.items():
        out[name] = folder / f"{name}.json"
        out[name].write_text(json.dumps(fields))
    return out


def _verdicts(block: dict) -> dict[tuple[str, str], dict]:
    return {(v["impl"], v["feature"]): v for v in block["verdicts"]}


def test_layers_say_what_the_modeling_code_asks_for(paths):
    gemma = layer_asks(load_config(str(paths["gemma2"])))
    assert [x.kind for x in gemma] == ["sliding", "full", "sliding", "full"]  # Gemma 2 alternates
    assert [x.window for x in gemma] == [256, None, 256, None] and {x.softcap for x in gemma} == {50.0}
    assert asked(gemma) == ("softcap", "sliding_window")
    mistral = layer_asks(load_config(str(paths["mistral"])))
    assert [x.window for x in mistral] == [8] * 4 and asked(mistral) == ("sliding_window",)
    oss = layer_asks(load_config(str(paths["gpt_oss"])))
    assert all(x.sinks for x in oss) and [x.window for x in oss] == [8, None, 8, None]
    assert asked(oss) == ("sliding_window", "sinks")


def test_verdicts_are_measured_against_eager_with_and_without_each_feature(paths):
    impls = resolve_impls("eager,sdpa,sdpa-math,tests.broken:correct", "cpu")
    mistral = _verdicts(attention_features(load_config(str(paths["mistral"])), impls, seq=32, flag="--seq"))
    for impl in ("sdpa", "sdpa-math"):  # SDPA gets the window through transformers' mask
        assert mistral[(impl, "sliding_window")]["verdict"] == "honours"
        assert mistral[(impl, "sliding_window")]["how"] == "measured"
    user = mistral[("tests.broken:correct", "sliding_window")]
    assert user["verdict"] == "refuses" and user["how"] == "declared"
    oss = _verdicts(attention_features(load_config(str(paths["gpt_oss"])), impls, seq=32, flag="--seq"))
    assert oss[("sdpa", "sinks")]["verdict"] == "refuses" and "does not support" in oss[("sdpa", "sinks")]["why"]
    assert oss[("eager", "sinks")]["verdict"] == "honours"
    assert "s_aux" in oss[("tests.broken:correct", "sinks")]["why"]
    gemma = _verdicts(attention_features(load_config(str(paths["gemma2"])), impls, seq=64, flag="--seq"))
    assert gemma[("sdpa", "softcap")]["verdict"] == "refuses" and gemma[("eager", "softcap")]["verdict"] == "honours"
    # Gemma 3 reads attn_logit_softcapping but never passes it to attention: told, not judged
    g3 = _verdicts(attention_features(load_config(str(paths["gemma3_softcap"])), impls, seq=32, flag="--seq"))
    assert g3[("eager", "softcap")]["verdict"] == "not applied"
    assert ("sdpa", "softcap") not in g3 and g3[("sdpa", "sliding_window")]["verdict"] == "honours"


def test_backends_with_no_cpu_kernel_are_judged_as_sdpa_when_resolved_for_cuda(paths):
    """verify on a GPU resolves sdpa-efficient/-cudnn for CUDA (not rejected); the probe runs on the CPU, where they
    have no kernel: their verdicts are sdpa's, said so, not an error."""
    impls = resolve_impls("sdpa-efficient,sdpa-cudnn", "cuda")
    mistral = _verdicts(attention_features(load_config(str(paths["mistral"])), impls, seq=32, flag="--seq"))
    for impl in ("sdpa-efficient", "sdpa-cudnn"):
        assert mistral[(impl, "sliding_window")]["verdict"] == "honours", mistral[(impl, "sliding_window")]
        assert mistral[(impl, "sliding_window")]["how"] == "as sdpa"


def test_an_implementation_that_drops_the_window_is_ignores_not_honours(paths):
    """The classifier on real logits: eager with the window (honours), eager without it (what an implementation
    that drops the window computes: ignores), and a model of other weights (differs)."""
    config = load_config(str(paths["mistral"]))
    model, ids, full, without = _references(config, ("sliding_window",))
    assert classify(full, full, without)["sliding_window"][0] == "honours"
    assert classify(without["sliding_window"], full, without)["sliding_window"][0] == "ignores"
    import torch

    torch.manual_seed(1)
    other = _build(_shrunk(config))
    other.load_state_dict({k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()})
    assert classify(_logits(other, ids), full, without)["sliding_window"][0] == "differs"


def test_window_check_offers_a_length_that_crosses_it():
    layers = layer_asks(_gemma())  # window 256, max_position_embeddings 1024
    assert window_check(layers, 64, 1024) == {"window": 256, "seq": 64, "exercised": False, "cross_seq": 512}
    assert window_check(layers, 300, 1024)["exercised"] is True
    assert window_check(layers, 64, 300)["cross_seq"] == 300  # capped by max_position_embeddings
    assert window_check(layers, 64, 260, extra=8)["cross_seq"] is None  # 252 positions left: below the window


def _gemma():
    import transformers

    fields = {k: v for k, v in CONFIGS["gemma2"].items() if k != "model_type"}
    return transformers.AutoConfig.for_model("gemma2", **fields)


def test_audit_says_the_window_was_not_exercised_and_how_to_cross_it(tmp_path, paths, capsys):
    rc = main(["audit", "--model", str(paths["mistral"]), "--seq", "8", "--device", "cpu", "--out", str(tmp_path / "a")])
    assert rc == 0
    block = json.loads((tmp_path / "a" / "audit.json").read_text())["model"]["attention_features"]
    assert block["window"]["exercised"] is False and block["window"]["cross_seq"] == 16
    text = capsys.readouterr().out
    assert "window NOT exercised" in text and "--seq 16 crosses it" in text
    assert "| sdpa | honours |" in (tmp_path / "a" / "audit.md").read_text()


@pytest.mark.parametrize("argv, flag", [
    (["audit"], "--seq 64"),
    (["audit", "--phase", "decode", "--seq", "4"], "--seq + --new-tokens 20"),
    (["verify", "--dtype", "fp32"], "--model-seq + --decode-tokens 40"),
])
def test_a_sample_past_max_position_embeddings_is_one_line_and_exit_2(tmp_path, paths, capsys, argv, flag):
    rc = main([*argv, "--model", str(paths["short"]), "--device", "cpu", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert flag in err[0] and "max_position_embeddings 8" in err[0]
    assert not (tmp_path / "r").exists()


def test_audit_impls_lists_a_third_party_kernel_rejected_with_its_reason_on_the_cpu(tmp_path, paths):
    """`audit --model --impls` takes FA4 by name: on the CPU it cannot run, so its row says so (never `honours`)."""
    rc = main(["audit", "--model", str(paths["mistral"]), "--seq", "8", "--device", "cpu", "--impls",
               "eager,sdpa,flash-attn-4", "--out", str(tmp_path / "a")])
    assert rc == 0
    block = json.loads((tmp_path / "a" / "audit.json").read_text())["model"]["attention_features"]
    text = json.dumps(block)
    assert "flash-attn-4" in text and "kernel" not in [r.get("impl") for r in block.get("impls", [])]
    md = (tmp_path / "a" / "audit.md").read_text()
    assert "| flash-attn-4 |" in md and "| flash-attn-4 | honours |" not in md


def test_audit_impls_without_model_or_with_phase_is_one_line_and_exit_2(tmp_path, paths, capsys):
    assert main(["audit", "--impls", "eager", "--device", "cpu", "--out", str(tmp_path / "a")]) == 2
    assert main(["audit", "--model", str(paths["mistral"]), "--phase", "prefill", "--impls", "eager", "--device",
                 "cpu", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("--impls" in line for line in err), err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
