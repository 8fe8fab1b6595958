"""What a run needs before its first step (run_checks): refused before compiling, one line
naming the field; checked against what SentencePiece itself says and counts."""

import importlib.util
import json
import pathlib
import re

import pytest
from data_fixtures import texts, write_jsonl

from gated_attention.compile import preflight
from gated_attention.compile.tpu_topologies import parse_accelerator
from gated_attention.config import run_config
from gated_attention.config.run_config import ConfigError
from gated_attention.training import run_checks

CONFIGS = pathlib.Path(__file__).parents[1] / "configs"


def load_config(name: str, arg: str | None = None):
    spec = importlib.util.spec_from_file_location(f"config_{name}", CONFIGS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def files_config(tmp_path, corpus, vocab_size=700, **data):
    config = run_config.base_config("tiny", "baseline")
    config.model.vocab_size = vocab_size
    config.train.update(steps=4, batch_size=4)
    config.data.seq_len = 64
    config.data.update(dict(source="files", paths=write_jsonl(tmp_path / "c.jsonl", corpus),
                            cache_dir=str(tmp_path / "cache"), eval_fraction=0.25, **data))
    return config


def train_sp(tmp_path, corpus, vocab_size):
    from gated_attention.data.corpus import Document
    from gated_attention.data.tokenizer import train_sentencepiece

    path = tmp_path / f"sp{vocab_size}.model"
    train_sentencepiece([Document(str(i), t) for i, t in enumerate(corpus)], vocab_size, path)
    return path


def test_preflight_of_the_1p7b_config_on_the_embedded_corpus_names_the_vocabulary(
        monkeypatch):
    """The 1.7B recipe with no data source set reads the embedded docs corpus, on which no
    151,936-piece SentencePiece can be trained: the pre-flight says so before compiling."""
    def no_compile(*args, **kwargs):
        raise AssertionError("compiled before the data was checked")

    monkeypatch.setattr(preflight, "compile_step", no_compile)
    config = load_config("dense_1p7b", "variant=g1_sdpa_elementwise")
    assert config.data.source == "cpython_docs" and config.model.vocab_size == 151_936
    with pytest.raises(ConfigError) as err:
        preflight.preflight(config, parse_accelerator("v5p-8"), ("train",))
    message = str(err.value)
    assert "\n" not in message
    found = re.fullmatch(r"model\.vocab_size=151936 is more pieces than a SentencePiece bpe "
                         r"tokenizer can learn from data\.source='cpython_docs' \(at most "
                         r"(\d+)\); set data\.tokenizer_path .*", message)
    assert found and 1024 < int(found.group(1)) < 151_936, message


def test_a_small_corpus_with_a_vocabulary_it_cannot_fill_is_refused(tmp_path):
    import io

    import sentencepiece as spm

    corpus = texts(40, 200)  # 8,000 characters: a few thousand pieces at most
    config = files_config(tmp_path, corpus, vocab_size=20000)
    with pytest.raises(ConfigError, match=r"^model\.vocab_size=20000 is more pieces than a "
                                          r"SentencePiece bpe tokenizer can learn from "
                                          r"data\.source='files' \(at most (\d+)\)"):
        run_checks.check_run(config)
    # SentencePiece's own trainer, called directly, refuses the same size.
    with pytest.raises(RuntimeError, match="Vocabulary size too high"):
        spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=io.BytesIO(),
            vocab_size=20000, model_type="bpe", byte_fallback=True,
            minloglevel=2)


def test_a_buildable_run_reports_its_training_tokens_as_sentencepiece_counts_them(tmp_path):
    import sentencepiece as spm

    corpus = texts(40, 600)
    config = files_config(tmp_path, corpus)
    found = run_checks.check_run(config)
    assert found["tokenizer_vocab"] == 700
    # Independent count: the cached model's own encoder over the training documents + EOS.
    from gated_attention.data import corpus as corpus_lib

    docs = corpus_lib.text_files(config.data.paths)
    train_docs, _ = corpus_lib.split_documents(docs, config.data.eval_fraction)
    model = next((tmp_path / "cache" / "tokenizers").glob("sp-*.model"))
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert found["train_tokens"] == sum(len(sp.encode(d.text)) + 1 for d in train_docs)
    expected = 4 * 4 * 64 / found["train_tokens"]
    assert found["epochs"] == pytest.approx(expected)


