"""scripts/gpu/serve_probe.py runs once on the H200, in the lead's first GPU call: its plumbing is checked here first,
on the CPU with a tiny model and this machine's transformers (5.24; the GPU has 5.17, the probe handles both names).
CUDA-only rows (compile with CUDA graphs) must come back as rows with their reason, not as a crash."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from attnprof.serving.requests import Lengths, poisson_stream

PROBE = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "serve_probe.py"


def _probe_module():
    spec = importlib.util.spec_from_file_location("serve_probe", PROBE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_probe_serves_serve_shs_stream():
    """Its copy of the stream generator (it imports nothing from attnprof) draws what attnprof draws."""
    probe = _probe_module()
    args = probe.parse(["--device", "cpu"])
    ours = poisson_stream(40, 32.0, prompt=Lengths(384, 0.6, 1536), output=Lengths(64, 0.5, 160, flag="--output"))
    assert probe.poisson_stream(args) == [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in ours]
    assert not re.search(r"^\s*(from|import)\s+attnprof", PROBE.read_text(), re.M)  # survives the src refactor


def test_the_probe_runs_every_part_on_a_cpu(tmp_path):
    out = tmp_path / "probe"
    cmd = [sys.executable, str(PROBE), "--device", "cpu", "--model", "tiny", "--out", str(out), "--budget-s", "600",
           "--context", "32", "--new-tokens", "2,6", "--reps", "1", "--requests", "3", "--prompt-median", "12",
           "--max-prompt", "24", "--output-median", "3", "--max-output", "5", "--num-blocks", "16",
           "--max-batch-tokens", "128", "--stream-timeout", "30"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads((out / "serve_probe.json").read_text())
    assert data["finished"] and data["env"]["model"] == "tiny"
    names = {r["name"]: r for r in data["names"]}
    assert names["paged|eager"]["status"] == "ok" and names["paged|eager"]["ran"] == 2
    assert names["eager"]["ran_as"] == "paged|eager"
    assert names["flex_attention"]["status"] == "error" and names["flex_attention"]["reason"]
    rows = {(r["loop"], r["impl"]): r for r in data["generate"]}
    assert rows[("plain", "eager")]["status"] == "ok" and len(rows[("plain", "eager")]["ms_per_token_reps"]) == 1
    assert rows[("compiled", "eager")]["status"] == "error" and "needs a CUDA device" in rows[("compiled", "eager")][
        "reason"]
    stream = {(r["impl"], r["graphs"]): r for r in data["continuous"]}
    plain = stream[("eager", False)]
    assert plain["status"] == "ok" and plain["completed"] == 3 and plain["output_tokens"] > 0
    assert plain["ttft_ms"]["p50"] > 0 and plain["itl_ms"]
    assert stream[("eager", True)]["config"]["use_cuda_graph"] == [False, False]  # no CUDA: transformers said no
    efficient = stream[("sdpa-efficient", False)]  # no CPU kernel: every request failed, each with a reason
    assert efficient["status"] == "failed" and efficient["failed"] == 3 and sum(
        efficient["failure_reasons"].values()) == 3
    assert {r["case"] for r in data["dispatch"]} == {"static-cache decode", "paged varlen step"}
    assert "continuous batching:" in done.stdout and "generate, batch 1" in done.stdout


def test_a_part_past_the_budget_or_failing_is_a_row_with_its_reason(tmp_path):
    probe = _probe_module()
    p = probe.Probe(probe.parse(["--device", "cpu", "--out", str(tmp_path), "--budget-s", "10"]))
    p.row("generate", {"loop": "compiled"}, 60, lambda: {"never": "run"})

    def no_kernel():
        raise RuntimeError("No available kernel. Aborting execution.\nmore detail")

    p.row("generate", {"loop": "static"}, 0, no_kernel)
    rows = json.loads((tmp_path / "serve_probe.json").read_text())["generate"]
    assert rows[0]["status"] == "skipped" and "probe budget" in rows[0]["reason"] and "never" not in rows[0]
    assert rows[1]["status"] == "error"
    assert rows[1]["reason"] == "RuntimeError: No available kernel. Aborting execution."  # the first line only
