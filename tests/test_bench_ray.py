"""`bench --ray` / `verify --ray` on a real local Ray runtime (2 CPU workers), started once for the module.

A sweep through Ray gives the same cells and statuses as in-process, with each row naming the worker that ran it;
a worker killed by a planted `os._exit` is retried; one that dies on every attempt becomes a `failed` row that
`--resume` runs again; an interruption cancels what is left and the resumed sweep redoes nothing; what the cluster
cannot run is refused before anything is submitted; without Ray, `--ray` is one line and exit 2.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from pathlib import Path

import pytest

from attnprof.bench.results import read_results, with_speedups
from attnprof.bench.spec import Cell
from attnprof.bench.sweep import run_sweep
from attnprof.cli import main
from attnprof.variants import load_user_variant
from attnprof.workload import Workload

TINY = ["--batch", "1", "--heads", "2", "--head-dim", "8", "--dtype", "fp32", "--reps", "5", "--warmup", "1",
        "--device", "cpu"]


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_without_ray_the_flag_is_one_line_and_exit_2(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    code = main(["bench", *TINY, "--seq", "16", "--ray", "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "pip install 'attnprof[cluster]'" in err
    assert not (tmp_path / "b" / "results.jsonl").exists()


def test_an_address_where_nothing_listens_is_refused_in_seconds(tmp_path: Path, capsys):
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()  # runs before the module's runtime starts (file order)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    code = main(["bench", *TINY, "--seq", "16", "--ray", f"127.0.0.1:{port}", "--out", str(tmp_path / "b")])
    assert code == 2 and "no Ray head answers there" in capsys.readouterr().err
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A local runtime, 2 CPUs, started the way `--ray` starts one; workers see the fault and cache folders."""
    pytest.importorskip("ray")
    from attnprof.bench.ray_executor import RayExecutor

    env = {"ATTNPROF_FAULT_DIR": str(tmp_path_factory.mktemp("faults")),
           "ATTNPROF_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    executor = RayExecutor.connect(None, max_retries=1, num_cpus=2)
    try:
        yield executor
    finally:
        executor.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def faults() -> Path:
    return Path(os.environ["ATTNPROF_FAULT_DIR"])


def test_a_sweep_through_ray_equals_the_same_sweep_in_process(fleet, tmp_path: Path, capsys):
    grid = [*TINY, "--seq", "16", "--variants", "naive,sdpa,sdpa-cudnn"]
    assert main(["bench", *grid, "--out", str(tmp_path / "here")]) == 0
    assert main(["bench", *grid, "--ray", "--out", str(tmp_path / "ray"), "--json"]) == 0
    summary = last_json(capsys)
    assert summary["executor"] == "ray" and summary["counts"] == {"ok": 2, "rejected": 1}
    here, _ = read_results(tmp_path / "here")
    there, _ = read_results(tmp_path / "ray")
    assert {r["key"]: r["status"] for r in there} == {r["key"]: r["status"] for r in here}
    assert len(there) == 3
    for r in there:
        node = r["provenance"]["node"]
        assert node["executor"] == "ray" and node["host"] == platform.node()
        assert node["pid"] != os.getpid() and len(node["ray_node_id"]) == 56  # a worker of the runtime, not us
        assert r["provenance"]["argv"][1:] == sys.argv[1:]  # the driver's command line, not the worker's
        assert r["provenance"]["device"] == here[0]["provenance"]["device"]  # same GPU kind: one group
    # a row is written as it completes, so its speedup may miss a baseline that finished later; the report and
    # compare recompute them over the whole file (with_speedups), whatever the completion order
    ok = [r for r in with_speedups(there) if r["variant"] == "sdpa" and r["status"] == "ok"]
    assert ok and all(r["speedup"]["vs_naive"] for r in ok)
    assert main(["compare", str(tmp_path / "here"), str(tmp_path / "ray"), "--out", str(tmp_path / "cmp"),
                 "--json"]) == 0
    counts = last_json(capsys)["counts"]
    assert "only-in-a" not in counts and "only-in-b" not in counts


def test_a_killed_worker_is_retried(fleet, tmp_path: Path, capsys):
    args = ["bench", *TINY, "--seq", "16", "--variants", "ray_faults:die_once", "--ray", "--max-retries", "1",
            "--out", str(tmp_path / "b"), "--json"]
    assert main(args) == 0
    assert last_json(capsys)["counts"] == {"ok": 1}
    (row,), _ = read_results(tmp_path / "b")
    calls = [line.split() for line in (faults() / "die_once.log").read_text().splitlines() if line.endswith(" 16")]
    pids = list(dict.fromkeys(pid for pid, _ in calls))
    assert len(pids) == 2  # the first attempt's process died on its first call; the retry ran in another
    assert row["provenance"]["node"]["pid"] == int(pids[1])


def test_a_worker_that_dies_on_every_attempt_is_failed_and_resume_runs_it_again(fleet, tmp_path: Path, capsys):
    out = str(tmp_path / "b")
    args = ["bench", *TINY, "--seq", "24", "--variants", "sdpa,ray_faults:die_once", "--ray", "--max-retries", "0",
            "--out", out, "--json"]
    assert main(args) == 0
    assert last_json(capsys)["counts"] == {"ok": 1, "failed": 1}
    rows, _ = read_results(tmp_path / "b")
    failed = next(r for r in rows if r["status"] == "failed")
    assert failed["variant"] == "ray_faults:die_once" and failed["latency_ms"] is None
    assert "worker process died" in failed["reason"] and "1 attempt(s)" in failed["reason"]

    assert main([*args, "--resume"]) == 0  # the marker exists now: the cell runs
    summary = last_json(capsys)
    assert summary["ran"] == 1 and summary["skipped"] == 1 and summary["counts"] == {"ok": 2}
    rows, _ = read_results(tmp_path / "b")
    assert sorted(r["status"] for r in rows) == ["ok", "ok"] and len(rows) == 2  # the failed row is gone


def test_an_interrupted_sweep_cancels_the_rest_and_resume_redoes_nothing(fleet, tmp_path: Path):
    variant = load_user_variant("ray_faults:logged")
    seqs = (16, 24, 32, 40)
    cells = [Cell(variant, Workload(batch=1, heads=2, seq=s, head_dim=8)) for s in seqs]
    path = tmp_path / "results.jsonl"

    def ctrl_c(i, n, cell, phase):
        if phase != "start":
            raise KeyboardInterrupt  # what Ctrl-C does while the first row is written

    with pytest.raises(KeyboardInterrupt):
        run_sweep(cells, path, reps=5, warmup=1, executor=fleet, on_cell=ctrl_c)
    rows, _ = read_results(path)
    assert len(rows) == 1  # the finished row stays; nothing half-written
    finished = rows[0]["workload"]["seq"]
    log = faults() / "calls.log"
    before = len(log.read_text().splitlines())

    summary = run_sweep(cells, path, reps=5, warmup=1, executor=fleet, resume=True)
    assert summary.skipped == 1 and summary.ran == 3
    again = {int(line.split()[1]) for line in log.read_text().splitlines()[before:]}
    assert finished not in again and again == set(seqs) - {finished}
    rows, _ = read_results(path)
    assert sorted(r["workload"]["seq"] for r in rows) == list(seqs)


def test_what_the_cluster_cannot_run_is_refused_before_anything_runs(fleet, tmp_path: Path, capsys):
    out = tmp_path / "b"
    assert main(["bench", *TINY[:-2], "--seq", "16", "--ray", "--device", "cuda", "--out", str(out)]) == 2
    assert "has no GPU" in capsys.readouterr().err
    assert main(["bench", *TINY[:-2], "--seq", "16", "--ray", "--device", "cuda:1", "--out", str(out)]) == 2
    assert "use --device cuda" in capsys.readouterr().err
    assert main(["bench", *TINY, "--seq", "16", "--accelerator-type", "H100", "--out", str(out)]) == 2
    assert "add --ray" in capsys.readouterr().err
    assert not (out / "results.jsonl").exists()


def test_verify_kernel_level_through_ray_equals_in_process(fleet, tmp_path: Path, capsys):
    args = ["verify", "--device", "cpu", "--dtype", "fp32", "--cases", "odd-causal,gqa", "--variants",
            "sdpa,naive,sdpa-cudnn", "--seed", "5", "--json"]
    assert main([*args, "--out", str(tmp_path / "here")]) == 0
    capsys.readouterr()
    assert main([*args, "--ray", "--out", str(tmp_path / "ray")]) == 0
    here = json.loads((tmp_path / "here" / "verify.json").read_text())["kernel"]
    there = json.loads((tmp_path / "ray" / "verify.json").read_text())["kernel"]
    status = lambda k: {(c["name"], r["variant"]): r["status"] for c in k["cases"] for r in c["results"]}  # noqa: E731
    assert status(there) == status(here) and len(status(here)) == 4  # naive: the gate's baseline, not verified
    assert here["not_verified"] == there["not_verified"] and "naive" in here["not_verified"]
    assert [c["name"] for c in there["cases"]] == ["odd-causal", "gqa"]  # case order kept
    assert all(c["node"]["executor"] == "ray" and c["node"]["pid"] != os.getpid() for c in there["cases"])
    assert [c["seed"] for c in there["cases"]] == [c["seed"] for c in here["cases"]]
