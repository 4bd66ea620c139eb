# raysim: `make demo` installs into .venv and runs the quickstart; `make test` runs the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
FLOWER_VENV ?= .venv-flower
PFL_VENV ?= .venv-pfl

.PHONY: setup demo test test-slow typecheck lock report clean bench-peers

setup: $(VENV)/.installed

# torch first, pinned: 2.13.0 is the CPU build on disk; an unpinned torch pulls a multi-GB CUDA build.
# Everything else at the versions in constraints.txt: the ones the test suite last passed with.
$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	touch $@

# Try the newest versions pyproject.toml allows: install them in a scratch venv, write their versions
# to constraints.txt, then run the test suite on a fresh .venv built from it (git diff shows what moved;
# git checkout constraints.txt undoes it).
lock:
	rm -rf .venv-lock
	python3 -m venv .venv-lock
	.venv-lock/bin/pip install -q torch==2.13.0
	.venv-lock/bin/pip install -q --upgrade -e '.[test]'
	( echo "# pip constraints: the versions \`make test\` passed with. Refresh with \`make lock\`."; \
	  .venv-lock/bin/pip freeze --exclude-editable | sed 's/+cpu$$//' ) > constraints.txt
	rm -rf .venv-lock $(VENV)
	$(MAKE) test

demo: setup
	$(VENV)/bin/raysim run configs/fedavg/quickstart.yaml --out runs/quickstart
	$(VENV)/bin/raysim report runs/quickstart

# Two workers, a test file each at a time (module fixtures such as the two-node cluster start once): the
# suite waits on process and Ray start-ups more than it computes, so on 2 cores it takes about 3.5-4 minutes (1,272 tests), not twice that.
test: setup
	$(PY) -m pytest -n 2 --dist loadfile

test-slow: setup
	$(PY) -m pytest -m slow

# mypy on the package as installed (also part of `make test`)
typecheck: setup
	$(PY) -m pytest tests/test_typing.py -q

# Flower for the peer benchmark, in a virtual environment of its own (flwr pins its own ray), so raysim's
# dependencies stay clean; torch is the same 2.13.0 CPU build.
$(FLOWER_VENV)/.installed: benchmarks/flower-constraints.txt
	python3 -m venv $(FLOWER_VENV)
	$(FLOWER_VENV)/bin/pip install -q torch==2.13.0
	$(FLOWER_VENV)/bin/pip install -q -c benchmarks/flower-constraints.txt 'flwr[simulation]==1.42.0'
	touch $@

# Apple's pfl-research for the peer benchmark, in a virtual environment of its own too (pfl 0.6 pins packaging
# below 26, raysim's has 26.3); torch is the same 2.13.0 CPU build, for pfl's PyTorch backend.
$(PFL_VENV)/.installed: benchmarks/pfl-constraints.txt
	python3 -m venv $(PFL_VENV)
	$(PFL_VENV)/bin/pip install -q torch==2.13.0
	$(PFL_VENV)/bin/pip install -q -c benchmarks/pfl-constraints.txt 'pfl[pytorch]==0.6.0'
	touch $@

# raysim, Flower, pfl, the plain torch loop and the vectorized limit on one task, side by side (CPU-heavy,
# about 20 minutes on 2 idle cores): prints issues 17 and 30's table and writes benchmarks/results/peers.md.
bench-peers: setup $(FLOWER_VENV)/.installed $(PFL_VENV)/.installed
	$(PY) benchmarks/speed.py --flower $(FLOWER_VENV)/bin/python --pfl $(PFL_VENV)/bin/python --rounds 10 --repeats 3

clean:
	rm -rf runs .pytest_cache
