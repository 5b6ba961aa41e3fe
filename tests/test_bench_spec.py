"""The sweep grid: flags, TOML files, and every malformed input refused with one line that says where."""

from pathlib import Path

import pytest

from attnprof.bench.spec import build_grid, cell_key
from attnprof.cli import main
from attnprof.errors import UsageError


def test_flags_make_the_cartesian_product_with_baselines_first():
    grid = build_grid("cpu", variants="sdpa,inplace,naive", seq="16,33", batch="1,2", heads="2", head_dim="8",
                      dtype="fp32,bf16", causal=False)
    cells = grid.cells("cpu")
    assert len(cells) == 3 * 2 * 2 * 2
    assert [c.variant.name for c in cells[:3]] == ["naive", "sdpa", "inplace"]  # baselines run first per workload
    assert {c.workload.seq for c in cells} == {16, 33}
    assert {c.workload.dtype for c in cells} == {"fp32", "bf16"}
    assert not any(c.workload.causal for c in cells)
    assert len({c.key for c in cells}) == len(cells)


def test_tokens_fix_batch_times_seq():
    cells = build_grid("cpu", variants="sdpa", seq="512,1024,4096", tokens=2048, heads="2", head_dim="8").cells("cpu")
    assert [(c.workload.batch, c.workload.seq) for c in cells] == [(4, 512), (2, 1024), (1, 4096)]
    assert all(c.tokens == 2048 for c in cells)


def test_toml_file_then_flags_override(tmp_path: Path):
    f = tmp_path / "sweep.toml"
    f.write_text('variants = ["naive", "sdpa"]\nseq = [16, 32]\nheads = 2\nhead_dim = 8\ndtype = "fp32"\n'
                 "causal = true\nbatch = [1]\n")
    cells = build_grid("cpu", file=f).cells("cpu")
    assert len(cells) == 4 and all(c.workload.heads == 2 and c.workload.causal for c in cells)
    cells = build_grid("cpu", file=f, seq="64", causal=False).cells("cpu")
    assert {c.workload.seq for c in cells} == {64} and not any(c.workload.causal for c in cells)


@pytest.mark.parametrize("text, line", [
    ('variants = ["naive"]\nseq = [16, 32\nheads = 2\n', 3),  # unclosed list: tomllib notices on the next line
    ('variants = ["naive"]\nseq = [16]\nheads 2\n', 3),
])
def test_malformed_toml_names_the_line(tmp_path: Path, text: str, line: int):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(UsageError, match=rf"bad.toml, line {line}, column \d+"):
        build_grid("cpu", file=f)


def test_unknown_toml_key_names_key_and_line(tmp_path: Path):
    f = tmp_path / "typo.toml"
    f.write_text('variants = ["naive"]\n\nsequence = [16]\n')
    with pytest.raises(UsageError, match=r"line 3: unknown key 'sequence'"):
        build_grid("cpu", file=f)


@pytest.mark.parametrize("flags, match", [
    ({"seq": ","}, "--seq is empty"),
    ({"heads": "0"}, "heads values must be positive integers"),
    ({"seq": "12.5"}, "seq values must be positive integers"),
    ({"dtype": "fp7"}, "unknown dtype 'fp7'"),
    ({"batch": "2", "tokens": 64}, "--batch and --tokens both given"),
])
def test_bad_flags_are_usage_errors(flags, match):
    with pytest.raises(UsageError, match=match):
        build_grid("cpu", **flags).cells("cpu")


def test_empty_list_in_toml_is_an_empty_grid(tmp_path: Path):
    f = tmp_path / "empty.toml"
    f.write_text("seq = []\n")
    with pytest.raises(UsageError, match="grid is empty"):
        build_grid("cpu", file=f)


def test_unknown_variant_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown variant 'nave'"):
        build_grid("cpu", variants="naive,nave").cells("cpu")


def test_cli_malformed_sweep_file_one_line_exit_2(tmp_path: Path, capsys):
    f = tmp_path / "bad.toml"
    f.write_text('variants = "naive"\nseq = [16,, 32]\n')
    code = main(["bench", "--grid", str(f), "--out", str(tmp_path / "o"), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("attnprof: error: sweep file") and "line 2" in err[-1]
    assert not any("Traceback" in line for line in err)


def test_cell_key_separates_every_field_that_changes_the_work():
    base = {"batch": 1, "heads": 2, "kv_heads": 2, "seq": 16, "kv_seq": 16, "head_dim": 8, "dtype": "fp32",
            "causal": True, "mask": "none", "device": "cpu", "transposed": False}
    keys = {cell_key("naive", base), cell_key("sdpa", base)}
    for field, value in [("batch", 2), ("kv_heads", 1), ("kv_seq", 8), ("dtype", "bf16"), ("causal", False),
                         ("mask", "bool"), ("device", "cuda"), ("transposed", True)]:
        keys.add(cell_key("naive", {**base, field: value}))
    assert len(keys) == 10
