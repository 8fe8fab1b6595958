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


_BUILDERS: dict = {}


def tiny_tfds_builder(corpus: list[str], class_name: str = "GaTinyText"):
    """A tfds builder class (registered as snake case of class_name) over `corpus` (train)
    and its first 8 texts (validation), defined here so nothing is downloaded; generation
    order is kept (no shuffling)."""
    if class_name in _BUILDERS:
        return _BUILDERS[class_name]
    import tensorflow_datasets as tfds

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
            disable_shuffling=True)

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(corpus),
                "validation": self._generate_examples(corpus[:8])}

    def _generate_examples(self, texts):
        for i, text in enumerate(texts):
            yield i, {"text": text}

    builder = type(class_name, (tfds.core.GeneratorBasedBuilder,), {
        "VERSION": tfds.core.Version("1.0.0"), "_info": _info,
        "_split_generators": _split_generators,
        "_generate_examples": _generate_examples, "__module__": __name__})
    _BUILDERS[class_name] = builder
    return builder
