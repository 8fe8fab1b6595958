"""data.tokenizer=hf: a BPE tokenizer.json trained here, its special ids, the vocab check, and
a short training run that reads it end to end."""

import json

import numpy as np
import pytest
from data_fixtures import texts, train_bpe, write_jsonl

from gated_attention.config import run_config
from gated_attention.data import hf_tokenizer, registry, tokenizer


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    corpus = texts()
    return root, corpus, train_bpe(root / "tokenizer.json", corpus)


def test_encode_decode_and_special_ids_from_the_template(bpe):
    _, corpus, path = bpe
    tok = tokenizer.get_tokenizer("hf", 320, model_path=path)
    # The trainer puts the special tokens first, in order: <pad> 0, <s> 1, </s> 2.
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.vocab_size == 320
    ids = tok.encode(corpus[:5])
    for text, row in zip(corpus[:5], ids):
        assert row.dtype == np.int32 and len(row) < len(text.encode())  # merges happened
        assert not set(row.tolist()) & {0, 1, 2}  # encode adds no special token itself
        assert tok.decode(row) == text  # byte-level BPE: decoding gives the text back
    assert tok.decode([1, *ids[0], 2]) == "<s>" + corpus[0] + "</s>"


def test_special_ids_from_config_file_and_conventional_names(tmp_path):
    corpus = texts(10)
    # Qwen style: one <|endoftext|> token, no template, no padding: BOS and pad are EOS.
    path = train_bpe(tmp_path / "q.json", corpus, 300, template=False, padding=False,
                     specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
    tok = hf_tokenizer.HFTokenizer(path)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 0, 0)
    # A tokenizer_config.json beside the file has the last word.
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": {"content": "<|im_end|>"}, "bos_token": None, "pad_token": "<|im_start|>"}))
    tok = hf_tokenizer.HFTokenizer(path)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (1, 2, 2)
    # No EOS anywhere: refused in one line.
    bare = train_bpe(tmp_path / "sub_bare.json", corpus, 300, template=False, padding=False,
                     specials=("<x>",))
    (tmp_path / "tokenizer_config.json").unlink()
    with pytest.raises(hf_tokenizer.HFTokenizerError, match=r"sub_bare.json' defines no EOS"):
        hf_tokenizer.HFTokenizer(bare)


def _hf_config(tmp_path, tokenizer_path, vocab_size=384):
    config = run_config.base_config("tiny", "g1_sdpa_elementwise")
    config.model.update(dict(vocab_size=vocab_size, num_layers=1, d_model=32, num_heads=2,
                             num_kv_heads=1, head_dim=16, mlp_dim=64))
    config.data.update(dict(source="files", paths=write_jsonl(tmp_path / "c.jsonl", texts(60)),
                            tokenizer="hf", tokenizer_path=tokenizer_path, seq_len=32,
                            cache_dir=str(tmp_path / "cache"), eval_fraction=0.2))
    config.train.update(dict(steps=6, batch_size=4, eval_every=6, eval_batches=1, log_every=1,
                             checkpoint_every=0, async_checkpoint=False))
    config.optimizer.update(dict(warmup_steps=1, peak_lr=1e-2))
    return config


@pytest.mark.parametrize("change, message", [
    (dict(model__vocab_size=256), r"^model.vocab_size=256 is smaller than the tokenizer's 320 "
                                  r"ids .* >= 320, e.g. 384 \(a multiple of 128\)$"),
    (dict(data__tokenizer_path=""), r"^data.tokenizer='hf' needs data.tokenizer_path"),
    (dict(data__tokenizer_path="/nonexistent/tokenizer.json"),
     r"^data.tokenizer_path='/nonexistent/tokenizer.json' does not exist"),
])
def test_bad_tokenizer_settings_are_one_line_config_errors(bpe, tmp_path, change, message):
    config = _hf_config(tmp_path, bpe[2])
    for key, value in change.items():
        section, field = key.split("__")
        config[section][field] = value
    with pytest.raises(run_config.ConfigError, match=message) as err:
        run_config.validate_run_config(config)  # the fields
        registry.check_files(config)  # then the tokenizer file they name
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()
