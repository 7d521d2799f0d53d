# Two commands set up everything on a fresh machine: `make demo` and `make test`.
# Both create (or reuse) the project's virtual environment in .venv and install what they need.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# one pytest-xdist worker per usable core (at most 4; each test file on one worker, so a file's
# fixtures are built once); PYTEST_ARGS="-n 0" runs the suite in one process
XDIST := -n auto --maxprocesses 4 --dist loadfile

.PHONY: demo test test-fast bench bench-gpu gpu-wheels install clean help

help:
	@echo "make demo   - train five residual schemes on the embedded digits and compare them"
	@echo "make test   - run the whole test suite (slow tests included)"
	@echo "make bench  - benchmark harness -> benchmarks/RESULTS.md; BENCH_ARGS=\"--no-compile\", or \"--quick --markdown-tag quick\" (a smoke run in a block of its own)"
	@echo "make bench-gpu - the GPU checks and tables in one run (~8 min), with the machine's own python and torch"
	@echo "make gpu-wheels - wheels of what a GPU machine without a package registry lacks, into .whl/"

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall when the dependency list changes. uv installs the wheels (5 s from its cache) without
# compiling them: of their 15,700 modules the suite and the demo import about 4,400, which Python
# compiles once, when first imported (20 s of one core), where compiling all of them at install took
# 48 s of both cores. Where uv cannot be had, pip does it (--no-compile: it would compile every file
# one after another). The project's own modules are compiled here, on every core; like pip's own
# step, compileall passes over the few files that do not compile.
UV := $(VENV)/bin/uv
EXTRAS := -e ".[test,bench,export]"
$(STAMP): pyproject.toml | $(PY)
	@$(PY) -m pip install --quiet "uv>=0.13,<0.14" && $(UV) pip install --quiet --python $(PY) $(EXTRAS) \
		|| { echo "uv unavailable: installing with pip"; $(PY) -m pip install --quiet --upgrade pip \
		&& $(PY) -m pip install --quiet --no-compile $(EXTRAS); }
	-$(PY) -m compileall -qq -j 0 rescale_core tasks tests benchmarks tools > /dev/null
	@touch $(STAMP)

# Test data shipped in registry packages, fetched here because the tests run offline (tests/no_network.py)
# and read it from the environment's test-data folder: the imgaug wheel's annotated photo (detection).
TEST_DATA := $(VENV)/test-data
IMGAUG_WHEEL := $(TEST_DATA)/imgaug-0.4.0-py2.py3-none-any.whl

$(IMGAUG_WHEEL): | $(PY)
	$(PY) -m pip download --quiet --no-deps --disable-pip-version-check imgaug==0.4.0 -d $(TEST_DATA)

install: $(STAMP)

# Bytecode written even where PYTHONDONTWRITEBYTECODE is set: the packages' modules are compiled when
# first imported (see the install) and kept in the environment, not compiled again on every run; and
# pytest keeps each test module as it rewrote it for its asserts, so the second worker (and the next
# run) loads it instead of rewriting it again (collection measured 6.4 s against 11 s per worker)
WRITE_BYTECODE := env -u PYTHONDONTWRITEBYTECODE

demo: $(STAMP)
	$(WRITE_BYTECODE) $(VENV)/bin/rescale demo

PYTEST := $(WRITE_BYTECODE) $(PY) -m pytest

test: $(STAMP) $(IMGAUG_WHEEL)
	$(PYTEST) $(XDIST) $(PYTEST_ARGS)

test-fast: $(STAMP) $(IMGAUG_WHEEL)
	$(PYTEST) $(XDIST) -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m benchmarks --markdown benchmarks/RESULTS.md $(BENCH_ARGS)

# No virtual environment: a GPU machine lent for a short run has its own torch and no package
# registry. GPU_PYTHON: the interpreter whose torch sees the GPU. Wheels found in .whl/ (what
# `make gpu-wheels` downloads) are installed into .whl/site first and imported from there.
GPU_PYTHON ?= python3
GPU_SITE := .whl/site
bench-gpu:
	@if ls .whl/*.whl >/dev/null 2>&1; then \
		$(GPU_PYTHON) -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target $(GPU_SITE) .whl/*.whl; fi
	PYTHONPATH="$(CURDIR)/$(GPU_SITE)$${PYTHONPATH:+:$$PYTHONPATH}" $(GPU_PYTHON) -m benchmarks.gpu $(BENCH_ARGS)

# The project's dependencies that a GPU machine's own image lacks (docs/speed.md, "On a GPU
# machine"), as wheels for its Python (GPU_WHEELS_PYTHON) on x86-64 Linux, into .whl/ (about 38 MB);
# the specifiers are pyproject.toml's (tests/benchmarks/test_bench_gpu.py checks).
GPU_WHEELS ?= "jsonargparse>=4.40,<5" docstring-parser typeshed-client "av>=14" "pycocotools>=2.0.11,<3" \
	"scikit-video==1.1.11"
GPU_WHEELS_PYTHON ?= 3.12
gpu-wheels: $(STAMP)
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version $(GPU_WHEELS_PYTHON) \
		--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 -d .whl $(GPU_WHEELS)

clean:
	rm -rf $(VENV) runs demo_output .pytest_cache
