"""Synthetic long-context tasks in the spirit of RULER (Hsieh et al. 2024), generated locally.

Four tasks, each an `Example` of a prompt, the canonical answer text that follows it, and the
answer items a prediction must contain:
- passkey: a 5-digit pass key hidden at a random depth of filler text;
- multikey_niah: several "special magic number for <key>" needles, one of them asked for;
- variable_tracking: a chain of assignments VAR A = 12345, VAR B = VAR A, ... among filler
  (and a distractor chain); name every variable that holds the value, in order;
- common_words: a list of words where a few words occur more often than all others; name
  them in alphabetical order.
Every example is built from a seed and filled with filler up to a token budget measured
with the run's own tokenizer, so the same task exists at 128 and at 16k tokens. Keys and
words are made-up pronounceable strings, so no word list is needed.

Scoring a model on them (exact, one forward pass) is analysis/retrieval_tasks.py's job; this
module only makes the examples and encodes them, so training data (data/passkey.py) and the
evaluation draw from one generator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

TASKS = ("passkey", "multikey_niah", "variable_tracking", "common_words")
FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
          "There and back again. ")
_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"


@dataclasses.dataclass(frozen=True)
class Example:
    task: str
    prompt: str
    answer_text: str            # what follows the prompt (a space first, but for marked_passkey)
    answers: tuple[str, ...]    # items a correct prediction holds


def _words(rng: np.random.Generator, count: int, syllables: int = 3) -> list[str]:
    """`count` distinct made-up words such as "bakimo" (consonant-vowel syllables)."""
    out: dict[str, None] = {}
    consonants, vowels = np.asarray(list(_CONSONANTS)), np.asarray(list(_VOWELS))
    while len(out) < count:
        c = consonants[rng.integers(len(consonants), size=(count, syllables))]
        v = vowels[rng.integers(len(vowels), size=(count, syllables))]
        for row in np.char.add(c, v):
            out["".join(row)] = None
    return list(out)[:count]


def _number(rng: np.random.Generator, digits: int) -> str:
    return str(int(rng.integers(10 ** (digits - 1), 10**digits)))


def _fill(budget: int, count_tokens: Callable[[Example], int], build: Callable[[int], Example]
          ) -> Example:
    """The example with the most filler units whose prompt + answer fit in `budget` tokens."""
    low, high = 0, 1
    while count_tokens(build(high)) <= budget:
        low, high = high, high * 2
    if low == 0 and count_tokens(build(0)) > budget:
        raise ValueError(f"length {budget} is too short for task {build(0).task!r} "
                         f"({count_tokens(build(0))} tokens without filler)")
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if count_tokens(build(mid)) <= budget else (low, mid)
    return build(low)


def _filler_sentences(units: int) -> list[str]:
    sentences = [s.strip() + "." for s in FILLER.split(".") if s.strip()]
    return [sentences[i % len(sentences)] for i in range(units)]


def _with_inserts(units: int, inserts: Sequence[str], depths: Sequence[float]) -> str:
    """Filler of `units` sentences with each insert placed at its relative depth."""
    text = _filler_sentences(units)
    slots = sorted(zip((int(round(d * units)) for d in depths), range(len(inserts)),
                       inserts), reverse=True)
    for slot, _, insert in slots:  # from the back, so earlier slots keep their index
        text.insert(slot, insert)
    return " ".join(text)


def passkey(rng: np.random.Generator, budget: int, count_tokens: Callable[[Example], int]
            ) -> Example:
    key, depth = _number(rng, 5), float(rng.uniform())
    needle = f"The pass key is {key}. Remember it."

    def build(units: int) -> Example:
        body = _with_inserts(units, [needle], [depth])
        return Example("passkey", f"Find the pass key. {body} What is the pass key? "
                       "The pass key is", f" {key}", (key,))

    return _fill(budget, count_tokens, build)


def multikey_niah(rng: np.random.Generator, budget: int, count_tokens: Callable[[Example], int],
                  num_keys: int = 4) -> Example:
    keys = _words(rng, num_keys)
    values = [_number(rng, 7) for _ in keys]
    depths = sorted(float(d) for d in rng.uniform(size=num_keys))
    asked = int(rng.integers(num_keys))
    needles = [f"One special magic number for {k} is: {v}." for k, v in zip(keys, values)]
    order = rng.permutation(num_keys)

    def build(units: int) -> Example:
        body = _with_inserts(units, [needles[i] for i in order], depths)
        return Example("multikey_niah", f"{body} What is the special magic number for "
                       f"{keys[asked]}? The special magic number for {keys[asked]} is",
                       f" {values[asked]}", (values[asked],))

    return _fill(budget, count_tokens, build)


def variable_tracking(rng: np.random.Generator, budget: int, count_tokens: Callable[[Example], int],
                      hops: int = 4) -> Example:
    names = [w.upper() for w in _words(rng, 2 * (hops + 1), syllables=2)]
    chain, distractor = names[:hops + 1], names[hops + 1:]
    value, other = _number(rng, 5), _number(rng, 5)
    while other == value:
        other = _number(rng, 5)

    def statements(chain: list[str], value: str) -> list[str]:
        return [f"VAR {chain[0]} = {value}."] + [
            f"VAR {b} = VAR {a}." for a, b in zip(chain[:-1], chain[1:])]

    inserts = statements(chain, value) + statements(distractor, other)
    # Each chain keeps its order in the text; the two chains interleave at random depths.
    depths = np.sort(rng.uniform(size=len(inserts)))
    slot_of = np.empty(len(inserts))
    slot_of[rng.permutation(len(inserts))] = depths
    for chain_slice in (slice(0, hops + 1), slice(hops + 1, None)):
        slot_of[chain_slice] = np.sort(slot_of[chain_slice])

    def build(units: int) -> Example:
        body = _with_inserts(units, inserts, list(slot_of))
        return Example("variable_tracking", f"{body} Which variables hold the value {value}? "
                       "In order of assignment, they are:", " " + " ".join(chain),
                       tuple(chain))

    return _fill(budget, count_tokens, build)


def common_words(rng: np.random.Generator, budget: int, count_tokens: Callable[[Example], int],
                 num_common: int = 3, common_count: int = 4) -> Example:
    """`num_common` words occur `common_count` times; every other word once or twice."""
    vocabulary = _words(rng, 4000)
    common, rare = sorted(vocabulary[:num_common]), vocabulary[num_common:]
    rare_counts = rng.integers(1, 3, size=len(rare))  # below common_count, so ranks are strict
    shuffle_seed = int(rng.integers(2**31))

    def build(units: int) -> Example:
        if units > len(rare):
            raise ValueError("common_words ran out of distinct words")
        words = [w for w in common for _ in range(common_count)]
        words += [w for w, c in zip(rare[:units], rare_counts[:units]) for _ in range(c)]
        words = [words[i] for i in np.random.default_rng(shuffle_seed).permutation(len(words))]
        listing = " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))
        return Example("common_words", f"Words: {listing}. Which {num_common} words occur most "
                       "often, in alphabetical order? They are:", " " + " ".join(common),
                       tuple(common))

    return _fill(budget, count_tokens, build)


def marked_passkey(rng: np.random.Generator, budget: int, count_tokens: Callable[[Example], int],
                   digits: int = 10, marker: str = "#") -> Example:
    """A terse pass key for training: `#4821930576.` at a random depth of filler; the prompt
    ends with ` #` and the answer is the key. The marker is the only token that precedes the
    key in both places, so a previous-token head plus an induction head retrieve it exactly,
    and the example fits from ~`digits` + 6 tokens up: short ones teach the copy quickly,
    long ones teach it at distance (data/passkey.py packs them into training rows)."""
    key, depth = _number(rng, digits), float(rng.uniform())

    def build(units: int) -> Example:
        body = _with_inserts(units, [f"{marker}{key}."], [depth])
        return Example("marked_passkey", f"{body} {marker}", key, (key,))

    return _fill(budget, count_tokens, build)


# Not among the default TASKS: the task of data.source=passkey runs (data/passkey.py).
EXTRA_TASKS = ("marked_passkey",)
ALL_TASKS = (*TASKS, *EXTRA_TASKS)
GENERATORS: dict[str, Callable[..., Example]] = {
    "passkey": passkey, "multikey_niah": multikey_niah,
    "variable_tracking": variable_tracking, "common_words": common_words,
    "marked_passkey": marked_passkey,
}


def check_tasks(tasks: Sequence[str]) -> None:
    for task in tasks:
        if task not in GENERATORS:
            raise ValueError(f"task={task!r} is not allowed; choose one of "
                             f"{', '.join(ALL_TASKS)}")


def make_examples(task: str, length: int, count: int, count_tokens: Callable[[Example], int],
                  seed: int = 0, **options: Any) -> list[Example]:
    """`count` examples of `task` whose prompt + answer fit a row of `length` + 1 tokens.

    As in training, a row of S + 1 tokens gives S inputs and S next-token targets. `options`
    go to the task's generator (marked_passkey: digits).
    """
    check_tasks([task])
    rng = np.random.default_rng([seed, ALL_TASKS.index(task), length])
    return [GENERATORS[task](rng, length + 1, count_tokens, **options) for _ in range(count)]


def token_counter(tokenizer: Any, add_bos: bool) -> Callable[[Example], int]:
    """Tokens of an example exactly as the model reads it (prompt and answer encoded apart)."""
    return lambda e: len(encode_example_text(tokenizer, e.prompt, e.answer_text, add_bos)[0])


def encode_example_text(tokenizer: Any, prompt: str, answer_text: str, add_bos: bool
                        ) -> tuple[np.ndarray, int]:
    """(tokens of prompt then answer, number of answer tokens)."""
    prompt_ids = [int(i) for i in tokenizer.encode([prompt])[0]]
    answer_ids = [int(i) for i in tokenizer.encode([answer_text])[0]] if answer_text else []
    ids = ([int(tokenizer.bos_id)] if add_bos else []) + prompt_ids + answer_ids
    return np.asarray(ids, np.int32), len(answer_ids)
