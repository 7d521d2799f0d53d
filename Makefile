# Two commands set up everything on a fresh machine: `make demo` and `make test`.
# Both create (or reuse) the project's virtual environment in .venv and install what they need.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test test-fast bench bench-gpu install clean help

help:
	@echo "make demo   - train five residual schemes on the embedded digits and compare them"
	@echo "make test   - run the whole test suite (slow tests included)"
	@echo "make bench  - benchmark harness -> benchmarks/RESULTS.md; BENCH_ARGS=\"--quick\" or \"--no-compile\""
	@echo "make bench-gpu - the GPU tables and CUDA-only tests in one run (~8 min), with the machine's own python and torch"

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall when the dependency list changes.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,bench,export]"
	@touch $(STAMP)

# Test data shipped in registry packages, fetched here because the tests run offline (tests/no_network.py)
# and read it from the environment's test-data folder: the imgaug wheel's annotated photo (detection).
TEST_DATA := $(VENV)/test-data
IMGAUG_WHEEL := $(TEST_DATA)/imgaug-0.4.0-py2.py3-none-any.whl

$(IMGAUG_WHEEL): | $(PY)
	$(PY) -m pip download --quiet --no-deps --disable-pip-version-check imgaug==0.4.0 -d $(TEST_DATA)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rescale demo

test: $(STAMP) $(IMGAUG_WHEEL)
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP) $(IMGAUG_WHEEL)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m benchmarks --markdown benchmarks/RESULTS.md $(BENCH_ARGS)

# No virtual environment and no install: a GPU machine lent for a short run has its own torch and
# no package registry. GPU_PYTHON: the interpreter whose torch sees the GPU.
GPU_PYTHON ?= python3
bench-gpu:
	$(GPU_PYTHON) -m benchmarks.gpu $(BENCH_ARGS)

clean:
	rm -rf $(VENV) runs demo_output .pytest_cache
