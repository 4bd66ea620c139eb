# raysim: `make demo` installs into .venv and runs the quickstart; `make test` runs the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-slow report clean

setup: $(VENV)/.installed

# torch first, pinned: 2.13.0 is the CPU build on disk; an unpinned torch pulls a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $@

demo: setup
	$(VENV)/bin/raysim run configs/fedavg/quickstart.yaml --out runs/quickstart
	$(VENV)/bin/raysim report runs/quickstart

test: setup
	$(PY) -m pytest

test-slow: setup
	$(PY) -m pytest -m slow

clean:
	rm -rf runs .pytest_cache
