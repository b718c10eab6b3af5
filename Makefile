# Two commands on a fresh machine with Python 3.11 and pip: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check

.PHONY: demo test test-fast lint typecheck pytest docs serve-docs bench bench-quick clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.examples: pyproject.toml | $(BIN)/python
	$(PIP) -e '.[examples]'
	touch $@

$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(PIP) -e '.[dev,torch,examples]'
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
# build, the multi-process runs) are computed once.
PYTEST := $(BIN)/python -m pytest -n 2 --dist loadfile tests benchmarks/tests treemod

pytest: $(VENV)/.dev
	$(PYTEST)

# The edit-test loop: pytest without the tests marked heavy (processes, mypy, mkdocs, examples)
# or slow (several libraries' models); `make test` runs everything.
test-fast: $(VENV)/.dev
	$(PYTEST) -m "not heavy and not slow"

docs: $(VENV)/.dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

serve-docs: $(VENV)/.dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

test: lint typecheck pytest docs

bench: $(VENV)/.bench
	$(BIN)/python -m benchmarks.run

bench-quick: $(VENV)/.bench
	$(BIN)/python -m benchmarks.run --quick

clean:
	rm -rf $(VENV) site .pytest_cache .mypy_cache .ruff_cache
