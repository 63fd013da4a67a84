# Every target creates .venv when missing and installs into it what it runs (docs/install.md), one stamp each:
# `make run` the runtime alone (the project and its dependencies: a venv of 0.68 GiB, not 1.95, and a third of
# the time to the demo's first call, BENCHMARKS.md); `make test`, `test-fast`, `lint`, `typecheck`,
# `bench` and `venv` everything a developer uses too (the cluster, test and docs extras). The full install
# stamps both, so `make run` after `make test` installs nothing; `make test` after `make run` adds the extras.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME_STAMP := $(VENV)/.installed-runtime
DEV_STAMP := $(VENV)/.installed-dev
DEV_EXTRAS := cluster,test,docs
CONFIG ?= configs/demo.toml

.PHONY: run test test-fast lint typecheck bench clean venv

venv: $(DEV_STAMP)

# The demo waits for this one, so it does no more than it must: the venv's own pip installs the project (PEP 660
# editable; no `--upgrade pip`), and --no-compile leaves each module's bytecode to its first import (a third of
# the install's time went to compiling all of Ray and pyarrow; the demo's first run, compiling what it imports,
# took 13.8 s, as did its second).
$(RUNTIME_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-compile -e .
	touch $(RUNTIME_STAMP)

$(DEV_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(DEV_EXTRAS)]'
	touch $(DEV_STAMP) $(RUNTIME_STAMP)

run: $(RUNTIME_STAMP)
	$(BIN)/punchline run $(CONFIG)

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

# The suite runs as on a stranger's machine: HOME and the XDG folders point at a new, empty folder (removed
# afterwards), so nothing of the developer's (a ~/.ray token, a cache, a config) can be what makes a test pass.
define EMPTY_HOME
tmp=$$(mktemp -d -t punchline-home.XXXXXX) && trap 'rm -rf "$$tmp"' EXIT && \
	export HOME="$$tmp" XDG_CACHE_HOME="$$tmp/.cache" XDG_CONFIG_HOME="$$tmp/.config" XDG_DATA_HOME="$$tmp/.local/share" && \
	unset RAY_AUTH_TOKEN RAY_AUTH_TOKEN_PATH RAY_AUTH_MODE RAY_ADDRESS
endef

# Three pytest workers, a whole test file each: the tests mostly wait on processes they start (a two-worker run
# used 10 of its 20 min x 2 cores of CPU), so a third worker shortens the wall time (pytest 18 min at load 15 with
# three, 19 min at load 4 with two). PYTEST_WORKERS=1 runs them serially. The 15 slowest tests are listed at the end
# (--durations): where the suite's 20 minutes go.
PYTEST_WORKERS ?= 3

test: $(DEV_STAMP) lint typecheck
	$(EMPTY_HOME) && $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=15

# The quick check before a commit: lint, types and every test not marked `slow` (no multi-process
# cluster, no local Ray, no whole-pipeline fault runs). `make test` stays the whole suite.
# Four workers: the fast tests are short and mostly wait on Redis, moto and the fake provider (2:35 against
# 3:02 with two, on two cores at load 3.5).
FAST_WORKERS ?= 4

test-fast: $(DEV_STAMP) lint typecheck
	$(EMPTY_HOME) && $(BIN)/python -m pytest -q -n $(FAST_WORKERS) --dist loadfile -m "not slow"

bench: $(DEV_STAMP)
	$(BIN)/python bench/engine_vs_loop.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
