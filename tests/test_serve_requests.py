"""Request streams (serving/requests.py): seeded arrivals, and request files whose every bad line is named file:line
and ends the run with exit 2 (UsageError). That `serve` still draws the streams of its recorded results is
tests/test_serve_stream_pin.py's."""

from __future__ import annotations

import math
import statistics

import pytest

from attnprof.errors import UsageError
from attnprof.serving.requests import Lengths, Request, check_fits, load_request_file, poisson_stream, summary

PROMPT, OUTPUT = Lengths(100, 0.8, 300), Lengths(20, 0.5, 50, flag="--output")


def test_poisson_arrivals_are_seeded_sorted_clipped_and_at_the_rate():
    a = poisson_stream(3000, 8.0, prompt=PROMPT, output=OUTPUT, seed=3)
    assert a == poisson_stream(3000, 8.0, prompt=PROMPT, output=OUTPUT, seed=3)
    assert a != poisson_stream(3000, 8.0, prompt=PROMPT, output=OUTPUT, seed=4)
    assert a[0].arrival_s == 0 and all(x.arrival_s <= y.arrival_s for x, y in zip(a, a[1:]))
    assert {r.source for r in a} == {None}
    assert min(r.prompt_tokens for r in a) >= 1 and max(r.prompt_tokens for r in a) == 300  # clipped at max
    assert statistics.median(r.prompt_tokens for r in a) == pytest.approx(100, rel=0.15)  # the median asked for
    gaps = [y.arrival_s - x.arrival_s for x, y in zip(a, a[1:])]
    assert statistics.mean(gaps) == pytest.approx(1 / 8.0, rel=0.06)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.08)  # exponential: CV 1


@pytest.mark.parametrize("burstiness, cv", [(0.25, 2.0), (4.0, 0.5)])
def test_burstiness_keeps_the_rate_and_changes_the_spread(burstiness, cv):
    """Gamma gaps of shape k and mean 1/rate have a coefficient of variation 1/sqrt(k) (vLLM's --burstiness)."""
    a = poisson_stream(4000, 10.0, prompt=PROMPT, output=OUTPUT, seed=1, burstiness=burstiness)
    gaps = [y.arrival_s - x.arrival_s for x, y in zip(a, a[1:])]
    assert statistics.mean(gaps) == pytest.approx(0.1, rel=0.08)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(cv, rel=0.12)


def test_an_infinite_rate_sends_everything_at_once_with_the_same_lengths():
    burst = poisson_stream(50, math.inf, prompt=PROMPT, output=OUTPUT, seed=2)
    assert {r.arrival_s for r in burst} == {0.0}
    assert len({r.prompt_tokens for r in burst}) > 10


def test_lengths_default_max_is_four_medians_and_sigma_zero_is_the_median():
    assert Lengths(48).upper == 192 and Lengths(48, 0.5, 60).upper == 60
    fixed = poisson_stream(20, 5.0, prompt=Lengths(37), output=Lengths(5, flag="--output"))
    assert {(r.prompt_tokens, r.output_tokens) for r in fixed} == {(37, 5)}


@pytest.mark.parametrize("call, message", [
    (lambda: poisson_stream(4, 0.0, prompt=PROMPT, output=OUTPUT), "--rate must be a positive number"),
    (lambda: poisson_stream(4, -2.0, prompt=PROMPT, output=OUTPUT), "--rate must be a positive number"),
    (lambda: poisson_stream(4, math.nan, prompt=PROMPT, output=OUTPUT), "--rate must be a positive number"),
    (lambda: poisson_stream(0, 1.0, prompt=PROMPT, output=OUTPUT), "--requests must be a whole number >= 1, got 0"),
    (lambda: poisson_stream(4, 1.0, prompt=PROMPT, output=OUTPUT, burstiness=0), "--burstiness must be a positive"),
    (lambda: Lengths(0.5), "--prompt-median must be at least 1 token, got 0.5"),
    (lambda: Lengths(10, -1, flag="--output"), "--output-sigma must be a number >= 0, got -1"),
    (lambda: Lengths(10, 0.5, 0, flag="--output"), "--max-output must be a whole number >= 1, got 0"),
])
def test_bad_stream_parameters_are_usage_errors(call, message):
    with pytest.raises(UsageError) as info:
        call()
    assert message in str(info.value) and info.value.exit_code == 2


def _file(tmp_path, *lines, name="reqs.jsonl"):
    f = tmp_path / name
    f.write_text("\n".join(lines) + "\n")
    return f


def test_a_file_replays_lengths_and_arrivals_in_arrival_order(tmp_path):
    f = _file(tmp_path, '{"prompt_tokens": 5, "output_tokens": 2, "arrival_s": 0.5}', "",
              '{"prompt_tokens": 7, "output_tokens": 3, "arrival_s": 0.1}',
              '{"arrival_s": 0.5, "output_tokens": 9, "prompt_tokens": 4}')
    assert load_request_file(f) == [Request(0.1, 7, 3, f"{f}:3"), Request(0.5, 5, 2, f"{f}:1"),
                                    Request(0.5, 4, 9, f"{f}:4")]  # equal arrivals keep the file's order


