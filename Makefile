# The README's commands. `make demo` and `make test` build .venv themselves on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# torch is pinned to the CPU wheel this machine keeps on disk; installed first so the package's range adds nothing.
TORCH ?= torch==2.13.0

.PHONY: demo test test-gpu lint clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,models,cluster]'
	touch $@

demo: $(STAMP)
	$(VENV)/bin/attnprof stages

test: $(STAMP)
	$(PY) -m pytest -q -m "not cuda"

# On the GPU machine there is no venv: the image's python3 already has torch, triton and transformers.
GPU_PY := $(if $(wildcard $(PY)),$(PY),python3)
test-gpu:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) -m pytest -q -m cuda tests/

# ruff, then the layer and no-cycle contracts of pyproject.toml ([tool.importlinter]) over this checkout's src/
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests
	PYTHONPATH=src $(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf $(VENV) attnprof-report .pytest_cache
