"""Implementations this torch cannot run on this device, and a compile failure told by its cause.

The model gate's defaults must pass on a correct install: an implementation known to fail on this torch and device,
for a reason that is no bug of the user's setup, is left out of the defaults with that reason printed, and runs when
named explicitly. When one fails to compile, its row names the compiler's first error and the torch version, not
inductor's outer "C++ compile error" (the compiler's own words are thousands of lines below it).

Known failures, by (device type, implementation, torch major.minor):

- CPU, `flex_attention`, torch 2.13: inductor's C++ for flex attention inside `generate` (decode steps over a
  KV cache) does not compile: "'cur_kvSplitSize0' was not declared in this scope". A plain forward compiles, so the
  kernel level (`verify` without `--model`) and `bench` run flex on the CPU.
"""

from __future__ import annotations

import re

import torch

KNOWN_BROKEN: dict[tuple[str, str, str], str] = {
    ("cpu", "flex_attention", "2.13"): (
        "torch {torch}'s CPU inductor cannot compile flex attention inside generate (its C++ fails: "
        "'cur_kvSplitSize0' was not declared in this scope; a plain forward compiles)"),
}

# a compiler diagnostic: "path/file.cpp:1088:45: error: what went wrong" (gcc, clang; "fatal error" included)
_COMPILER_ERROR = re.compile(r"^\S+?:\d+(?::\d+)?: (?:fatal )?error: (?P<what>.+)$", re.MULTILINE)


def torch_minor(version: str | None = None) -> str:
    """ "2.13" of "2.13.0+cpu"."""
    return ".".join((version or torch.__version__).split("+")[0].split(".")[:2])


def left_out(names: list[str], device: str, version: str | None = None) -> tuple[list[str], list[tuple[str, str]]]:
    """`names` without the implementations known to fail on `device` with this torch, and (name, why) for those."""
    kind = device.split(":")[0]
    kept, dropped = [], []
    for name in names:
        why = KNOWN_BROKEN.get((kind, name, torch_minor(version)))
        if why is None:
            kept.append(name)
        else:
            dropped.append((name, why.format(torch=version or torch.__version__)))
    return kept, dropped


def compile_cause(exc: BaseException) -> str | None:
    """The compiler's first error line in the exception's text or its causes' (inductor quotes the compiler's whole
    output), with the torch version: "'x' was not declared in this scope (torch 2.13.0+cpu)"; None when none
    quotes one."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:  # a wrapper's message quotes one line; its cause holds them all
        seen.add(id(exc))
        found = _COMPILER_ERROR.search(str(exc))
        if found is not None:
            return f"{found.group('what').strip()[:200]} (torch {torch.__version__})"
        exc = exc.__cause__ or exc.__context__
    return None
