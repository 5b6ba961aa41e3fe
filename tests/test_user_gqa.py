"""A user function under GQA (`--kv-heads` < `--heads`): k and v arrive with Hkv heads, as SDPA's enable_gqa=True.

The convention is said up front (stages' workload note, the variant's accepted note), and a function that fails on
it (`tests.broken:needs_hq_heads`, written for Hq-headed k/v) gets that sentence in front of its own error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests.broken` as module:function specs

from attnprof.cli import main  # noqa: E402
from attnprof.run import run  # noqa: E402
from attnprof.variants.user import load_user_variant  # noqa: E402
from attnprof.workload import Workload  # noqa: E402

SENTENCE = "k and v arrive with Hkv=2 heads (q has Hq=4), as SDPA's enable_gqa=True; repeat them yourself"
GQA = Workload(batch=1, heads=4, kv_heads=2, seq=9, head_dim=8)


def test_the_convention_is_the_accepted_note_only_under_gqa():
    fn = load_user_variant("tests.broken:needs_hq_heads")
    assert SENTENCE in fn.supports(GQA).note
    assert fn.supports(GQA.replace(kv_heads=4)).note == ""


def test_a_function_that_fails_on_gqa_gets_the_sentence_with_its_error():
    failed = run(load_user_variant("tests.broken:needs_hq_heads"), GQA, reps=None)
    assert failed.status.value == "error"
    assert SENTENCE in failed.reason and "must match the size of tensor" in failed.reason
    same = run(load_user_variant("tests.broken:needs_hq_heads"), GQA.replace(kv_heads=4), reps=None)
    assert same.status.value == "ok"  # without GQA the same function runs
    right = run(load_user_variant("tests.broken:correct"), GQA, reps=None)
    assert right.status.value == "ok"  # one that repeats k and v itself runs under the same convention


def test_stages_says_it_up_front_and_in_the_row(tmp_path, capsys):
    out = tmp_path / "r"
    rc = main(["stages", "--device", "cpu", "--batch", "1", "--heads", "4", "--kv-heads", "2", "--seq", "16",
               "--head-dim", "16", "--steps", "1", "--variants", "sdpa,tests.broken:needs_hq_heads,tests.broken:correct",
               "--out", str(out)])
    assert rc == 1  # a variant ended in error
    data = json.loads((out / "results.json").read_text())
    assert "tests.broken:needs_hq_heads: " + SENTENCE in data["workload_note"]
    assert "tests.broken:correct: " + SENTENCE in data["workload_note"]
    rows = {s["variant"]: s for s in data["stages"]}
    assert rows["tests.broken:needs_hq_heads"]["status"] == "error"
    assert SENTENCE in rows["tests.broken:needs_hq_heads"]["reason"]
    assert rows["tests.broken:correct"]["status"] == "ok"
    err = capsys.readouterr().err
    assert err.index("enable_gqa") < err.index("check failed")  # said before anything ran, and again at the end
