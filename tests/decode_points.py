"""`measure_static_decode` for tests that check what a production-decode row says (status, graph breaks, which cache
the kernel read), not its speed."""

from __future__ import annotations


def static_decode_point(*args, attempts: int = 3, **kwargs):
    """The row of `attnprof.serving.loops.measure_static_decode(*args, **kwargs)`. Its ms/token is the difference of
    two timed calls, which a busy CPU can invert (`CheckFailed`: "timing noise"); such a row is measured again, up to
    `attempts` times. Any other failure is raised at once."""
    from attnprof.errors import CheckFailed
    from attnprof.serving.loops import measure_static_decode

    for attempt in range(attempts):
        try:
            return measure_static_decode(*args, **kwargs)
        except CheckFailed as err:
            if "timing noise" not in str(err) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")
