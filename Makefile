# The README's commands. `make demo` and `make test` build .venv themselves on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# torch is pinned to the CPU wheel this machine keeps on disk; installed first so the package's range adds nothing.
TORCH ?= torch==2.13.0

.PHONY: demo test test-gpu test-sass-gpu-triton lint clean

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

# The sm_90 machine-code checks (no GPU needed) compiled with the GPU image's Triton instead of the venv's: its ptxas
# schedules differently (kernels/flash-triton/TUNING.md step 31). Its wheel comes from the package registry (~190 MB,
# once) and is put ahead of the venv's on PYTHONPATH.
GPU_TRITON ?= 3.6.0
GPU_TRITON_DIR := .triton-gpu/$(GPU_TRITON)
$(GPU_TRITON_DIR)/triton/__init__.py: | $(STAMP)
	$(PY) -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d $(GPU_TRITON_DIR).whl \
		triton==$(GPU_TRITON)
	$(PY) -m zipfile -e $(GPU_TRITON_DIR).whl/triton-$(GPU_TRITON)-*.whl $(GPU_TRITON_DIR)
	chmod +x $(GPU_TRITON_DIR)/triton/backends/nvidia/bin/*
test-sass-gpu-triton: $(GPU_TRITON_DIR)/triton/__init__.py
	PYTHONPATH=$(GPU_TRITON_DIR) $(PY) -c "import triton; print('Triton', triton.__version__, 'from', triton.__file__)"
	PYTHONPATH=$(GPU_TRITON_DIR):src:tests $(PY) -m pytest -q -p no:cacheprovider tests/test_kernel_gluon.py \
		tests/test_kernel_gluon_fp8.py tests/test_kernel_serving_sm90.py

# ruff, then the layer and no-cycle contracts of pyproject.toml ([tool.importlinter]) over this checkout's src/
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests
	PYTHONPATH=src $(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf $(VENV) attnprof-report .pytest_cache
