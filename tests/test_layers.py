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


def test_every_attnprof_import_names_a_module_that_exists():
    """lint-imports skips an import of a module that does not exist; an import inside a function of a module that was
    moved fails only when that function runs. So every `attnprof.*` import in src/, tests/, benchmarks/ and the kernel
    repo's scripts (module level or not) must name an existing module, or a name its package defines. ~1 s."""
    import ast
    import importlib
    import importlib.util

    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "kernels" / "flash-triton").glob("*.py")]
    missing = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("attnprof"):
                if importlib.util.find_spec(node.module) is None:
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}")
                    continue
                module = importlib.import_module(node.module)
                for alias in node.names:  # `from attnprof.bench import timing`: a defined name or a submodule
                    if alias.name == "*" or hasattr(module, alias.name):
                        continue
                    if not hasattr(module, "__path__") or importlib.util.find_spec(f"{node.module}.{alias.name}") is None:
                        missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{alias.name}")
            elif isinstance(node, ast.Import):
                missing += [f"{path.relative_to(ROOT)}:{node.lineno}: {a.name}" for a in node.names
                            if a.name.startswith("attnprof") and importlib.util.find_spec(a.name) is None]
    assert not missing, "\n".join(missing)
