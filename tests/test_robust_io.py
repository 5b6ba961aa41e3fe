"""Issue 18, part B: validation up front, no leftovers, output for people.

Impossible model configs, workloads larger than the device and `--kernel` mistakes are one line + exit 2 before any
work (and before "no CUDA device" could hide them); no exit-2 path or interrupt leaves a folder that looks done;
`bench --resume` refuses another grid; terminal tables fit 80 columns unless `--wide`. All in-process, tiny shapes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnprof.cli import main

TINY = ["--device", "cpu", "--batch", "1", "--heads", "2", "--seq", "16", "--head-dim", "8", "--dtype", "fp32"]


def one_line_exit_2(capsys, argv: list[str], *says: str) -> str:
    code = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "attnprof: error" in line]
    assert code == 2, err
    assert len(err) == 1, err
    for text in says:
        assert text in err[0], err[0]
    assert "Traceback" not in err[0]
    return err[0]


def nothing_left(folder: Path) -> None:
    """Neither the folder nor a temporary sibling of it."""
    assert not folder.exists()
    if folder.parent.exists():
        assert not [p for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.")]


# --- 1. model configs, validated before transformers divides by zero or allocates 10^12 parameters --------------

LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=64, max_position_embeddings=128)
BAD = {
    "zero-heads": ({"num_attention_heads": 0}, "at least one attention head"),
    "indivisible": ({"hidden_size": 66}, "not divisible by num_attention_heads"),
    "negative-layers": ({"num_hidden_layers": -2}, "at least one layer"),
    "kv-not-dividing": ({"num_key_value_heads": 3}, "does not divide num_attention_heads"),
    "string-heads": ({"num_attention_heads": "four"}, "not an integer"),
    "huge": ({"hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 1000, "num_attention_heads": 128,
              "num_key_value_heads": 8, "vocab_size": 128256}, "GiB, the device (cpu) has"),
}


def config_file(tmp_path: Path, change: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, **change}))
    return path


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("command", ["audit", "verify", "serve"])
def test_impossible_model_config_is_one_line(tmp_path, capsys, command, case):
    change, says = BAD[case]
    out = tmp_path / "out"
    line = one_line_exit_2(capsys, [command, "--model", str(config_file(tmp_path, change)), "--device", "cpu",
                                    "--out", str(out)], says)
    assert "config.json" in line or "model" in line
    nothing_left(out)


def test_a_sound_config_still_builds(tmp_path):
    from attnprof.models import build_model

    model = build_model(str(config_file(tmp_path, {})))
    assert model.config.num_attention_heads == 4


# --- 2. workload sizes against the device's memory ------------------------------------------------------------------

@pytest.mark.parametrize("flags", [["--seq", "1000000"], ["--batch", "1000000000000"]])
def test_stages_too_large_for_the_device_is_exit_2(tmp_path, capsys, monkeypatch, flags):
    monkeypatch.chdir(tmp_path)  # the default attnprof-report/ must not appear either
    one_line_exit_2(capsys, ["stages", "--device", "cpu", *flags], "GiB, the device (cpu) has")
    assert not (tmp_path / "attnprof-report").exists()


def test_naive_score_matrix_beyond_ram_names_the_variants(capsys, monkeypatch):
    from attnprof import memory_fit

    monkeypatch.setattr(memory_fit, "device_memory", lambda device: (64 * 1024**2, "available RAM"))  # 64 MiB
    line = one_line_exit_2(capsys, ["stages", "--device", "cpu", "--batch", "1", "--heads", "2", "--seq", "4096",
                                    "--head-dim", "8", "--variants", "naive,sdpa"], "naive", "score matrix")
    assert "sdpa" not in line.split("needs")[0]


def test_bench_cell_too_large_is_exit_2(tmp_path, capsys):
    one_line_exit_2(capsys, ["bench", "--device", "cpu", "--variants", "sdpa", "--seq", "16", "--batch",
                             "1000000000000", "--heads", "2", "--head-dim", "8", "--out", str(tmp_path / "b")], "GiB")
    nothing_left(tmp_path / "b")


@pytest.mark.parametrize("flags", [["--mode", "prefill", "--batch", "100000000", "--context", "512"],
                                   ["--mode", "decode", "--decode-batch", "1000000000", "--decode-context", "64"]])
def test_serve_points_too_large_are_exit_2(tmp_path, capsys, flags):
    one_line_exit_2(capsys, ["serve", "--model", "tiny-llama", "--device", "cpu", *flags,
                             "--out", str(tmp_path / "s")], "GiB, the device (cpu) has", "KV cache")
    nothing_left(tmp_path / "s")


@pytest.mark.parametrize("flag", ["--model-seq", "--model-batch", "--decode-tokens"])
def test_verify_model_sizes_must_be_positive(tmp_path, capsys, flag):
    one_line_exit_2(capsys, ["verify", "--model", "tiny-llama", "--device", "cpu", flag, "0",
                             "--out", str(tmp_path / "v")], flag)
    nothing_left(tmp_path / "v")


# --- 3. no leftovers ------------------------------------------------------------------------------------------------

def test_exit_2_after_the_folder_was_opened_leaves_nothing(tmp_path, capsys, monkeypatch):
    """An error found late (here: the sweep's own check) removes the folder and the default parent made for it."""
    import attnprof.stages
    from attnprof.errors import UsageError

    def late(workload, variants, folder, **kw):
        (folder / "traces").mkdir()
        (folder / "traces" / "naive.json").write_text("{}")
        raise UsageError("found late")

    monkeypatch.setattr(attnprof.stages, "run_stages", late)
    monkeypatch.chdir(tmp_path)
    one_line_exit_2(capsys, ["stages", *TINY, "--variants", "sdpa"], "found late")
    assert not (tmp_path / "attnprof-report").exists()


def test_interrupted_stages_leaves_nothing(tmp_path, capsys, monkeypatch):
    import attnprof.stages

    def interrupted(workload, variants, folder, **kw):
        (folder / "traces").mkdir()
        (folder / "traces" / "naive.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(attnprof.stages, "run_stages", interrupted)
    out = tmp_path / "s"
    assert main(["stages", *TINY, "--variants", "sdpa", "--out", str(out)]) == 130
    nothing_left(out)


def test_stages_writes_its_folder_complete(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["stages", *TINY, "--variants", "sdpa", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} >= {"results.json", "report.md", "traces"}
    assert not (out / "INCOMPLETE").exists()
    nothing_left(tmp_path / "absent")
    assert [p.name for p in tmp_path.iterdir()] == ["s"]  # no temporary sibling left
    import os

    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's private 0700
    assert str(out) in capsys.readouterr().err  # the message names the final folder, not the temporary one


def test_interrupted_bench_is_marked_incomplete_and_resumes(tmp_path, capsys, monkeypatch):
    import attnprof.bench.sweep as sweep

    real = sweep.run_sweep

    def stop_after_first(cells, path, **kw):
        def on_cell(i, n, cell, phase):
            if phase != "start":
                raise KeyboardInterrupt
        return real(cells, path, **{**kw, "on_cell": on_cell})

    grid = ["bench", "--device", "cpu", "--variants", "naive,sdpa", "--seq", "16", "--batch", "1", "--heads", "2",
            "--head-dim", "8", "--reps", "5", "--warmup", "0", "--out", str(tmp_path / "b")]
    monkeypatch.setattr(sweep, "run_sweep", stop_after_first)
    assert main(grid) == 130
    assert "INCOMPLETE" in capsys.readouterr().err
    assert (tmp_path / "b" / "INCOMPLETE").is_file()
    assert len((tmp_path / "b" / "results.jsonl").read_text().splitlines()) == 1
    from attnprof.bench.results import read_results

    assert "INCOMPLETE" in read_results(tmp_path / "b")[1]  # compare and report say the rows are partial
    monkeypatch.setattr(sweep, "run_sweep", real)
    # another grid is refused, in one line, and the folder stays as it was
    one_line_exit_2(capsys, [*grid[:-2], "--seq", "32", "--out", str(tmp_path / "b"), "--resume"],
                    "another grid")
    assert len((tmp_path / "b" / "results.jsonl").read_text().splitlines()) == 1
    assert main([*grid, "--resume"]) == 0
    assert len((tmp_path / "b" / "results.jsonl").read_text().splitlines()) == 2
    assert not (tmp_path / "b" / "INCOMPLETE").exists()


def test_resume_of_an_older_sweep_without_grid_file_checks_its_rows(tmp_path, capsys):
    grid = ["bench", "--device", "cpu", "--variants", "sdpa", "--seq", "16", "--batch", "1", "--heads", "2",
            "--head-dim", "8", "--reps", "5", "--warmup", "0", "--out", str(tmp_path / "b")]
    assert main(grid) == 0
    (tmp_path / "b" / "results.grid.json").unlink()
    one_line_exit_2(capsys, [*grid[:5], "--seq", "32", *grid[7:], "--resume"], "not in this grid")


def test_report_folder_into_an_existing_folder(tmp_path):
    from attnprof.files import INCOMPLETE, ReportFolder

    final = tmp_path / "r"
    (final / "traces").mkdir(parents=True)
    (final / "traces" / "old.json").write_text("{}")
    (final / "notes.txt").write_text("mine")
    done = ReportFolder(final)
    (done.work / "traces").mkdir()
    (done.work / "traces" / "new.json").write_text("{}")
    (done.work / "results.json").write_text("{}")
    assert not (final / "results.json").exists()  # nothing under the name until the end
    done.commit()
    assert sorted(p.name for p in final.iterdir()) == ["notes.txt", "results.json", "traces"]
    assert [p.name for p in (final / "traces").iterdir()] == ["new.json"]  # this run's traces, not a mix
    bad = ReportFolder(final, keep_partial=True)
    (bad.work / "serve.partial.json").write_text("{}")
    bad.abort(interrupted=False)  # an error: nothing of it stays
    assert not (final / "serve.partial.json").exists()
    cut = ReportFolder(final, keep_partial=True)
    (cut.work / "serve.partial.json").write_text("{}")
    cut.abort(interrupted=True)  # an interrupt: the partial rows stay, marked
    assert (final / "serve.partial.json").exists() and (final / INCOMPLETE).exists()
    assert [p.name for p in tmp_path.iterdir()] == ["r"]


def test_audit_model_batch_too_large_is_exit_2(tmp_path, capsys):
    one_line_exit_2(capsys, ["audit", "--model", "tiny-llama", "--device", "cpu", "--seq", "1024", "--batch", "10000000",
                             "--out", str(tmp_path / "a")], "GiB, the device (cpu) has", "--seq")
    nothing_left(tmp_path / "a")


def test_audit_grid_too_large_is_exit_2(tmp_path, capsys):
    one_line_exit_2(capsys, ["audit", "--device", "cpu", "--seq", "1000000", "--batch", "64",
                             "--out", str(tmp_path / "a")], "GiB, the device (cpu) has")
    nothing_left(tmp_path / "a")


# --- 4. --kernel mistakes before the device check ------------------------------------------------------------------

def kernel_cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    empty = tmp_path / "not-a-repo"
    empty.mkdir()
    bad = tmp_path / "bad-meta"
    (bad / "build" / "torch-universal").mkdir(parents=True)
    (bad / "build" / "torch-universal" / "metadata.json").write_text("{not json")
    return {"not-a-repo": (["--kernel", str(empty)], "no build/"),
            "bad-metadata": (["--kernel", str(bad)], "metadata.json"),
            "hub-untrusted": (["--kernel", "some-org/flash@1"], "--trust-remote-kernel")}


@pytest.mark.parametrize("case", ["not-a-repo", "bad-metadata", "hub-untrusted"])
@pytest.mark.parametrize("command", ["stages", "verify"])
def test_kernel_mistakes_come_before_no_cuda(tmp_path, capsys, monkeypatch, command, case):
    monkeypatch.delenv("LOCAL_KERNELS", raising=False)
    flags, says = kernel_cases(tmp_path)[case]
    line = one_line_exit_2(capsys, [command, "--device", "cuda", "--variants", "kernel", *flags,
                                    "--out", str(tmp_path / "o")], says)
    assert "CUDA" not in line
    nothing_left(tmp_path / "o")


# --- 6. terminal tables fit 80 columns; --wide prints every column --------------------------------------------------

def printed(capsys, argv: list[str], code: int = 0) -> list[str]:
    assert main(argv) == code
    return capsys.readouterr().out.splitlines()


def fits_80(lines: list[str]) -> None:
    too_wide = [line for line in lines if len(line.rstrip()) > 80]
    assert not too_wide, "\n".join(too_wide)


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory) -> tuple[Path, Path]:
    """Two real tiny sweeps (one with a rejected cell) for bench's and compare's tables."""
    from attnprof.bench.spec import Cell
    from attnprof.bench.sweep import run_sweep
    from attnprof.variants import VARIANTS
    from attnprof.workload import Workload

    folder = tmp_path_factory.mktemp("tables")
    cells = [Cell(VARIANTS[v], Workload(batch=1, heads=2, seq=s, head_dim=8)) for s in (16, 32)
             for v in ("naive", "sdpa", "kernel")]
    paths = folder / "a.jsonl", folder / "b.jsonl"
    for path in paths:
        run_sweep(cells, path, reps=5, warmup=0)
    return paths


def test_bench_table_fits_80_columns_and_wide_has_all(tmp_path, capsys):
    grid = ["bench", "--device", "cpu", "--variants", "naive,sdpa,kernel", "--seq", "16", "--batch", "1",
            "--heads", "2", "--head-dim", "8", "--reps", "5", "--warmup", "0"]
    lines = printed(capsys, [*grid, "--out", str(tmp_path / "a")])
    fits_80(lines)
    text = "\n".join(lines)
    assert "× naive" in text and "not shown" in text
    assert "kernel on 1x2x16x8 fp32 causal: rejected: kernel:" in " ".join(text.split())  # the reason, below
    wide = "\n".join(printed(capsys, [*grid, "--out", str(tmp_path / "b"), "--wide"]))
    for header in ("% matmul", "peak MiB", "reason"):
        assert header in wide


def test_compare_table_fits_80_columns(two_sweeps, tmp_path, capsys):
    a, b = two_sweeps
    lines = printed(capsys, ["compare", str(a), str(b), "--out", str(tmp_path / "c")])
    fits_80(lines)
    assert any("verdict" in line for line in lines)
    wide = "\n".join(printed(capsys, ["compare", str(a), str(b), "--out", str(tmp_path / "d"), "--wide"]))
    assert "p20–p80" in wide and "why" in wide


def test_trace_table_fits_80_columns(tmp_path, capsys):
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    path = tmp_path / "trace.json"
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(2):
            with record_function(f"attnprof.step.{i}"):
                mask = torch.ones(16, 16).triu(1).bool()
                ((q @ k.transpose(-1, -2)).masked_fill(mask, float("-inf"))).softmax(-1) @ v
    prof.export_chrome_trace(str(path))
    lines = printed(capsys, ["trace", str(path)])
    fits_80(lines)
    assert any("attnprof.step.0" in line for line in lines)
    assert "by role" in "\n".join(printed(capsys, ["trace", str(path), "--wide"]))


def test_verify_tables_fit_80_columns(tmp_path, capsys):
    lines = printed(capsys, ["verify", "--device", "cpu", "--variants", "sdpa,sdpa-math", "--dtype", "fp32",
                             "--seed", "1", "--out", str(tmp_path / "v")])
    fits_80(lines)
    text = "\n".join(lines)
    assert "sdpa-math" in text and "✓" in text and "fully-masked" in text  # every case, in blocks


# --- 5. third-party noise captured, not printed raw; the workload note once ----------------------------------------

def noisy_attention(q, k, v, *, causal: bool = False, scale: float | None = None, **_):
    """A user variant that warns what torch warns for a lower-right causal bias, then computes plain SDPA."""
    import warnings

    import torch

    warnings.warn("Lower right causal bias will produce NaNs in the output when seq_len_q > seq_len_kv!",
                  UserWarning, stacklevel=2)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def test_known_noise_is_captured_and_the_rest_still_prints(capsys):
    import logging
    import warnings

    from attnprof.stderr import captured, third_party_noise

    handler = logging.StreamHandler()  # a third-party logger with its own handler, as transformers and torch have
    log = logging.getLogger("transformers.fake_module")
    log.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as shown, third_party_noise():
            warnings.simplefilter("always")
            log.error("Cannot get memory breakdown on CPU without psutil: pip install psutil")
            logging.getLogger("torch._dynamo.convert_frame").warning(
                "torch._dynamo hit config.recompile_limit (8)\n   function: 'flex_attention' (flex_attention.py:1)")
            warnings.warn("Lower right causal bias will produce NaNs in the output when seq_len_q > seq_len_kv!",
                          UserWarning, stacklevel=1)
            warnings.warn("something the user should see", UserWarning, stacklevel=1)
            log.error("a real error from transformers")
            found = captured()
    finally:
        log.removeHandler(handler)
    err = capsys.readouterr().err
    assert "psutil" not in err and "recompile_limit" not in err and "Lower right" not in err
    assert "a real error from transformers" in err
    assert [str(w.message) for w in shown] == ["something the user should see"]
    meanings = " ".join(e["meaning"] for e in found)
    assert "recompile limit" in meanings and "NaN" in meanings and "psutil" not in meanings
    assert any("flex_attention" in e["text"] for e in found)


def test_stages_captures_a_warning_into_its_report_and_prints_the_note_once(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["stages", *TINY, "--variants", "sdpa,test_robust_io:noisy_attention", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "UserWarning" not in err and "Lower right causal bias will produce" not in err
    assert "rows that see no key are NaN" in err  # the one-line summary
    assert err.count("overridden by flags") == 1
    data = json.loads((out / "results.json").read_text())
    assert "NaN" in data["third_party_warnings"][0]["meaning"] and data["third_party_warnings"][0]["count"] >= 1
