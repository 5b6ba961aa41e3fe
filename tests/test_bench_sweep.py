"""The sweep end to end on the CPU: rows, speedups, ceilings, resume, OOM and rejected cells, a full disk."""

import json
from pathlib import Path

import pytest
import torch

from attnprof.bench import ceilings as C
from attnprof.bench.results import SCHEMA, append_line, read_results
from attnprof.bench.spec import Cell, build_grid
from attnprof.bench.sweep import run_sweep
from attnprof.cli import main
from attnprof.errors import UsageError
from attnprof.variants import VARIANTS, Variant
from attnprof.workload import Workload

TINY = ["--seq", "16,24", "--batch", "1", "--heads", "2", "--head-dim", "8", "--dtype", "fp32", "--reps", "5",
        "--warmup", "1", "--device", "cpu"]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_tiny_sweep_end_to_end(tmp_path: Path, capsys):
    C.store(C.measure_ceilings("cpu", matmul_n=128, copy_mib=4, reps=5))
    out = tmp_path / "b"
    code = main(["bench", *TINY, "--variants", "naive,sdpa,inplace,sdpa-cudnn", "--out", str(out), "--json"])
    assert code == 0
    summary = last_json(capsys)
    assert summary["counts"] == {"ok": 6, "rejected": 2}
    rows, note = read_results(out / "results.jsonl")
    assert note is None and len(rows) == 8
    for r in rows:
        assert r["schema"] == SCHEMA
        assert r["provenance"]["torch"] == torch.__version__ and r["provenance"]["argv"]
        assert r["ceilings"]["known"] is True
    ok = [r for r in rows if r["status"] == "ok"]
    for r in ok:
        w = r["workload"]
        assert r["flops"] == 4 * w["batch"] * w["heads"] * w["seq"] ** 2 * w["head_dim"] / 2  # causal
        lat = r["latency_ms"]
        assert 0 < lat["p20"] <= lat["p50"] <= lat["p80"] and lat["reps"] == 5
        assert r["tflops"] == pytest.approx(r["flops"] / (lat["p50"] * 1e-3) / 1e12)
        assert r["pct_matmul_peak"] == pytest.approx(100 * r["tflops"] / r["ceilings"]["matmul_tflops"])
        assert r["pct_copy_peak"] == pytest.approx(100 * r["gbps"] / r["ceilings"]["copy_gbps"])
        assert r["peak_mib"] is not None and r["peak_mib"] > 0
    by = {(r["variant"], r["workload"]["seq"]): r for r in rows}
    for seq in (16, 24):
        naive, sdpa = by[("naive", seq)], by[("sdpa", seq)]
        assert sdpa["speedup"]["vs_naive"] == pytest.approx(naive["latency_ms"]["p50"] / sdpa["latency_ms"]["p50"])
        assert naive["speedup"]["vs_naive"] == pytest.approx(1.0)
        # naive holds the whole S×S score matrix (and a copy); SDPA on the CPU does not
        assert naive["peak_mib"] > sdpa["peak_mib"]
        rejected = by[("sdpa-cudnn", seq)]
        assert rejected["status"] == "rejected" and "no CPU kernel" in rejected["reason"]
        assert rejected["latency_ms"] is None


def test_unknown_ceilings_stay_unknown(tmp_path: Path, capsys):
    assert main(["bench", *TINY, "--variants", "sdpa", "--seq", "16", "--out", str(tmp_path / "b")]) == 0
    captured = capsys.readouterr()
    assert "unknown" in captured.err + captured.out
    (row,), _ = read_results(tmp_path / "b")
    assert row["ceilings"]["known"] is False and row["pct_matmul_peak"] is None and row["pct_copy_peak"] is None
    assert row["tflops"] > 0


def counting(name: str, calls: list, *, interrupt_at: int | None = None) -> Variant:
    sdpa = VARIANTS["sdpa"].fn

    def fn(inputs):
        calls.append(inputs.q.shape[2])
        if interrupt_at is not None and inputs.q.shape[2] == interrupt_at:
            raise KeyboardInterrupt  # what Ctrl-C does in the middle of a cell
        return sdpa(inputs)

    return Variant(name=name, fn=fn)


def cells_for(variant: Variant, seqs=(16, 24, 32)) -> list[Cell]:
    return [Cell(variant, Workload(batch=1, heads=2, seq=s, head_dim=8)) for s in seqs]


def test_resume_after_interrupt_redoes_nothing(tmp_path: Path):
    path = tmp_path / "results.jsonl"
    first: list = []
    with pytest.raises(KeyboardInterrupt):
        run_sweep(cells_for(counting("counted", first, interrupt_at=32)), path, reps=5, warmup=1)
    rows, _ = read_results(path)
    assert [r["workload"]["seq"] for r in rows] == [16, 24]
    before = path.read_bytes()

    second: list = []
    summary = run_sweep(cells_for(counting("counted", second)), path, reps=5, warmup=1, resume=True)
    assert summary.skipped == 2 and summary.ran == 1
    assert set(second) == {32}  # the finished cells never ran again
    assert path.read_bytes().startswith(before)  # their rows are untouched
    rows, _ = read_results(path)
    assert [r["workload"]["seq"] for r in rows] == [16, 24, 32]


