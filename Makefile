# Two commands do the whole set-up on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
# pip's site config prints one harmless "Location ... is ignored" warning per package.
QUIET_PIP := { grep -vE '^WARNING: Location|^ *$$' || true; }
# install-test's long steps show their progress: one line per package pip collects or
# downloads (with its size), and its errors; not pip's wall of requirement lines.
PIP_STEPS := $(PY) -m pip install --disable-pip-version-check --progress-bar off
PROGRESS := { grep --line-buffered -E '^ *(Collecting|Downloading|Installing collected|Successfully installed|ERROR|error)' || true; }
# `$(call STEP,n/N: what)` says what a step installs before it runs (no commas in it: they
# would split make's arguments); `$(DONE)`, after it, how long it took.
STEP = @echo "install-test $(1)"; date +%s > $(VENV)/.step-start
DONE = @echo "  done in $$(( $$(date +%s) - $$(cat $(VENV)/.step-start) )) s"
HASH := $(shell cat setup.cfg pyproject.toml | cksum | cut -d' ' -f1)
CORE_STAMP := $(VENV)/.core-$(HASH)
TEST_STAMP := $(VENV)/.test-$(HASH)

.PHONY: install install-test demo test test-fast durations lint bench tables clean-venv

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
# Each step says what it installs and how much lands on disk, shows pip's progress and ends
# with its time: the whole runs for minutes (over 15 on a loaded 2-core host, downloads
# included), most of it in step 1.
$(TEST_STAMP): $(CORE_STAMP)
	$(call STEP,1/5: pytest / ruff / notebooks / Ray / lm-eval / a GCS stand-in and the seqio extra (tensorflow and its datasets) - about 4 GB installed)
	$(PIP_STEPS) -e '.[test,seqio]' 2>&1 | $(PROGRESS)
	$(DONE)
	$(call STEP,2/5: libtpu pinned to jax (jax[tpu]) - the TPU compiler; no TPU needed - about 700 MB installed)
	$(PIP_STEPS) "jax[tpu]==$$($(PY) -c 'import jax; print(jax.__version__)')" 2>&1 | $(PROGRESS)
	$(DONE)
	# The CUDA compile pair pinned to jax, and ptxas: the suite compiles for NVIDIA GPU targets
	# deviceless too (no CUDA libraries, no GPU). It goes into its own folder, loaded only by
	# GPU-target compiles (gated_attention/compile/cuda.py): in the environment's own packages
	# it would print "Could not find cuda drivers" on every CPU run.
	$(call STEP,3/5: the CUDA compile pair and ptxas into $(VENV)/cuda_compile - XLA:GPU with no GPU - about 223 MB to download / 570 MB installed)
	V=$$($(PY) -c 'import jax; print(jax.__version__)'); $(PIP_STEPS) --no-deps --upgrade \
		--target $(VENV)/cuda_compile "jax-cuda12-plugin==$$V" "jax-cuda12-pjrt==$$V" \
		nvidia-cuda-nvcc-cu12 2>&1 | $(PROGRESS)
	$(DONE)
	# xpk, whose real dry run writes the JobSet the GKE tests check, in an environment of its
	# own: its pinned dependencies (protobuf, packaging, PyYAML) clash with the project's.
	$(call STEP,4/5: xpk 1.16 into its own environment $(VENV)/xpk - the GKE launcher's dry run - about 380 MB installed)
	$(PY) -m venv $(VENV)/xpk && $(VENV)/xpk/bin/python -m pip install --disable-pip-version-check --progress-bar off \
		xpk==1.16.0 2>&1 | $(PROGRESS)
	$(DONE)
	$(call STEP,5/5: checking that each imports)
	$(PY) -c "import pytest, xdist, nbclient, seqio, tensorflow_datasets, libtpu"
	$(VENV)/xpk/bin/xpk version >/dev/null
	$(PY) -c "from gated_attention.compile import cuda as cuda_compile; assert cuda_compile.enable(); \
		import jax_plugins.xla_cuda12, jax_cuda12_plugin"
	$(DONE)
	rm -f $(VENV)/.test-* $(VENV)/.step-start && touch $@

install: $(CORE_STAMP)
install-test: $(TEST_STAMP)

demo: $(CORE_STAMP)
	$(PY) -m gated_attention.demo --workdir=runs/demo

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .

# Two workers, a whole file each at a time, the files with slow tests first (conftest.py).
PYTEST := $(PY) -m pytest -q -rs -n 2 --dist=loadfile --no-loadscope-reorder --durations=15

test: $(TEST_STAMP) lint
	$(PYTEST) tests

# The development loop: the suite without the slow tests (the trainings, and every test that
# took over 0.5 s in the last measured full run: tests/durations.json).
test-fast: $(TEST_STAMP)
	$(PYTEST) -m "not slow" tests

# Measure every test in a full run and rewrite tests/durations.json (test-fast's cut, the order).
durations: $(TEST_STAMP)
	rm -rf $(VENV)/durations && GATED_ATTENTION_DURATIONS=$(VENV)/durations $(PYTEST) tests
	$(PY) tests/durations.py $(VENV)/durations

bench: $(CORE_STAMP)
	$(PY) benchmarks/train_step.py
	$(PY) benchmarks/attention.py
	$(PY) benchmarks/moe.py

# The CPU-scale tables of docs/ (docs/sinks.md, docs/analysis.md's learning-rate sweep): run
# their grids (resumable), rewrite them.
tables: $(CORE_STAMP)
	$(PY) -m experiments.make_tables --root runs/tables

clean-venv:
	rm -rf $(VENV)
