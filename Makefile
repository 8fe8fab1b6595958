# Two commands do the whole set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP_QUIET := -q --disable-pip-version-check
STAMP := $(VENV)/.installed-$(shell cat setup.cfg pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install demo test lint bench clean-venv

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_QUIET) --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
	$(PY) -m pip install $(PIP_QUIET) -e '.[test,seqio]' 2>&1 | grep -vE "^WARNING: Location|^ *$$" || true
	$(PY) -c "import gated_attention, jax, flax, optax, grain, pytest" 
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m gated_attention.demo --workdir=runs/demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP) lint
	$(PY) -m pytest -q -n 2 --dist=loadfile tests

bench: $(STAMP)
	$(PY) benchmarks/train_step.py
	$(PY) benchmarks/attention.py

clean-venv:
	rm -rf $(VENV)
