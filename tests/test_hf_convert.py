"""convert from_hf -> workdir -> (load_params, generate, continued training) -> to_hf."""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from gated_attention import convert, hf
from gated_attention.config import run_config
from gated_attention.hf import safetensors_io
from gated_attention.inference import generation as generate
from gated_attention.training import loop
from gated_attention.training.workdir import WorkdirError
from tests.data_fixtures import texts, train_bpe, write_jsonl
from tests.hf_fixtures import numpy_forward, random_tensors, tiny_hf_config, write_hf_folder

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    config = tiny_hf_config("g1_sdpa_headwise", vocab_size=320, torch_dtype="bfloat16",
                            eos_token_id=2)
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in random_tensors(config).items()}
    folder = write_hf_folder(root / "model", config, tensors)
    train_bpe(folder / "tokenizer.json", texts(40), vocab_size=320)
    return folder, tensors


def test_from_hf_to_hf_round_trip_and_generation(hf_folder, tmp_path):
    folder, tensors = hf_folder
    config = convert.from_hf(folder, tmp_path / "run")
    run = tmp_path / "run"
    assert (run / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    assert config.data.tokenizer == "hf" and config.variant == "g1_sdpa_headwise"
    saved = json.loads((run / "config.json").read_text())
    assert saved["model"]["num_layers"] == 2 and saved["data"]["tokenizer"] == "hf"

    model, _ = loop.load_params(run)  # what analyze and the notebooks call
    imported, _ = hf.load_pretrained(folder)
    ids = jnp.asarray([[5, 9, 2, 30, 11]])
    np.testing.assert_array_equal(np.asarray(model(ids)[0]), np.asarray(imported(ids)[0]))

    written = convert.to_hf(run, tmp_path / "out")
    assert "tokenizer.json" in written
    back = safetensors_io.read_tensors(tmp_path / "out")
    assert sorted(back) == sorted(tensors)
    for name, value in tensors.items():
        assert back[name].dtype == value.dtype and back[name].tobytes() == value.tobytes()
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == json.loads(
        (folder / "config.json").read_text())

    model, _, tokenizer = generate.load_for_generation(workdir=str(run))
    prompt = [int(i) for i in tokenizer.encode(["The model"])[0]]
    new = generate.generate(model, [prompt], max_new_tokens=4)
    assert new.shape == (1, 4)
    # greedy: each new token is the argmax of the float64 numpy forward of the HF weights
    hf_config, sequence = json.loads((folder / "config.json").read_text()), list(prompt)
    for token in new[0]:
        logits = numpy_forward(hf_config, tensors, np.array([sequence]))[0, -1]
        assert int(token) == int(np.argmax(logits)), (sequence, int(token))
        sequence.append(int(token))


def test_continued_training_starts_from_the_imported_weights(hf_folder, tmp_path):
    folder, _ = hf_folder
    convert.from_hf(folder, tmp_path / "run")
    from configs.from_workdir import get_config

    config = get_config(str(tmp_path / "run"))
    config.data.update(dict(source="files", paths=write_jsonl(tmp_path / "c.jsonl", texts(60)),
                            seq_len=32, cache_dir=str(tmp_path / "cache"), eval_fraction=0.2))
    config.train.update(dict(steps=2, batch_size=2, eval_every=0, eval_batches=0, log_every=1,
                             checkpoint_every=0, async_checkpoint=False))
    config.optimizer.update(dict(warmup_steps=1, peak_lr=1e-7, final_lr=0.0))
    loop.run(config, tmp_path / "ft", progress=False, devices=jax.devices()[:1])
    tuned, _ = loop.load_params(tmp_path / "ft")
    start, _ = loop.load_params(tmp_path / "run")
    tuned_params, start_params = hf.flat_params(tuned), hf.flat_params(start)
    for name, value in start_params.items():  # a tiny learning rate: still the import
        np.testing.assert_allclose(tuned_params[name], value, atol=1e-5, err_msg=name)
    assert not (tmp_path / "run" / "checkpoints" / "2").exists()  # the import is untouched


def test_convert_refuses_before_writing(hf_folder, tmp_path):
    folder, _ = hf_folder
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(WorkdirError, match="not empty"):
        convert.from_hf(folder, tmp_path / "busy")
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["notes.txt"]
    bad = json.loads((folder / "config.json").read_text())
    bad["use_sliding_window"] = True
    (tmp_path / "bad").mkdir()
    for name in ("model.safetensors", "tokenizer.json"):
        (tmp_path / "bad" / name).write_bytes((folder / name).read_bytes())
    (tmp_path / "bad" / "config.json").write_text(json.dumps(bad))
    with pytest.raises(run_config.ConfigError, match="use_sliding_window"):
        convert.from_hf(tmp_path / "bad", tmp_path / "new")
    assert not (tmp_path / "new").exists()
    # a new run that would start from weights that do not fit is refused before compiling
    convert.from_hf(folder, tmp_path / "run")
    config = run_config.base_config("tiny", "g1_sdpa_headwise")
    config.train.init_from = str(tmp_path / "run")
    with pytest.raises(run_config.ConfigError, match=r"has parameter embed of shape \(320, 32\), "
                                                     r"this model needs \(1024, 128\)"):
        loop.check_run(config)  # the run's checks before compiling (init_from's source too)
    config.train.init_from = str(tmp_path / "busy")
    with pytest.raises(run_config.ConfigError, match="is not a run workdir with checkpoints"):
        loop.check_run(config)


def _greedy_text(model, config, tokenizer, prompt: str = "The import statement") -> str:
    ids = generate.encode_prompt(prompt, tokenizer, config)
    new = generate.generate(model, [ids], max_new_tokens=12)[0]
    return tokenizer.decode([int(i) for i in new])


def _prompt_logits(model, config, tokenizer, prompt: str = "The import statement") -> np.ndarray:
    """The next-token logits after the prompt as the run's input settings encode it: a finer
    check than greedy text, which a 3-step model may repeat whatever its input."""
    ids = generate.encode_prompt(prompt, tokenizer, config)
    logits, _ = model(jnp.asarray([ids], jnp.int32))
    return np.asarray(logits[0, -1], np.float64)


@pytest.mark.slow  # trains a SentencePiece model and 3 steps; ~15 s on idle cores
def test_a_run_survives_its_own_hugging_face_round_trip(tmp_path):
    """A SentencePiece run with data.add_bos exported and imported generates the source's text:
    the tokenizer and the input settings travel with the weights (and generate --hf reads them)."""
    import os

    config = run_config.base_config("tiny", "g1_sdpa_elementwise")
    config.model.update(dict(vocab_size=512, num_layers=1, d_model=32, num_heads=2,
                             num_kv_heads=1, head_dim=16, mlp_dim=64))
    config.data.update(dict(source="files", paths=write_jsonl(tmp_path / "c.jsonl", texts(60)),
                            tokenizer="sentencepiece", add_bos=True, seq_len=32,
                            cache_dir=str(tmp_path / "cache"), eval_fraction=0.2))
    config.train.update(dict(steps=3, batch_size=4, eval_every=0, eval_batches=0, log_every=1,
                             checkpoint_every=0, async_checkpoint=False))
    config.optimizer.update(dict(warmup_steps=1, peak_lr=3e-2))
    loop.run(config, tmp_path / "run", progress=False, devices=jax.devices()[:1])

    model, source_config, tokenizer = generate.load_for_generation(workdir=str(tmp_path / "run"))
    source_text = _greedy_text(model, source_config, tokenizer)
    source_logits = _prompt_logits(model, source_config, tokenizer)
    written = convert.to_hf(tmp_path / "run", tmp_path / "out")
    assert {"tokenizer.model", "tokenizer_config.json", "gated_attention.json"} <= set(written)
    tok_config = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert tok_config["add_bos_token"] is True and tok_config["bos_token"] == "<s>"
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "out" / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask

    model, hf_config, tokenizer = generate.load_for_generation(hf_dir=str(tmp_path / "out"))
    assert hf_config.data.add_bos is True and hf_config.data.tokenizer == "sentencepiece"
    assert _greedy_text(model, hf_config, tokenizer) == source_text  # generate --hf

    imported = convert.from_hf(tmp_path / "out", tmp_path / "back")
    assert imported.data.add_bos is True and imported.data.tokenizer == "sentencepiece"
    assert ((tmp_path / "back" / "tokenizer.model").read_bytes()
            == (tmp_path / "run" / "tokenizer.model").read_bytes())
    model, back_config, tokenizer = generate.load_for_generation(workdir=str(tmp_path / "back"))
    assert _greedy_text(model, back_config, tokenizer) == source_text
    np.testing.assert_allclose(_prompt_logits(model, back_config, tokenizer), source_logits,
                               rtol=1e-5, atol=1e-5)
    # and the negative control: without the input settings the model sees another input
    back_config.data.add_bos = False
    assert not np.allclose(_prompt_logits(model, back_config, tokenizer), source_logits,
                           rtol=1e-3, atol=1e-3)


def test_an_import_without_a_tokenizer_says_what_to_set(hf_folder, tmp_path, capsys):
    folder, _ = hf_folder
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((folder / name).read_bytes())
    convert.from_hf(bare, tmp_path / "run")
    assert "holds no tokenizer" in capsys.readouterr().out
    with pytest.raises(ValueError, match="data.tokenizer_path is empty"):
        generate.load_for_generation(workdir=str(tmp_path / "run"))
    with pytest.raises(FileNotFoundError, match="holds no tokenizer: --hf needs"):
        generate.load_for_generation(hf_dir=str(bare))
