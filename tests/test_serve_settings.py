"""`serving.settings`: the command line becomes one frozen, typed `ServeSettings` once, and nothing below the command
reads argparse. Config-only (no model is built): about a second, most of it importing transformers."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from attnprof.cli import build_parser
from attnprof.commands.serve import settings
from attnprof.errors import UsageError
from attnprof.serving.settings import ServeSettings, make_settings

SRC = Path(__file__).resolve().parents[1] / "src" / "attnprof"


def test_cpu_defaults_are_typed_and_frozen():
    s = make_settings("cpu")
    assert isinstance(s, ServeSettings) and s.device == "cpu" and s.model == "tiny-llama" and s.dtype == "fp32"
    assert s.modes == ("prefill", "decode", "continuous") and s.loops == ("as-shipped", "production")
    assert (s.batch, s.context, s.decode_batch, s.decode_context, s.new_tokens) == ((1,), (64, 128), (1, 4), (64,), 8)
    assert s.cells("decode") == [(1, 64), (4, 64)] and s.longest_context() == 128
    assert len(s.stream.requests) == 8 and s.stream.rate == 20.0 and s.stream.sweep == () and s.stream.slo is None
    assert s.stream.to_json()["source"] == "poisson" and s.price_is_default and s.share and s.reps == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.new_tokens = 3


def test_a_mode_not_asked_for_leaves_its_part_empty():
    s = make_settings("cpu", mode="decode", decode_batch="2", decode_context=[8, 16], new_tokens=3, share=False)
    assert s.batch == s.context == () and s.stream is None and s.cells("prefill") == []
    assert s.cells("decode") == [(2, 8), (2, 16)] and not s.share


def test_the_command_line_makes_the_same_settings():
    argv = ["serve", "--mode", "decode,continuous", "--decode-batch", "1,2", "--new-tokens", "4", "--seed", "3",
            "--sweep-concurrency", "4,1,4", "--slo-tpot-ms", "50", "--no-share", "--gpu-hour-price", "2"]
    s = settings(build_parser().parse_args(argv), "cpu")
    same = make_settings("cpu", mode="decode,continuous", decode_batch="1,2", new_tokens=4, seed=3,
                         sweep_concurrency="4,1,4", slo_tpot_ms=50, share=False, gpu_hour_price=2)
    assert s == same and s.stream.requests == same.stream.requests
    assert s.stream.sweep == (1, 4) and s.stream.slo.tpot_ms == 50 and s.price == 2.0 and not s.price_is_default


@pytest.mark.parametrize("flags, message", [
    (dict(reps=0), "--reps must be >= 1, got 0"),
    (dict(mode="decode", new_tokens=1), "--new-tokens must be >= 2"),
    (dict(mode="prefill", batch="1,x"), "--batch takes comma-separated whole numbers, got '1,x'"),
    (dict(mode="continuous", rate=-1.0), "--rate must be a positive number of requests per second, got -1.0"),
    (dict(mode="continuous", stream_timeout=0), "--stream-timeout must be positive, got 0"),
    (dict(mode="continuous", warmup_requests=7), "--warmup-requests 7 leaves no steady part of a 8-request stream"),
    (dict(mode="decode", sweep_concurrency="2"), "--sweep-concurrency sweeps the request stream"),
    (dict(mode="fast"), "--mode 'fast': choose from prefill, decode, continuous"),
    (dict(loop="fastest"), "--loop 'fastest': choose from as-shipped, production"),
])
def test_bad_values_are_one_usage_error_naming_the_flag(flags, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        make_settings("cpu", **flags)


def test_no_module_below_the_command_reads_argparse():
    below = [*sorted((SRC / "serving").glob("*.py")), SRC / "validate.py", SRC / "memory_fit.py"]
    readers = [f"{p.name}:{i}" for p in below for i, line in enumerate(p.read_text().splitlines(), 1)
               if re.search(r"\bargs\.|Namespace|plan\[", line)]
    assert readers == []
