"""`attnprof serve`'s seeded request streams, pinned: the same flags and seed draw the same arrivals and lengths as the
streams behind docs/results/serve/ and docs/results/continuous-batching/ (and every report made since), whatever module the generator lives in.

Three holds, none of which imports the generator by name (so they survive moving it):
- a frozen copy of the algorithm as it was when these results were made (`_frozen_stream`: per request one
  log-normal prompt draw, one log-normal output draw, clipped to [1, max], then one exponential gap), itself pinned by
  hashes of its (arrival, prompt, output) tuples recorded from that code;
- `serve`'s own flags through `commands.serve.settings` (what the command runs) against that copy, for the streams of
  the serve and long-stream runs (docs/results/serve/, continuous-batching/) and the CPU defaults, two seeds each, and for a request file without arrivals;
- the stream summary recorded in the committed GPU results, recomputed from the argv recorded beside it.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path

import pytest

from attnprof.cli import build_parser
from attnprof.commands.serve import settings

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"

# name → (serve flags, device whose defaults fill the rest, the frozen copy's arguments)
STREAMS = {
    "serve.sh": (["--requests", "40", "--rate", "32", "--prompt-median", "384", "--prompt-sigma", "0.6",
                  "--max-prompt", "1536", "--output-median", "64", "--output-sigma", "0.5", "--max-output", "160"],
                 "cuda", (40, 32.0, 384, 0.6, 1536, 64, 0.5, 160)),
    "serve_long.sh": (["--requests", "300", "--rate", "24", "--prompt-median", "384", "--prompt-sigma", "0.6",
                       "--max-prompt", "1536", "--output-median", "64", "--output-sigma", "0.5", "--max-output", "160"],
                      "cuda", (300, 24.0, 384, 0.6, 1536, 64, 0.5, 160)),
    # the CPU defaults: 8 requests at 20/s, prompts around 48 (max 4×), outputs around 8 (max 4×), sigmas 0.6 / 0.5
    "cpu-defaults": ([], "cpu", (8, 20.0, 48, 0.6, 192, 8, 0.5, 32)),
}
# sha256[:16] of repr([(arrival_s, prompt, output), ...]), recorded from serving/continuous.poisson_requests at 31d7300
PINNED = {("serve.sh", 0): "465396c05fc47416", ("serve.sh", 7): "e88749548f0f0f28",
          ("serve_long.sh", 0): "ae16fd9876c79426", ("serve_long.sh", 7): "da888be2a9e86a2c",
          ("cpu-defaults", 0): "a74a3277545653f0", ("cpu-defaults", 7): "b6ca15569f706c4a"}


def _frozen_stream(n, rate, pm, ps, pmax, om, osig, omax, seed):
    """Today's draws, verbatim: do not "fix" this copy; it is what the recorded results were made with."""
    rng = random.Random(seed)

    def lognormal(median, sigma, hi):
        return max(1, min(hi, round(rng.lognormvariate(math.log(median), sigma))))

    t, out = 0.0, []
    for _ in range(n):
        out.append((round(t, 6), lognormal(pm, ps, pmax), lognormal(om, osig, omax)))
        t += rng.expovariate(rate)
    return out


def _digest(rows) -> str:
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def _tuples(requests):
    return [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests]


def _requests(argv, device):
    args = build_parser().parse_args(["serve", "--mode", "continuous", *argv])
    return settings(args, device).stream.requests


@pytest.mark.parametrize("name, seed", sorted(PINNED))
def test_the_frozen_copy_is_the_recorded_stream(name, seed):
    assert _digest(_frozen_stream(*STREAMS[name][2], seed)) == PINNED[name, seed]


@pytest.mark.parametrize("name, seed", sorted(PINNED))
def test_serve_draws_the_pinned_stream(name, seed):
    flags, device, frozen = STREAMS[name]
    requests = _requests([*flags, "--seed", str(seed)], device)
    assert _tuples(requests) == _frozen_stream(*frozen, seed)
    assert _digest(_tuples(requests)) == PINNED[name, seed]


def test_a_request_file_without_arrivals_draws_todays_arrivals(tmp_path):
    """Arrivals drawn for a file: the same rng sequence with both lengths fixed at 1 (two draws a request, then a gap)."""
    f = tmp_path / "reqs.jsonl"
    rows = [(5, 2), (9, 4), (3, 1), (12, 7)]
    f.write_text("".join(json.dumps({"prompt_tokens": p, "output_tokens": o}) + "\n" for p, o in rows))
    requests = _requests(["--request-file", str(f), "--rate", "2", "--seed", "5"], "cpu")
    arrivals = [a for a, _, _ in _frozen_stream(len(rows), 2.0, 1, 0, 1, 1, 0, 1, 5)]
    assert _tuples(requests) == [(a, p, o) for a, (p, o) in zip(arrivals, rows)]


@pytest.mark.parametrize("stem", ["serve/h200-serve", "continuous-batching/production-cb-avoid-recompile"])
def test_the_committed_gpu_results_stream_is_drawn_again(stem):
    """The argv recorded in a committed serve.json draws a stream with the summary recorded beside it."""
    data = json.loads((RESULTS / f"{stem}.json").read_text())
    args = build_parser().parse_args(data["provenance"]["argv"][1:])
    recorded = data["continuous"]["stream"]
    now = settings(args, "cuda").stream.to_json()
    assert {k: now[k] for k in recorded} == recorded
