"""The synthetic RULER-like tasks: answers right by construction (re-derived from the prompt
text by independent parsers), lengths on budget, and a scorer that rejects wrong answers."""

import collections
import re

import numpy as np
import pytest

from gated_attention.analysis import retrieval_scores as rt
from gated_attention.data.tokenizer import ByteTokenizer

TOKENIZER = ByteTokenizer(260)
COUNT = rt.token_counter(TOKENIZER, add_bos=False)


def solve(example: rt.Example) -> tuple[str, ...]:
    """Answer each task from its prompt alone, without the generator's bookkeeping."""
    text = example.prompt
    if example.task == "passkey":
        return tuple(re.findall(r"The pass key is (\d+)\. Remember it\.", text))
    if example.task == "multikey_niah":
        asked = re.search(r"What is the special magic number for (\w+)\?", text).group(1)
        return tuple(re.findall(rf"One special magic number for {asked} is: (\d+)\.", text))
    if example.task == "variable_tracking":
        value = re.search(r"Which variables hold the value (\d+)\?", text).group(1)
        holders: list[str] = []
        for name, rhs in re.findall(r"VAR (\w+) = (VAR \w+|\d+)\.", text):
            if rhs == value or rhs.removeprefix("VAR ") in holders:
                holders.append(name)
        return tuple(holders)
    words = re.findall(r"\d+\. (\w+)", text.split("Which")[0])
    counts = collections.Counter(words).most_common()
    k = int(re.search(r"Which (\d+) words", text).group(1))
    assert counts[k - 1][1] > counts[k][1], "the top words must be strictly more frequent"
    return tuple(sorted(w for w, _ in counts[:k]))


@pytest.mark.parametrize("task", rt.TASKS)
@pytest.mark.parametrize("length", [300, 2000])
def test_answers_are_right_by_construction_and_fit_the_length(task, length):
    examples = rt.make_examples(task, length, 3, COUNT, seed=1)
    for example in examples:
        assert solve(example) == example.answers
        assert example.answer_text.split() == list(example.answers)
        tokens = COUNT(example)
        assert length + 1 - 40 <= tokens <= length + 1  # filled to within one filler unit
    assert len({e.prompt for e in examples}) == 3  # seeded, yet each example differs
    again = rt.make_examples(task, length, 3, COUNT, seed=1)
    assert [e.prompt for e in again] == [e.prompt for e in examples]


def test_scorer_rejects_wrong_answers():
    passkey = rt.make_examples("passkey", 300, 1, COUNT)[0]
    key = passkey.answers[0]
    assert rt.score(passkey, passkey.answer_text) == 1.0
    assert rt.score(passkey, f" {key[::-1]}" if key != key[::-1] else " 00000") == 0.0
    assert rt.score(passkey, f" {key}7") == 0.0  # a longer number is not the key
    assert rt.score(passkey, f" {key[:-1]}") == 0.0
    tracking = rt.make_examples("variable_tracking", 600, 1, COUNT)[0]
    names = list(tracking.answers)
    assert rt.score(tracking, " ".join(names[:-1])) == pytest.approx(0.8)
    assert rt.score(tracking, " ".join(n.lower() for n in names)) == 0.0


def test_too_short_a_length_is_refused_with_the_task_name():
    with pytest.raises(ValueError, match="too short for task 'variable_tracking'"):
        rt.make_examples("variable_tracking", 100, 1, COUNT)
    with pytest.raises(ValueError, match="task='ruler' is not allowed; choose one of passkey, "
                       "multikey_niah, variable_tracking, common_words, marked_passkey"):
        rt.make_examples("ruler", 100, 1, COUNT)


def test_teacher_forced_scoring_reads_the_answer_positions():
    examples = [rt.make_examples(t, 600, 1, COUNT)[0] for t in rt.TASKS]
    batch = rt.answer_batch(examples, TOKENIZER, 600, add_bos=False)
    # A perfect predictor (argmax = the next token) scores 1; one wrong answer token less.
    assert rt.score_predictions(examples, TOKENIZER, batch["targets"],
                                batch["answer_mask"]) == [1.0] * 4
    wrong = batch["targets"].copy()
    first_answer = np.argmax(batch["answer_mask"], axis=1)
    wrong[np.arange(4), first_answer + 1] = TOKENIZER.encode(["#"])[0][0]
    scores = rt.score_predictions(examples, TOKENIZER, wrong, batch["answer_mask"])
    assert scores[0] == scores[1] == 0.0 and 0.0 <= scores[2] < 1.0 and scores[3] < 1.0


class WordTokenizer:
    """A word-level stand-in whose encoding of a piece costs one extra start token, as a
    SentencePiece model may: prompt and answer encoded apart take more than their join."""

    pad_id, bos_id, eos_id = 0, 1, 2

    def __init__(self):
        self.ids: dict[str, int] = {}

    def encode(self, texts):
        return [np.asarray([3] + [self.ids.setdefault(w, 4 + len(self.ids))
                                  for w in t.split()], np.int32) for t in texts]

    def decode(self, ids):
        words = {i: w for w, i in self.ids.items()}
        return " ".join(words.get(int(i), "") for i in ids)


def test_length_budget_counts_tokens_as_the_model_reads_them():
    tokenizer = WordTokenizer()
    count = rt.token_counter(tokenizer, add_bos=True)
    for task in rt.TASKS:
        examples = rt.make_examples(task, 200, 2, count)
        batch = rt.answer_batch(examples, tokenizer, 200, add_bos=True)  # raises if too long
        assert rt.score_predictions(examples, tokenizer, batch["targets"],
                                    batch["answer_mask"]) == [1.0, 1.0]
