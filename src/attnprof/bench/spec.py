"""The sweep grid: which variants on which workloads, from comma-separated flags or a TOML file.

A grid is the cartesian product of its lists (variants × seq × batch × heads × head-dim × dtype × causal).
`tokens` replaces the batch list with `batch = tokens // seq` per sequence length, as the FlashAttention
benchmarks do (B·S = 16k tokens), so every cell does the same work per token and the curves compare.

A TOML sweep file holds the same keys at its top level, each a scalar or a list:

    variants = ["naive", "sdpa"]
    seq = [512, 1024, 2048]
    heads = 16
    head_dim = 128
    dtype = "bf16"
    causal = true
    tokens = 16384      # or: batch = [1, 4]

Flags given on the command line override the file's keys. A malformed file is a UsageError naming the line.
"""

from __future__ import annotations

import itertools
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprof.errors import UsageError
from attnprof.variants import Variant, resolve_variants
from attnprof.workload import Workload, dtype_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

KEYS = ("variants", "seq", "batch", "heads", "head_dim", "dtype", "causal", "tokens")
INT_KEYS = ("seq", "batch", "heads", "head_dim")


@dataclass(frozen=True)
class Cell:
    """One point of the sweep: a variant on a workload. `tokens` is set when batch came from B·S = tokens."""

    variant: Variant
    workload: Workload
    tokens: int | None = None

    @property
    def key(self) -> str:
        return cell_key(self.variant.name, self.workload.to_json())


def cell_key(variant: str, workload: dict) -> str:
    """Stable identity of a cell across runs and files: variant + every workload field that changes the work."""
    w = workload
    return (f"{variant}|{w['batch']}x{w['heads']}/{w['kv_heads']}x{w['seq']}/{w['kv_seq']}x{w['head_dim']}"
            f"|{w['dtype']}|{'causal' if w['causal'] else 'full'}|{w.get('mask', 'none')}|{w['device']}"
            f"{'|strided' if w.get('transposed') else ''}")


@dataclass(frozen=True)
class Grid:
    variants: tuple[str, ...]
    seq: tuple[int, ...]
    batch: tuple[int, ...]
    heads: tuple[int, ...]
    head_dim: tuple[int, ...]
    dtype: tuple[str, ...]
    causal: tuple[bool, ...]
    tokens: int | None = None

    def cells(self, device: str) -> list[Cell]:
        """Workload-major order; within a workload `naive` and `sdpa` first, so speedups are known as rows land."""
        variants = resolve_variants(",".join(self.variants))
        variants.sort(key=lambda v: {"naive": 0, "sdpa": 1}.get(v.name, 2))
        out: list[Cell] = []
        for dtype, causal, heads, dim, seq in itertools.product(self.dtype, self.causal, self.heads, self.head_dim,
                                                                 self.seq):
            batches = (max(1, self.tokens // seq),) if self.tokens else self.batch
            for batch in batches:
                w = Workload(batch=batch, heads=heads, seq=seq, head_dim=dim, dtype=dtype, causal=causal,
                             device=device)
                out.extend(Cell(v, w, self.tokens) for v in variants)
        if not out:
            raise UsageError("the sweep grid is empty: every key needs at least one value")
        return out


def default_grid(device: str) -> dict[str, Any]:
    """What `attnprof bench` sweeps with no grid given: seconds on a CPU, the published convention on a GPU."""
    if device.startswith("cuda"):
        return {"variants": ["naive", "inplace", "sdpa", "flex"], "seq": [512, 1024, 2048, 4096, 8192],
                "tokens": 16384, "batch": [1], "heads": [16], "head_dim": [128], "dtype": ["bf16"], "causal": [True]}
    return {"variants": ["naive", "inplace", "sdpa"], "seq": [128, 256, 512], "batch": [1], "heads": [4],
            "head_dim": [64], "dtype": ["fp32"], "causal": [True], "tokens": None}


def split_list(text: str, flag: str) -> list[str]:
    """`"a, b,c"` → `["a", "b", "c"]`; an empty list is a UsageError naming the flag."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"{flag} is empty; give a comma-separated list")
    return items


def load_toml(path: Path) -> dict[str, Any]:
    """Read a sweep file; a syntax error is reported with its line, an unknown key by name."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UsageError(f"sweep file {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"sweep file {path}: cannot read it ({exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        where = f"line {m.group(1)}, column {m.group(2)}" if m else "somewhere (tomllib gave no line)"
        raise UsageError(f"sweep file {path}, {where}: {re.sub(r' ?[(]at line .*[)]', '', msg)}") from None
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        line = _line_of(text, unknown[0])
        raise UsageError(f"sweep file {path}, line {line}: unknown key {unknown[0]!r}; valid keys: {', '.join(KEYS)}")
    return {k: (v if isinstance(v, list) or k == "tokens" else [v]) for k, v in data.items()}


def _line_of(text: str, key: str) -> int | str:
    for number, line in enumerate(text.splitlines(), 1):
        if re.match(rf"\s*{re.escape(key)}\s*=", line):
            return number
    return "?"


def build_grid(device: str, *, file: Path | None = None, **flags: str | bool | int | None) -> Grid:
    """Defaults for the device, then the TOML file, then the flags (comma-separated strings, `causal`, `tokens`)."""
    if flags.get("batch") is not None and flags.get("tokens") is not None:
        raise UsageError("--batch and --tokens both given; --tokens sets batch = tokens // seq, so pick one")
    raw = default_grid(device)
    if file is not None:
        given = load_toml(file)
        if "batch" in given and "tokens" not in given:
            given["tokens"] = None
        raw.update(given)
    for key in ("variants", "seq", "batch", "heads", "head_dim", "dtype"):
        text = flags.get(key)
        if text is not None:
            raw[key] = split_list(str(text), f"--{key.replace('_', '-')}")
            if key == "batch" and flags.get("tokens") is None:
                raw["tokens"] = None
    if flags.get("causal") is not None:
        raw["causal"] = [bool(flags["causal"])]
    if flags.get("tokens") is not None:
        raw["tokens"] = flags["tokens"]
    return _validate(raw)


def _validate(raw: dict[str, Any]) -> Grid:
    where = "sweep grid"
    for key in KEYS:
        if key != "tokens" and not raw.get(key):
            raise UsageError(f"{where}: {key.replace('_', '-')} is empty, so the grid is empty")
    ints: dict[str, tuple[int, ...]] = {}
    for key in INT_KEYS:
        values = []
        for v in raw[key]:
            try:
                n = int(v) if not isinstance(v, bool) else None
            except (TypeError, ValueError):
                n = None
            if n is None or n <= 0 or (isinstance(v, float) and v != n):
                raise UsageError(f"{where}: {key.replace('_', '-')} values must be positive integers, got {v!r}")
            values.append(n)
        ints[key] = tuple(dict.fromkeys(values))
    tokens = raw.get("tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0):
        raise UsageError(f"{where}: tokens must be a positive integer, got {tokens!r}")
    causal = []
    for v in raw["causal"]:
        if not isinstance(v, bool):
            raise UsageError(f"{where}: causal must be true or false, got {v!r}")
        causal.append(v)
    return Grid(variants=tuple(dict.fromkeys(str(v) for v in raw["variants"])), seq=ints["seq"],
                batch=ints["batch"], heads=ints["heads"], head_dim=ints["head_dim"],
                dtype=tuple(dict.fromkeys(dtype_name(str(d)) for d in raw["dtype"])),
                causal=tuple(dict.fromkeys(causal)), tokens=tokens)