def test_without_resume_an_existing_file_is_refused(tmp_path: Path, capsys):
    out = tmp_path / "b"
    args = ["bench", *TINY, "--variants", "sdpa", "--seq", "16", "--out", str(out)]
    assert main(args) == 0
    assert main(args) == 2
    assert "add --resume" in capsys.readouterr().err
    assert main([*args, "--resume", "--json"]) == 0
    assert last_json(capsys)["skipped"] == 1


def test_torn_last_line_is_dropped_and_its_cell_redone(tmp_path: Path):
    path = tmp_path / "results.jsonl"
    calls: list = []
    run_sweep(cells_for(counting("c", calls), seqs=(16, 24)), path, reps=5, warmup=1)
    text = path.read_text()
    path.write_text(text[: len(text) - 40])  # the second row cut mid-write, no newline
    rows, note = read_results(path)
    assert len(rows) == 1 and "torn last line" in note
    calls.clear()
    summary = run_sweep(cells_for(counting("c", calls), seqs=(16, 24)), path, reps=5, warmup=1, resume=True)
    assert set(calls) == {24} and summary.skipped == 1
    rows, note = read_results(path)
    assert note is None and [r["workload"]["seq"] for r in rows] == [16, 24]


def test_broken_line_in_the_middle_names_the_line(tmp_path: Path):
    path = tmp_path / "results.jsonl"
    run_sweep(cells_for(counting("c", []), seqs=(16, 24)), path, reps=5, warmup=1)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0][:30] + "\n" + lines[1])
    with pytest.raises(UsageError, match=r"line 1: not a JSON row"):
        read_results(path)


def test_oom_and_error_cells_are_recorded_and_the_sweep_goes_on(tmp_path: Path):
    # S = 2^24 with D = 1: inputs are 64 MiB each, naive's S×S fp32 scores would be 1 PiB: the allocator refuses.
    huge = Workload(batch=1, heads=1, seq=2**24, head_dim=1, causal=False)
    small = Workload(batch=1, heads=2, seq=16, head_dim=8)

    def broken(inputs):
        raise RuntimeError("this kernel is broken\nsecond line")

    cells = [Cell(VARIANTS["naive"], huge), Cell(Variant("broken", broken), small), Cell(VARIANTS["sdpa"], small)]
    summary = run_sweep(cells, tmp_path / "r.jsonl", reps=5, warmup=1)
    oom, err, ok = summary.rows
    assert oom["status"] == "oom" and "allocate" in oom["reason"] and oom["latency_ms"] is None
    assert err["status"] == "error" and err["reason"] == "RuntimeError: this kernel is broken"
    assert ok["status"] == "ok" and ok["latency_ms"]["p50"] > 0


def test_full_disk_is_one_clear_line(tmp_path: Path, capsys):
    if not Path("/dev/full").exists():
        pytest.skip("/dev/full is not available here to stand in for a full disk")
    with pytest.raises(UsageError, match="disk full while writing /dev/full: no space left on device"):
        append_line(Path("/dev/full"), {"schema": SCHEMA})
    code = main(["bench", *TINY, "--variants", "sdpa", "--seq", "16", "--results", "/dev/full"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("attnprof: error: disk full while writing /dev/full")


def test_results_of_another_schema_version_are_refused(tmp_path: Path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"schema": "attnprof.bench/2", "key": "x"}) + "\n")
    with pytest.raises(UsageError, match=r"line 1: schema 'attnprof.bench/2' is not attnprof.bench/1"):
        run_sweep(cells_for(counting("c", [])), path, resume=True)


def test_grid_cells_run_through_the_same_sweep(tmp_path: Path):
    cells = build_grid("cpu", variants="naive,sdpa", seq="16", batch="1", heads="2", head_dim="8").cells("cpu")
    summary = run_sweep(cells, tmp_path / "r.jsonl", reps=5, warmup=1)
    assert [r["variant"] for r in summary.rows] == ["naive", "sdpa"]
    assert summary.rows[1]["speedup"]["vs_naive"] > 0


@pytest.mark.cuda
def test_cuda_peak_memory_and_a_real_oom(tmp_path: Path):
    small = Workload(batch=1, heads=4, seq=1024, head_dim=64, dtype="bf16", device="cuda")
    huge = Workload(batch=1, heads=1, seq=2**20, head_dim=8, dtype="bf16", causal=False, device="cuda")  # 2 TiB scores
    cells = [Cell(VARIANTS["naive"], small), Cell(VARIANTS["sdpa"], small), Cell(VARIANTS["naive"], huge),
             Cell(VARIANTS["sdpa"], small.replace(seq=2048, kv_seq=2048))]
    naive, sdpa, oom, after = run_sweep(cells, tmp_path / "r.jsonl", reps=10, warmup=2).rows
    scores_mib = 1 * 4 * 1024 * 1024 * 2 / 2**20  # B·H·S²·2 bytes: naive must hold them, fused must not
    assert naive["peak_mib"] >= scores_mib
    out_mib = 1 * 4 * 1024 * 64 * 2 / 2**20
    assert out_mib <= sdpa["peak_mib"] < scores_mib / 2
    assert naive["latency_ms"]["method"] == "cuda-events"
    assert oom["status"] == "oom" and "out of memory" in oom["reason"].lower()
    assert after["status"] == "ok" and after["speedup"]["vs_sdpa"] == pytest.approx(1.0)
