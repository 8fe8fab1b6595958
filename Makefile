# Two commands do the whole set-up on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
# pip's site config prints one harmless "Location ... is ignored" warning per package.
QUIET_PIP := { grep -vE '^WARNING: Location|^ *$$' || true; }
HASH := $(shell cat setup.cfg pyproject.toml | cksum | cut -d' ' -f1)
CORE_STAMP := $(VENV)/.core-$(HASH)
TEST_STAMP := $(VENV)/.test-$(HASH)

.PHONY: install install-test demo test test-fast lint bench clean-venv

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip 2>&1 | $(QUIET_PIP)

# The core (what `make demo` needs): jax, flax, optax, orbax, grain, sentencepiece, ...
$(CORE_STAMP): setup.cfg pyproject.toml | $(VENV)/bin/python
	$(PIP) -e . 2>&1 | $(QUIET_PIP)
	$(PY) -c "import gated_attention, jax, flax, optax, orbax.checkpoint, grain, sentencepiece"
	rm -f $(VENV)/.core-* && touch $@

# Tests also need pytest, ruff, nbclient, shellcheck and the optional seqio/tensorflow stack.
# libtpu (jax[tpu] pinned to the installed jax) lets the suite compile for real TPU targets
# on this CPU-only machine (deviceless topologies); it needs no TPU to install.
$(TEST_STAMP): $(CORE_STAMP)
	$(PIP) -e '.[test,seqio]' 2>&1 | $(QUIET_PIP)
	$(PIP) "jax[tpu]==$$($(PY) -c 'import jax; print(jax.__version__)')" 2>&1 | $(QUIET_PIP)
	$(PY) -c "import pytest, xdist, nbclient, seqio, tensorflow_datasets, libtpu"
	rm -f $(VENV)/.test-* && touch $@

install: $(CORE_STAMP)
install-test: $(TEST_STAMP)

demo: $(CORE_STAMP)
	$(PY) -m gated_attention.demo --workdir=runs/demo

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .

test: $(TEST_STAMP) lint
	$(PY) -m pytest -q -rs -n 2 --dist=loadfile tests

# The development loop: the suite without the tests marked slow (the longer trainings).
test-fast: $(TEST_STAMP)
	$(PY) -m pytest -q -rs -n 2 --dist=loadfile -m "not slow" tests

bench: $(CORE_STAMP)
	$(PY) benchmarks/train_step.py
	$(PY) benchmarks/attention.py
	$(PY) benchmarks/moe.py

clean-venv:
	rm -rf $(VENV)