def test_a_tokenizer_file_of_another_size_is_refused_for_local_and_streamed_sources(tmp_path):
    corpus = texts(40, 600)
    path = train_sp(tmp_path, corpus, 680)
    config = files_config(tmp_path, corpus, tokenizer_path=str(path))
    with pytest.raises(ConfigError, match=r"^data\.tokenizer_path: the tokenizer at .* has 680 "
                                          r"tokens but model\.vocab_size=700$"):
        run_checks.check_run(config)
    passkey = run_config.base_config("passkey_tiny", "baseline")
    passkey.model.vocab_size = 700
    passkey.data.update(tokenizer="sentencepiece", tokenizer_path=str(path))
    with pytest.raises(ConfigError, match=r"^data\.tokenizer_path='.*sp680\.model': the "
                                          r"tokenizer at .* has 680 tokens but model\."
                                          r"vocab_size=700$"):
        run_checks.check_run(passkey)


def test_a_resumed_run_is_checked_against_its_saved_tokenizer(tmp_path):
    corpus = texts(40, 600)
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "tokenizer.model").write_bytes(train_sp(tmp_path, corpus, 650).read_bytes())
    config = files_config(tmp_path, corpus)
    with pytest.raises(ConfigError, match=r"^model\.vocab_size=700 disagrees with the tokenizer "
                                          r"saved in .*run \(by the run there; --overwrite "
                                          r"moves it aside\), which has 650 tokens"):
        run_checks.check_run(config, workdir)
    assert sorted(p.name for p in workdir.iterdir()) == ["tokenizer.model"]  # nothing written
    # With the model's size, the saved tokenizer is the one read: nothing is trained.
    (workdir / "tokenizer.model").write_bytes(train_sp(tmp_path, corpus, 700).read_bytes())
    assert run_checks.check_run(config, workdir)["tokenizer_vocab"] == 700
    assert not list((tmp_path / "cache").glob("tokenizers/sp-*.model"))
    assert sorted(p.name for p in workdir.iterdir()) == ["tokenizer.model"]


def test_data_problems_name_their_field(tmp_path):
    corpus = texts(40, 600)
    config = files_config(tmp_path, corpus)
    (tmp_path / "c.jsonl").write_text(json.dumps({"body": "no text field"}) + "\n")
    with pytest.raises(ConfigError, match=r"c\.jsonl:1 has no field 'text' \(data\.text_key\)"):
        run_checks.check_run(config)
    write_jsonl(tmp_path / "c.jsonl", corpus)
    config.train.steps = 100_000
    with pytest.raises(ConfigError, match=r"^train\.steps=100000 x train\.batch_size=4 x "
                                          r"data\.seq_len=64 = .* more than data\.max_epochs"):
        run_checks.check_run(config)


def test_main_refuses_a_tokenizer_it_cannot_build_before_touching_the_workdir(tmp_path,
                                                                             monkeypatch,
                                                                             capsys):
    import sys

    from absl import flags

    from gated_attention import main

    corpus = write_jsonl(tmp_path / "c.jsonl", texts(40, 200))
    argv = ["main", "--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}",
            "--progress=false", "--multihost=no", "--config.data.source=files",
            f"--config.data.paths={corpus}", "--config.model.vocab_size=20000",
            "--config.data.eval_fraction=0.25",
            f"--config.data.cache_dir={tmp_path / 'cache'}"]
    monkeypatch.setattr(sys, "argv", argv)  # ml_collections reads overrides from sys.argv
    monkeypatch.chdir(CONFIGS.parent)
    flag_values = main.define_flags(flags.FlagValues())
    with pytest.raises(SystemExit) as stop:
        main.main(main.parse_flags(argv, flag_values), flag_values)
    err = capsys.readouterr().err.rstrip("\n")
    assert stop.value.code == 2
    assert re.fullmatch(r"Config error: model\.vocab_size=20000 is more pieces than a "
                        r"SentencePiece bpe tokenizer can learn from data\.source='files' "
                        r"\(at most \d+\); .*", err), err
    assert not (tmp_path / "run").exists()
