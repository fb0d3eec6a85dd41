# dsa-bench developer commands. `make run` and `make test` install what they need first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch wheel to install when none is present. On a machine without an NVIDIA driver, where the
# default index may serve a multi-GB CUDA build, TORCH_INDEX=https://download.pytorch.org/whl/cpu
# takes the CPU wheel instead (install prints this hint; it does not reach for that index itself,
# which machines without internet access cannot reach).
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
WORKLOAD ?= indexer_h64
# The flashinfer-bench release whose models and builders judge dsa-bench's packed solutions and
# exported traces in the tests (docs/flashinfer_bench.md). `install-dev` adds it with --no-deps: its
# declared dependencies (flashinfer-python, apache-tvm-ffi, a PyPI torch) are GPU stacks those
# checks never import, and torch stays as installed.
FLASHINFER_BENCH_VERSION ?= 0.1.2
ARGS ?=

.PHONY: install install-dev run test test-all test-gpu lint clean

# `make install` (and `make run`): the runtime only. `make install-dev` (and the test targets) adds
# the test tools, Ray and flashinfer-bench's models on top.
install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if $(PY) -c "import torch" 2>/dev/null; then \
		echo "torch already installed: $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(PY) -m pip install torch; \
	else \
		$(if $(TORCH_INDEX),,echo "no NVIDIA driver: installing $(TORCH_SPEC); if pip fetches a multi-GB CUDA build, stop it and run make again with TORCH_INDEX=https://download.pytorch.org/whl/cpu";) \
		$(PY) -m pip install "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)); \
	fi
	$(PY) -m pip install -e .
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(PY) -m pip install -e ".[gpu]"; fi
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -e ".[dev,ray]"  # Ray: the --executor ray tests run in CI
	$(PY) -m pip install --no-deps "flashinfer-bench==$(FLASHINFER_BENCH_VERSION)"
	touch $@

run: install
	$(VENV)/bin/dsa-bench run --workload $(WORKLOAD) $(ARGS)

# The README's test command: everything but the `slow` set (toolchain compiles, the Chromium
# render, full-workload runs, tests over ~10 s on 2 cores), over TEST_WORKERS processes
# (pytest-xdist; the tests are hermetic); `test-all` runs the whole suite in one. .ci/run runs both.
TEST_WORKERS ?= 2
test: install-dev
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow" $(ARGS)

test-all: install-dev
	$(PY) -m pytest -q $(ARGS)

test-gpu: install-dev
	$(PY) -m pytest -q -m gpu $(ARGS)

lint: install-dev
	$(VENV)/bin/ruff check dsa_bench tests tools solutions benchmarks
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy dsa_bench

clean:
	rm -rf $(VENV) .cache build *.egg-info