def test_a_file_without_arrivals_draws_them_at_the_rate(tmp_path):
    f = _file(tmp_path, *[f'{{"prompt_tokens": {p}, "output_tokens": {o}}}' for p, o in [(5, 2), (9, 4), (3, 1)]])
    ours = load_request_file(f, rate=2.0, seed=5)
    assert ours == load_request_file(f, rate=2.0, seed=5)
    assert [(r.prompt_tokens, r.output_tokens) for r in ours] == [(5, 2), (9, 4), (3, 1)]  # in the file's order
    assert ours[0].arrival_s == 0 and ours[2].arrival_s > ours[1].arrival_s > 0
    with pytest.raises(UsageError, match="gives no arrival_s: pass --rate"):
        load_request_file(f)


@pytest.mark.parametrize("lines, line, message", [
    (['{"prompt_tokens": 5, "output_tokens": 2}', '{"prompt_tokens": -3, "output_tokens": 2}'], 2,
     "prompt_tokens must be a positive integer, got -3"),
    (['{"prompt_tokens": 5}'], 1, "output_tokens is missing"),
    (['{"output_tokens": 5}'], 1, "prompt_tokens is missing"),
    (['{"prompt_tokens": 5, "output_tokens": 0}'], 1, "output_tokens must be a positive integer, got 0"),
    (['{"prompt_tokens": 5, "output_tokens": 2.5}'], 1, "output_tokens must be a positive integer, got 2.5"),
    (['{"prompt_tokens": "5", "output_tokens": 2}'], 1, "prompt_tokens must be a positive integer, got '5'"),
    (['{"prompt_tokens": true, "output_tokens": 2}'], 1, "prompt_tokens must be a positive integer, got True"),
    (['{"promt_tokens": 5, "output_tokens": 2}'], 1, "unknown key 'promt_tokens'"),
    (['{"prompt_tokens": 5, "output_tokens": 2}', "", "{not json"], 3, "not JSON"),
    (["[5, 2]"], 1, "expected an object"),
    (['{"prompt_tokens": 5, "output_tokens": 2, "arrival_s": -1}'], 1, "arrival_s must be a number of seconds >= 0"),
    (['{"prompt_tokens": 5, "output_tokens": 2, "arrival_s": null}'], 1, "arrival_s must be a number of seconds"),
    (['{"prompt_tokens": 5, "output_tokens": 2, "arrival_s": 0}', '{"prompt_tokens": 5, "output_tokens": 2}'], 2,
     "arrival_s missing here but given on other lines"),
    (['{"prompt_tokens": 5, "output_tokens": 2, "arrival_s": 0}', "", '{"prompt_tokens": 5, "output_tokens": 2}'], 3,
     "arrival_s missing here"),  # blank lines count in the line number
])
def test_a_bad_line_is_named_file_and_line(tmp_path, lines, line, message):
    f = _file(tmp_path, *lines)
    with pytest.raises(UsageError) as info:
        load_request_file(f, rate=1.0)
    text = str(info.value)
    assert text.startswith(f"{f}:{line}: ") and message in text and "\n" not in text


def test_unusable_files_are_named(tmp_path):
    with pytest.raises(UsageError, match="no such request file"):
        load_request_file(tmp_path / "nope.jsonl", rate=1.0)
    with pytest.raises(UsageError, match="cannot read the request file"):
        load_request_file(tmp_path, rate=1.0)  # a directory
    with pytest.raises(UsageError, match="no requests in the file"):
        load_request_file(_file(tmp_path, "", "  "), rate=1.0)


def test_a_request_too_long_for_the_model_is_named_by_its_line(tmp_path):
    f = _file(tmp_path, '{"prompt_tokens": 10, "output_tokens": 10}', '{"prompt_tokens": 1000, "output_tokens": 30}')
    with pytest.raises(UsageError, match=r"reqs.jsonl:2: 1000 prompt \+ 30 output tokens exceed .* \(1024\)"):
        check_fits(load_request_file(f, rate=1.0), 1024)
    with pytest.raises(UsageError, match=r"^request 1: 1000 prompt"):
        check_fits([Request(0, 10, 10), Request(0.1, 1000, 30)], 1024)
    check_fits([Request(0, 1000, 24)], 1024)  # exactly full fits


def test_summary_is_hand_computed():
    reqs = [Request(0.0, 10, 4), Request(0.5, 30, 2), Request(2.0, 20, 8)]
    assert summary(reqs) == {"requests": 3, "span_s": 2.0, "prompt_tokens": {"total": 60, "p50": 20, "max": 30},
                             "output_tokens": {"total": 14, "p50": 4, "max": 8}}
