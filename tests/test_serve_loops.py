"""`attnprof serve`'s two loops on the CPU: as-shipped runs, production says why it cannot (no CUDA graphs on cpu),
every row names its loop, and the production decode plumbing (static cache, whole-call timing) runs uncompiled."""

from __future__ import annotations

import json

import pytest

from attnprof.cli import main
from attnprof.models import build_model
from attnprof.serving.loops import measure_static_decode, parse_loops, unavailable

TINY = ["serve", "--device", "cpu", "--model", "tiny-llama", "--json"]


def test_both_loops_are_named_and_production_says_why_on_cpu(capsys, tmp_path):
    f = tmp_path / "reqs.jsonl"
    f.write_text("\n".join(json.dumps({"prompt_tokens": p, "output_tokens": o}) for p, o in [(9, 3), (14, 2)]))
    code = main(TINY + ["--out", str(tmp_path / "o"), "--mode", "decode,continuous", "--decode-batch", "1",
                        "--decode-context", "8", "--new-tokens", "3", "--no-share", "--request-file", str(f),
                        "--rate", "50", "--impls", "eager,sdpa-math"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    data = json.loads((tmp_path / "o" / "serve.json").read_text())
    assert code == 0 and data["loops"] == ["as-shipped", "production"]
    assert [(r["impl"], r["loop"], r["status"]) for r in data["decode"]] == [
        ("eager", "as-shipped", "ok"), ("sdpa-math", "as-shipped", "ok")]
    shipped = data["continuous"]["results"]
    assert [(r["impl"], r["loop"], r["completed"]) for r in shipped] == [
        ("eager", "as-shipped", 2), ("sdpa-math", "as-shipped", 2)]  # pinned SDPA runs paged sdpa now
    assert shipped[1]["ran_as"].endswith("sdpa")
    prod = data["production"]
    rows = prod["decode"] + prod["continuous"]["results"]
    assert len(rows) == 4 and all(r["loop"] == "production" and r["status"] == "rejected" for r in rows)
    assert all("no CUDA graphs on cpu" in r["reason"] for r in rows)
    assert prod["answer"] and last["production"]["decode"][0]["status"] == "rejected"
    md = (tmp_path / "o" / "serve.md").read_text()
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
    p = measure_static_decode(model, impl, batch=2, context=6, new_tokens=8, device="cpu", reps=1, compile_=False)
    assert p.loop == "production" and p.status == "ok"
    assert p.tokens == 2 * (8 - 2)  # batch × (N2 − N1), N1 = max(2, N2 // 4)
    assert p.step_ms > 0 and p.cold_s > 0 and p.tokens_per_s > 0
    assert p.to_json()["loop"] == "production"
