# Two commands on a fresh machine with pip and Python 3.13 and 3.11 (pyenv's or on PATH):
# `make demo` and `make test`.
#
# treemod is tested at both ends of its supported range: the newest JAX on the newest Python
# (`.venv`, Python 3.13, the newest release of every package) and the oldest JAX and Python that
# pyproject.toml admits (`.venv-oldest`, Python 3.11, the lower bounds pinned in
# `.ci/oldest-constraints.txt`).

# The newest installed Python of a minor version: pyenv's (its shims only answer for the global
# version), else the one on PATH.
find_python = $(or $(shell v=$$(pyenv versions --bare 2>/dev/null | grep -E '^$(subst .,\.,$(1))(\.[0-9]+)?$$' | sort -V | tail -1); [ -n "$$v" ] && PYENV_VERSION=$$v pyenv which python$(1) 2>/dev/null),$(shell command -v python$(1)))
PYTHON ?= $(call find_python,3.13)
PYTHON_OLDEST ?= $(call find_python,3.11)
VENV := .venv
BIN := $(VENV)/bin
VENV_OLDEST := .venv-oldest
BIN_OLDEST := $(VENV_OLDEST)/bin
OLDEST := .ci/oldest-constraints.txt
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check
PIP_OLDEST := $(BIN_OLDEST)/python -m pip install --quiet --disable-pip-version-check

.PHONY: demo test test-fast test-oldest lint typecheck pytest docs serve-docs bench bench-quick clean

$(BIN)/python:
	@test -n "$(PYTHON)" || { echo "make: Python 3.13 not found (pyenv install 3.13, or PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(BIN_OLDEST)/python:
	@test -n "$(PYTHON_OLDEST)" || { echo "make: Python 3.11 not found (pyenv install 3.11, or PYTHON_OLDEST=...)"; exit 1; }
	$(PYTHON_OLDEST) -m venv $(VENV_OLDEST)
	$(BIN_OLDEST)/python -m pip install --quiet --upgrade pip

$(VENV)/.examples: pyproject.toml | $(BIN)/python
	$(PIP) -e '.[examples]'
	touch $@

# jax2onnx (the ONNX tests) without its dependencies: its metadata pins orbax-checkpoint<0.11.37,
# which would downgrade the dev extra's orbax-checkpoint>=0.12, and it never imports Orbax
# (`grep -r orbax` over its source finds nothing). The `onnx` extra lists what it does import.
# GPT-QModel (transformers' loader for GPTQ and AWQ checkpoints, the reference that reads back
# what treemod saves) without its dependencies: its metadata pulls datasets, pyarrow, torchao and
# build tools that loading never imports; these seven packages are what loading imports. They go
# to their own folder, which only the reference's subprocess puts on its path
# (tests/quant/hub_checks.py): GPT-QModel patches transformers' and safetensors' globals when
# imported, and PEFT imports it whenever it is importable, so in the venv it would change other
# tests' transformers models.
REFERENCE_LOADERS := gptqmodel==7.7.0 optimum==2.3.0 logbar==0.4.15 device-smi==0.5.7 \
	tokenicer==0.0.14 pypcre==0.6.4 defuser==0.0.28
$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(PIP) -e '.[dev,torch,examples,onnx]'
	$(PIP) --no-deps jax2onnx==0.17.1
	$(PIP) --no-deps --upgrade --target $(VENV)/reference-loaders $(REFERENCE_LOADERS)
	touch $@

$(VENV_OLDEST)/.dev: pyproject.toml $(OLDEST) | $(BIN_OLDEST)/python
	$(PIP_OLDEST) -c $(OLDEST) -e '.[dev,torch,examples]'
	touch $@

$(VENV)/.bench: pyproject.toml | $(BIN)/python
	$(PIP) -e '.[dev,bench]'
	touch $@

demo: $(VENV)/.examples
	$(BIN)/python examples/digits_cnn.py

lint: $(VENV)/.dev
	$(BIN)/ruff check treemod tests benchmarks examples
	$(BIN)/ruff format --check treemod tests benchmarks examples

typecheck: $(VENV)/.dev
	$(BIN)/mypy

# --dist loadfile: each test file runs on one worker, so its module-scoped fixtures (a mkdocs
# build, the multi-process runs) are computed once. --no-loadscope-reorder: the files in the
# order conftest.py gives, those with heavy or slow tests first (xdist's own order, most tests
# first, left a few long files to the end for one worker). --max-worker-restart=0: a worker
# that dies (a segfault, or pyproject's faulthandler_timeout) ends the run with the test named;
# replacing it makes pytest-xdist 3.8's loadfile scheduler wait forever (xdist issues 784, 1378).
# tests/resume.py then runs the crashed and unfinished tests again (jaxlib 0.12.0.1 segfaults now
# and then inside XLA's compiler); a test that crashes twice, or any failure, fails the run.
PYTEST := tests/resume.py
PYTEST_ARGS := -n 2 --dist loadfile --no-loadscope-reorder --max-worker-restart=0 tests benchmarks/tests treemod
FAST := -m "not heavy and not slow"

# The whole suite on the newest end (deprecation warnings raised from treemod's code are errors:
# pyproject's filterwarnings).
pytest: $(VENV)/.dev
	$(BIN)/python $(PYTEST) $(PYTEST_ARGS)

# The oldest end: the suite without the tests that start processes or tools or compile several
# libraries' models (those test tools and references, not the JAX version). The rule
# (DEVELOPERS.md, "What the oldest end runs"): every test whose outcome can change with the JAX
# version runs here; a file whose subject is a zoo family's agreement with transformers or
# torchvision is `slow`, its layers, transforms and loading code being tested here by their own
# files.
test-oldest: $(VENV_OLDEST)/.dev
	$(BIN_OLDEST)/python $(PYTEST) $(PYTEST_ARGS) $(FAST)

# The edit-test loop: pytest on the newest end without the tests marked heavy (processes, mypy,
# mkdocs, examples) or slow (several libraries' models); `make test` runs everything.
test-fast: $(VENV)/.dev
	$(BIN)/python $(PYTEST) $(PYTEST_ARGS) $(FAST)

docs: $(VENV)/.dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

serve-docs: $(VENV)/.dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

test: lint typecheck pytest test-oldest docs

bench: $(VENV)/.bench
	$(BIN)/python -m benchmarks.run

bench-quick: $(VENV)/.bench
	$(BIN)/python -m benchmarks.run --quick

clean:
	rm -rf $(VENV) $(VENV_OLDEST) site .pytest_cache .mypy_cache .ruff_cache
