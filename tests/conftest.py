"""Hardware gates and shared fixtures. `cuda` tests run only where CUDA is (make test-gpu); the rest everywhere."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `make test-gpu` on one)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    yield


def pytest_collection_finish(session):
    """Start the interpreter children of the selected modules that have one (`INTERPRETER_CHILD = True`) in the
    background, in the order the tests will ask for them, while the other tests run (`interpreter_child.prelaunch`)."""
    from interpreter_child import prelaunch

    scripts = {}
    for item in session.items:
        module = getattr(item, "module", None)
        if getattr(module, "INTERPRETER_CHILD", False) and not item.get_closest_marker("cuda"):
            scripts[module.__file__] = None
    prelaunch(list(scripts))


def pytest_sessionfinish(session, exitstatus):
    from interpreter_child import stop

    stop()
