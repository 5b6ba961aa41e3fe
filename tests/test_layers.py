"""The layers of docs/ARCHITECTURE.md are a contract: `lint-imports` checks pyproject.toml's [tool.importlinter]
(layers, and no import cycle inside any package) over this checkout's src/. ~1 s."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports(src: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("importlinter")
    env = {**os.environ, "PYTHONPATH": str(src)}
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code, "--no-cache", str(ROOT / "pyproject.toml")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)


def test_the_layer_and_cycle_contracts_hold():
    done = _lint_imports(ROOT / "src")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 kept, 0 broken" in done.stdout


def test_an_import_up_the_layers_breaks_them(tmp_path):
    """The contract can fail: the same tree with the dispatch watcher importing run() (a cycle through run.py)."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "attnprof", src / "attnprof", ignore=shutil.ignore_patterns("__pycache__"))
    watch = src / "attnprof" / "dispatch" / "watch.py"
    watch.write_text(watch.read_text() + "\n\ndef _up():\n    from attnprof.run import run  # noqa: F401\n")
    done = _lint_imports(src)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "attnprof.dispatch.watch -> attnprof.run" in done.stdout
    assert "No cycles are allowed in attnprof." in done.stdout
