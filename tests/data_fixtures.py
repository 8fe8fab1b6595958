"""Tiny local data for the data tests: texts, a BPE tokenizer.json trained here, a corpus file."""

import json
from pydoc_data.topics import topics

SPECIALS = ("<pad>", "<s>", "</s>")


def texts(n: int = 40, chars: int = 600) -> list[str]:
    """Paragraphs of the language reference (ships with CPython), newlines folded."""
    return [" ".join(t.split())[:chars] for _, t in sorted(topics.items())[:n]]


def train_bpe(path, corpus: list[str], vocab_size: int = 320, *, template: bool = True,
              padding: bool = True, specials=SPECIALS) -> str:
    """A byte-level BPE tokenizer.json; specials first (ids 0, 1, 2 with the defaults)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    if template:
        bos, eos = specials[1], specials[2]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A {eos}", special_tokens=[(bos, tok.token_to_id(bos)),
                                                     (eos, tok.token_to_id(eos))])
    if padding:
        tok.enable_padding(pad_id=tok.token_to_id(specials[0]), pad_token=specials[0])
    tok.save(str(path))
    return str(path)


def write_jsonl(path, corpus: list[str]) -> str:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus))
    return str(path)
