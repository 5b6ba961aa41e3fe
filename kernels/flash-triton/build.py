"""Lay the kernel source out as a Hugging Face kernel repo: `build/<variant>/` with `metadata.json`.

A Triton kernel has no compiled artifact, so each build variant is a copy of `torch-ext/flash_triton/` plus its
`metadata.json`: the `kernels` library's noarch layout (`torch-<backend>`), the same one kernel-builder writes.
  build/torch-cuda/   loaded on CUDA builds of PyTorch (compiled by Triton on first call)
  build/torch-cpu/    loaded on CPU builds; runs only under Triton's interpreter (TRITON_INTERPRET=1)
The metadata `id` carries a hash of the sources, so a stale build is visible; `--check` fails when `build/` does
not match the sources (the tests run it). Run from anywhere: `python kernels/flash-triton/build.py`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent
SOURCE = REPO / "torch-ext" / "flash_triton"
NAME = "flash-triton"
VERSION = 1
BACKENDS = ("cuda", "cpu")


def sources() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(SOURCE.glob("*.py"))}


def metadata(backend: str, files: dict[str, bytes]) -> dict:
    digest = hashlib.sha256(b"".join(name.encode() + body for name, body in files.items())).hexdigest()[:7]
    return {
        "name": NAME,
        "id": f"_{NAME.replace('-', '_')}_{backend}_{digest}",
        "version": VERSION,
        "license": "apache-2.0",
        "python-depends": [],  # Triton ships with PyTorch; `kernels` only knows its own dependency names
        "backend": {"type": backend},
    }


def expected() -> dict[Path, bytes]:
    files = sources()
    out: dict[Path, bytes] = {}
    for backend in BACKENDS:
        variant = Path("build") / f"torch-{backend}"
        for name, body in files.items():
            out[variant / name] = body
        out[variant / "metadata.json"] = (json.dumps(metadata(backend, files), indent=2) + "\n").encode()
    return out


def stale() -> list[str]:
    """Paths under build/ that differ from what the sources produce (missing, changed or extra)."""
    want = expected()
    have = {p.relative_to(REPO): p.read_bytes() for p in (REPO / "build").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}
    return sorted(str(p) for p in set(want) | set(have) if want.get(p) != have.get(p))


def write() -> None:
    shutil.rmtree(REPO / "build", ignore_errors=True)
    for rel, body in expected().items():
        (REPO / rel).parent.mkdir(parents=True, exist_ok=True)
        (REPO / rel).write_bytes(body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when build/ is out of date")
    args = parser.parse_args()
    if args.check:
        bad = stale()
        if bad:
            print(f"{REPO}/build is out of date ({', '.join(bad)}); run python {Path(__file__).name}",
                  file=sys.stderr)
            return 1
        return 0
    write()
    print(f"wrote {REPO / 'build'}: " + ", ".join(f"torch-{b}" for b in BACKENDS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
