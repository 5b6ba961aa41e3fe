"""Request streams for the serving loop: seeded Poisson (or bursty) arrivals with log-normal lengths, or a user's own
traffic replayed from a JSONL file.

Every attention implementation must be served the same stream, or their tokens/s are not comparable: a stream is a
pure function of its parameters and seed. The arrival process is `vllm bench serve`'s: exponential gaps at `rate`
requests/s (a Poisson process), gamma-distributed gaps with the same mean when `burstiness` != 1 (below 1 burstier,
above 1 more even), and `rate=inf` sends everything at once. Unlike vLLM the first request arrives at 0 and the gaps
are not rescaled. This is `attnprof serve`'s stream (`serving/settings.py` draws it, `serving/continuous.py` serves it):
per request one prompt draw, one output draw, then one gap, so the same flags and seed draw the same stream as every
report in docs/results/serve/ and docs/results/continuous-batching/ (tests/test_serve_stream_pin.py holds it to a frozen copy of those draws).

A request file replays a user's traffic shape, one JSON object a line:

    {"prompt_tokens": 512, "output_tokens": 128, "arrival_s": 0.0}

`arrival_s` is optional, on every line or on none (then arrivals are drawn at `rate`). Anything else in a line is an
error naming `file:line`, raised as `UsageError` (exit 2) before any model is built: a typo like `"promt_tokens"`
must not turn into a silently different stream.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from attnprof.errors import UsageError

FILE_KEYS = ("prompt_tokens", "output_tokens", "arrival_s")


@dataclass(frozen=True)
class Request:
    """One request of a stream. `source` names where it came from ("reqs.jsonl:7"), None for a drawn one."""

    arrival_s: float  # seconds after the stream starts
    prompt_tokens: int
    output_tokens: int
    source: str | None = None


@dataclass(frozen=True)
class Lengths:
    """Token counts drawn log-normal: `median`, `sigma` of the log (0: always the median), clipped to [1, `max`].

    `max` None means 4× the median (the CLI's default). `flag` is the CLI prefix used in error messages.
    """

    median: float
    sigma: float = 0.0
    max: int | None = None
    flag: str = "--prompt"

    def __post_init__(self) -> None:
        if not (isinstance(self.median, (int, float)) and math.isfinite(self.median) and self.median >= 1):
            raise UsageError(f"{self.flag}-median must be at least 1 token, got {self.median}")
        if not (isinstance(self.sigma, (int, float)) and math.isfinite(self.sigma) and self.sigma >= 0):
            raise UsageError(f"{self.flag}-sigma must be a number >= 0, got {self.sigma}")
        if self.max is not None and (not isinstance(self.max, int) or self.max < 1):
            raise UsageError(f"--max-{self.flag[2:]} must be a whole number >= 1, got {self.max}")

    @property
    def upper(self) -> int:
        return self.max if self.max is not None else max(1, int(4 * self.median))

    def draw(self, rng: random.Random) -> int:
        # lognormvariate is called even when sigma is 0, so every stream consumes the same draws
        return max(1, min(self.upper, round(rng.lognormvariate(math.log(self.median), self.sigma))))


def _check_rate(rate: float, burstiness: float) -> None:
    if not isinstance(rate, (int, float)) or math.isnan(rate) or rate <= 0:
        raise UsageError(f"--rate must be a positive number of requests per second (or inf), got {rate}")
    if not isinstance(burstiness, (int, float)) or not math.isfinite(burstiness) or burstiness <= 0:
        raise UsageError(f"--burstiness must be a positive number (1 = Poisson), got {burstiness}")


def _gap(rng: random.Random, rate: float, burstiness: float) -> float:
    if math.isinf(rate):
        return 0.0
    if burstiness == 1.0:
        return rng.expovariate(rate)
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))  # mean 1/rate, shape = burstiness


def poisson_stream(n: int, rate: float, *, prompt: Lengths, output: Lengths, seed: int = 0,
                   burstiness: float = 1.0) -> list[Request]:
    """`n` requests: the first at 0, then gaps at `rate`/s (see the module docstring); lengths from `prompt`/`output`."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise UsageError(f"--requests must be a whole number >= 1, got {n}")
    _check_rate(rate, burstiness)
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(Request(round(t, 6), prompt.draw(rng), output.draw(rng)))
        t += _gap(rng, rate, burstiness)
    return out


def load_request_file(path: str | Path, *, rate: float | None = None, seed: int = 0,
                      burstiness: float = 1.0) -> list[Request]:
    """The requests of a JSONL file, sorted by arrival; arrivals drawn at `rate` when the file gives none."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such request file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the request file ({exc})") from None
    rows = [_parse_line(line, f"{path}:{no}") for no, line in enumerate(lines, 1) if line.strip()]
    if not rows:
        raise UsageError(f"{path}: no requests in the file")
    timed = [r for r in rows if r.arrival_s >= 0]
    if timed and len(timed) != len(rows):
        where = next(r.source for r in rows if r.arrival_s < 0)
        raise UsageError(f"{where}: arrival_s missing here but given on other lines (give it on every line or none)")
    if timed:
        return sorted(rows, key=lambda r: r.arrival_s)  # stable: equal arrivals keep the file's order
    if rate is None:
        raise UsageError(f"{path} gives no arrival_s: pass --rate (requests per second) to draw the arrivals")
    gaps = poisson_stream(len(rows), rate, prompt=Lengths(1), output=Lengths(1, flag="--output"), seed=seed,
                          burstiness=burstiness)
    return [Request(g.arrival_s, r.prompt_tokens, r.output_tokens, r.source) for g, r in zip(gaps, rows)]


def _parse_line(line: str, where: str) -> Request:
    """One line → Request (arrival_s -1 when the line has none); every problem a UsageError naming `where`."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise UsageError(f'{where}: expected an object like {{"prompt_tokens": 128, "output_tokens": 64}}, '
                         f"got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(FILE_KEYS))
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (a line takes {', '.join(FILE_KEYS)})")
    counts = []
    for key in FILE_KEYS[:2]:
        if key not in obj:
            raise UsageError(f"{where}: {key} is missing")
        v = obj[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UsageError(f"{where}: {key} must be a positive integer, got {v!r}")
        counts.append(v)
    arrival = obj.get("arrival_s")
    if arrival is None and "arrival_s" in obj:
        raise UsageError(f"{where}: arrival_s must be a number of seconds >= 0, got null")
    if arrival is not None and (isinstance(arrival, bool) or not isinstance(arrival, (int, float))
                                or not math.isfinite(arrival) or arrival < 0):
        raise UsageError(f"{where}: arrival_s must be a number of seconds >= 0, got {arrival!r}")
    return Request(-1.0 if arrival is None else float(arrival), counts[0], counts[1], where)


def check_fits(requests: list[Request], max_positions: int) -> None:
    """Every prompt + output must fit the model's positions; the first that does not is named (file:line if any)."""
    for i, r in enumerate(requests):
        if r.prompt_tokens + r.output_tokens > max_positions:
            raise UsageError(f"{r.source or f'request {i}'}: {r.prompt_tokens} prompt + {r.output_tokens} output "
                             f"tokens exceed the model's max_position_embeddings ({max_positions})")


def summary(requests: list[Request]) -> dict:
    """What a report says about the stream: count, arrival span, prompt and output totals, median and max."""
    if not requests:
        raise ValueError("an empty stream has no summary")

    def lengths(xs: list[int]) -> dict:
        s = sorted(xs)
        return {"total": sum(s), "p50": s[len(s) // 2], "max": s[-1]}

    arrivals = [r.arrival_s for r in requests]
    return {"requests": len(requests), "span_s": max(arrivals) - min(arrivals),
            "prompt_tokens": lengths([r.prompt_tokens for r in requests]),
            "output_tokens": lengths([r.output_tokens for r in requests])}
