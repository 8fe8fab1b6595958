"""A new user's first hour: the README's Quick start does what it says, the Python example
of docs/training.md runs as written, and CPU commands start without libtpu's start-up noise."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from config_fixtures import flat

from gated_attention.config import run_config

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
TRAINING_DOC = (ROOT / "docs" / "training.md").read_text()


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end]


def blocks(text: str, info: str) -> list[str]:
    return re.findall(rf"```{info}\n(.*?)```", text, re.S)


def main_commands(text: str) -> list[list[str]]:
    """Every `python -m gated_attention.main` command of the text, continuation lines joined."""
    commands = []
    for block in blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = line.split()
            if words[:3] == ["python", "-m", "gated_attention.main"]:
                commands.append(words[3:])
    return commands


def config_of(flags: list[str]):
    """The config a main command runs: the config file and string, then --config.* values."""
    spec = dict(f[2:].split("=", 1) for f in flags if f.startswith("--config="))["config"]
    path, _, arg = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("readme_config", ROOT / path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(arg or None)
    for flag in flags:
        if flag.startswith("--config."):
            key, value = flag[len("--config."):].split("=", 1)
            section_name, field = key.split(".")
            config[section_name][field] = type(config[section_name][field])(value)
    run_config.validate_run_config(config)  # also brings the variant label in line
    return config


def test_the_quick_starts_second_run_changes_one_field_of_the_first():
    first, second = main_commands(section("Quick start"))[:2]
    assert "configs/tiny.py" in first[0] and "configs/ablation.py" in second[0]
    a, b = flat(config_of(first)), flat(config_of(second))
    assert {k for k in a if a[k] != b.get(k)} == {"attention.activation", "variant"}
    assert (a["attention.activation"], b["attention.activation"]) == ("sigmoid", "silu")
    assert b["variant"] == "g1_sdpa_elementwise+activation=silu"
    # The run keeps checkpoints along the way, not only its last step.
    assert 0 < a["train.checkpoint_every"] < a["train.steps"]


@pytest.mark.needs("ruff")
def test_the_python_example_of_the_docs_defines_every_name_it_uses():
    """ruff's undefined-name rule (F821) over the example as written (running it eagerly
    takes half a minute of op-by-op compiles, which the model tests cover)."""
    code = next(b for b in blocks(TRAINING_DOC, "python") if "build_model" in b)
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select",
                             "F821,F401", "--stdin-filename", "example.py", "-"], input=code,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout
    assert "tokens = " in code.split("model(tokens)")[0]


def run_probe(probe: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run `probe` in a fresh interpreter with no JAX_PLATFORMS; its last line is JSON."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.needs("libtpu")
def test_a_cpu_run_keeps_libtpu_out_and_tpu_targets_still_compile():
    """With libtpu installed (jax registers a TPU backend and would start libtpu first), an
    entry point on a machine without a TPU never starts libtpu's runtime: no host-bounds or
    worker-hostname noise; compiling for a TPU target still works."""
    from gated_attention.cli import platform

    if any(vendor in (platform._TPU_VENDOR, *platform._GPU_VENDORS)
           for vendor, _ in platform._pci_devices()):
        pytest.skip("this machine has an accelerator: jax keeps its default backends there")
    from jax._src import xla_bridge

    assert "tpu" in xla_bridge._backend_factories  # what jax would try without the choice
    probe = (
        "import json, sys\n"
        "import os\n"
        "from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs\n"
        "keep_libtpu_out_of_cpu_runs()\n"
        "import jax\n"
        "from jax._src import xla_bridge\n"
        "from jax._src.lib import xla_client\n"
        "jax.numpy.ones(3).sum().block_until_ready()\n"
        "tried = 'tpu' in xla_bridge._backend_errors or xla_client.pjrt_plugin_loaded('tpu')\n"
        "print('--- cpu run done', file=sys.stderr, flush=True)\n"
        "from gated_attention.compile.target import tpu_devices\n"
        "print(json.dumps({'backend': jax.default_backend(), 'tpu_tried': tried,\n"
        "                  'env': os.environ.get('JAX_PLATFORMS'),\n"
        "                  'tpu_target_devices': len(tpu_devices('v5e:2x2'))}))\n")
    result, found = run_probe(probe)
    assert found == {"backend": "cpu", "tpu_tried": False, "env": "cpu",
                     "tpu_target_devices": 4}
    before_compile = result.stderr.split("--- cpu run done")[0]
    for noise in ("Failed to find host bounds", "unexpected worker hostname",
                  "Source Location Trace", "libtpu"):
        assert noise not in before_compile, before_compile


def test_importing_the_package_leaves_the_environment_untouched():
    """A library import changes nothing: no JAX_PLATFORMS, no other variable, no jax config.
    Every module of the package is imported, commands included (their flags are defined only
    when run as programs)."""
    probe = (
        "import json, os, pkgutil, importlib\n"
        "import lm_eval  # sets HF_XET_HIGH_PERFORMANCE on its own import: not the package's\n"
        "before = dict(os.environ)\n"
        "import gated_attention\n"
        "names = [m.name for m in pkgutil.walk_packages(gated_attention.__path__,\n"
        "                                                 'gated_attention.')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "import jax\n"
        "changed = sorted(k for k in set(before) | set(os.environ)\n"
        "                 if before.get(k) != os.environ.get(k))\n"
        "print(json.dumps({'changed': changed, 'platforms': jax.config.jax_platforms,\n"
        "                  'modules': len(names)}))\n")
    _, found = run_probe(probe)
    assert found["changed"] == [] and found["platforms"] in (None, "")
    assert found["modules"] > 100  # every module was imported, not an empty walk


def test_token_labels_show_special_and_whitespace_pieces():
    from gated_attention.analysis.plots import token_labels
    from gated_attention.data.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    ids = [tok.bos_id, *tok.encode(["a b\n\t"])[0], tok.eos_id, tok.pad_id]
    # Hand-written: BOS, "a", a space, "b", a newline, a tab, EOS, pad.
    assert token_labels(tok, ids) == ["<bos>", "a", "\u2423", "b", "\u21b5", "\u21e5", "<eos>",
                                      "<pad>"]

    class Silent:  # a tokenizer whose piece decodes to nothing (no special ids)
        def decode(self, ids):
            return ""

    assert token_labels(Silent(), [934]) == ["<934>"]


def test_a_log_axis_over_one_decade_has_plain_labels_up_to_its_top():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gated_attention.analysis.plots import log_axis

    fig, ax = plt.subplots()
    ax.plot([0, 1, 2, 3], [5.3, 16.1, 8.0, 6.2])  # M-Act of the demo's two models
    log_axis(ax)
    fig.canvas.draw()
    low, high = ax.get_ylim()
    shown = [(t.get_loc(), t.label1.get_text()) for t in ax.yaxis.get_major_ticks()
             if low <= t.get_loc() <= high]
    plt.close(fig)
    # Within the limits (about 5.0 to 17.0): 6 to 10 and 15 (the top's 16.1 was unlabelled
    # above 10), each labelled as its value.
    assert [label for _, label in shown] == ["6", "7", "8", "9", "10", "15"]
    assert all(label == f"{loc:g}" for loc, label in shown)


def test_the_inspect_notebook_finds_a_run_in_the_folder_make_demo_writes(tmp_path, capsys):
    import nbformat

    book = nbformat.read(ROOT / "notebooks" / "inspect_model.ipynb", as_version=4)
    assert 'os.environ.get("RUN_DIR", "runs/demo/g1_sdpa_elementwise")' in book.cells[1].source
    code = book.cells[2].source
    functions = code[code.index("def repository_root"):code.index("\nif HF_DIR:")]
    scope = {"os": os, "pathlib": __import__("pathlib")}
    exec(functions, scope)  # noqa: S102 - the notebook's own helpers
    for name in ("baseline", "g1_sdpa_elementwise"):
        (tmp_path / "demo" / name).mkdir(parents=True)
        (tmp_path / "demo" / name / "config.json").write_text("{}")
    (tmp_path / "demo" / "sinks" / "baseline").mkdir(parents=True)
    assert scope["run_folder"](str(tmp_path / "demo" / "baseline")).endswith("demo/baseline")
    assert scope["run_folder"](str(tmp_path / "demo")).endswith("demo/g1_sdpa_elementwise")
    assert "holds 2 runs (baseline, g1_sdpa_elementwise)" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="holds no run"):
        scope["run_folder"](str(tmp_path / "demo" / "sinks" / "baseline"))


def test_analyze_says_why_its_perplexity_is_not_trainings(tmp_path):
    from gated_attention.analysis.run_analysis import summary_lines

    (tmp_path / "summary.json").write_text(json.dumps({"steps": 300, "eval": {
        "loss": 3.676, "perplexity": 39.5}}))
    result = {"workdir": str(tmp_path), "perplexity": 37.0812, "loss_tokens": 4096,
              "data": "held-out windows, one chunk per row from position 0", "variant": "g1",
              "step": 300, "first_token_attention": 0.0331, "exclude_first_query": True,
              "sink_rate": 0.0, "massive_activation": 4.87, "gate_score_mean": 0.438,
              "gate_score_per_layer": [{"mean": 0.03}, {"mean": 0.846}]}
    lines = summary_lines(result)
    assert lines[0] == "g1 at step 300:"
    assert [line.split()[-1] for line in lines[1:4]] == ["0.033", "0.00", "4.87"]
    assert lines[4].endswith("mean gate score                                  0.438  (per layer: "
                             "0.030, 0.846)")
    assert lines[5].startswith("  held-out perplexity, this analysis") and lines[5].endswith(
        "37.08  on 4,096 tokens of held-out windows, one chunk per row from position 0")
    assert lines[6].startswith("  held-out perplexity, training's last eval") and lines[
        6].endswith("39.50  at step 300, on its train.eval_batches packed batches")
    assert lines[7] == "  The two perplexities measure different held-out tokens, so they differ."
    (tmp_path / "summary.json").unlink()
    assert not [line for line in summary_lines(result) if "training's" in line]
    del result["perplexity"]
    assert not [line for line in summary_lines(result) if "perplexity" in line]


def test_the_demos_parallel_lines_say_which_run_they_come_from(tmp_path, capsys):
    from gated_attention import demo

    commands = [[sys.executable, "-c", f"import sys; print('step 10/100 loss {n}'); "
                 f"print('warned', file=sys.stderr)", f"--workdir={tmp_path}/demo/{name}"]
                for n, name in ((5.1, "baseline"), (4.9, "g1_sdpa_elementwise"))]
    demo.run_commands(commands, parallel=True)
    out, err = capsys.readouterr()
    assert sorted(out.splitlines()) == ["[demo/baseline] step 10/100 loss 5.1",
                                        "[demo/g1_sdpa_elementwise] step 10/100 loss 4.9"]
    assert sorted(err.splitlines()) == ["[demo/baseline] warned",
                                        "[demo/g1_sdpa_elementwise] warned"]
