"""lm-eval's model interface for this project's JAX model.

Subclassing lm-eval's `TemplateLM` keeps lm-eval's own context/continuation split, its empty
context rule (the prefix token) and its request objects; the rest follows its `hf` backend
(lm_eval/models/huggingface.py) convention by convention, so the numbers equal that backend's
on the same weights:
- loglikelihood: the input is (context + continuation)[-(max_length + 1):][:-1], the
  continuation's log-probabilities are summed, `is_greedy` is whether every continuation token
  is the argmax;
- loglikelihood_rolling: lm-eval's windows (`get_rolling_token_windows` with the prefix token,
  `make_disjoint_window`), summed per text;
- generate_until: contexts cut from the left to max_length - max_gen_toks, greedy unless the
  task samples, stopped at EOS or a stop string, the text cut at the first stop string.
What differs is only how the work is laid out: rows sorted by length, padded to a few length
buckets and a fixed batch (engine.py), rows whose inputs are equal scored once (a
multiple-choice question with one-token answers is one row), and a context that several
requests share run once, its continuations over its KV cache (not when the row is cut from
the left at max_length: then the context is not whole and the full row is scored).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import (
    handle_stop_sequences,
    normalize_gen_kwargs,
    postprocess_generated_text,
)

from gated_attention.evaluation import buckets
from gated_attention.evaluation.engine import Engine
from gated_attention.evaluation.tokens import TextCodec

Request = tuple[Any, list[int], list[int]]
DEFAULT_MAX_GEN_TOKS = 256  # the hf backend's
SHARED_ROWS = 4  # continuation rows per context row in a shared-context batch (4 choices)


class JaxLM(TemplateLM):
    """The project's model as an lm-eval LM (`simple_evaluate(model=JaxLM(...))`)."""

    def __init__(self, engine: Engine, codec: TextCodec, *, max_length: int,
                 batch_size: int = 16, seed: int = 0, decode_block: int = 16,
                 name: str = "gated_attention", chat_template: str | None = None):
        super().__init__()
        self.engine, self.codec = engine, codec
        self._max_length = int(max_length)
        self.batch_rows = buckets.round_up(max(int(batch_size), 1), engine.row_multiple)
        self.seed, self.decode_block = seed, decode_block
        self.name, self.template = name, chat_template
        self._draws = 0
        self.tokens_scored = 0     # input tokens of the scored rows (benchmarks read these)
        self.tokens_generated = 0

    # ---- what TemplateLM asks of a backend
    @property
    def eot_token_id(self) -> int:
        return self.codec.eos_id

    @property
    def prefix_token_id(self) -> int:
        return self.codec.prefix_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return DEFAULT_MAX_GEN_TOKS

    @property
    def tokenizer_name(self) -> str:
        return self.name

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                   left_truncate_len: int | None = None, **kwargs: Any) -> list[int]:
        add = True if add_special_tokens is None else add_special_tokens
        if add_special_tokens is None and string.startswith(
                self.codec.text_of(self.prefix_token_id)):
            add = False  # the text brings its own BOS
        ids = self.codec.encode(string, add_special_tokens=add)
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def tok_decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.codec.decode(tokens, skip_special_tokens=skip_special_tokens)

    # ---- chat templates (--apply_chat_template), from the tokenizer's own files
    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.template if chat_template not in (False, None) else None

    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if not self.template:
            raise ValueError("the tokenizer defines no chat_template")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message: str) -> None:  # what transformers gives templates
            raise ValueError(message)

        env.globals["raise_exception"] = raise_exception
        bos = self.codec.bos_id
        return env.from_string(self.template).render(
            messages=chat_history, add_generation_prompt=add_generation_prompt,
            bos_token=self.codec.text_of(bos) if bos is not None else "",
            eos_token=self.codec.text_of(self.codec.eos_id))

    # ---- scoring
    def _loglikelihood_tokens(self, requests: Sequence[Request], disable_tqdm: bool = False,
                              **kwargs: Any) -> list[tuple[float, bool]]:
        """(sum of the continuation's log-probabilities, is_greedy) per request."""
        inputs, targets, conts = [], [], []
        by_context: dict[tuple[int, ...], list[int]] = {}
        for i, (_, context_enc, continuation_enc) in enumerate(requests):
            if not context_enc or not continuation_enc or (
                    len(continuation_enc) > self.max_length):
                raise ValueError("a request needs a context, a continuation, and a "
                                 f"continuation of at most max_length={self.max_length} tokens")
            whole = (list(context_enc) + list(continuation_enc))[-(self.max_length + 1):]
            inputs.append(tuple(whole[:-1]))
            targets.append(whole[1:])
            conts.append(len(continuation_enc))
            if len(context_enc) >= 2 and len(whole) == len(context_enc) + len(
                    continuation_enc):  # not cut from the left: the context is whole
                by_context.setdefault(tuple(context_enc), []).append(i)
        shared = [members for members in by_context.values() if len(members) > 1]
        in_shared = {i for members in shared for i in members}
        results: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        self._score_rows([i for i in range(len(requests)) if i not in in_shared], inputs,
                         targets, conts, results)
        self._score_shared_contexts(shared, requests, results)
        for (req, _, _), answer in zip(requests, results):
            if req is not None:
                self.cache_hook.add_partial("loglikelihood", req, answer)
        return results

    def _score_rows(self, which: list[int], inputs: list[tuple[int, ...]],
                    targets: list[list[int]], conts: list[int],
                    results: list[tuple[float, bool]]) -> None:
        """One full forward per row (the hf backend's layout); requests with equal inputs
        differ at most in their last target, so one row serves all of them."""
        rows: dict[tuple[int, ...], list[int]] = {}
        for i in which:
            rows.setdefault(inputs[i], []).append(i)
        keys = list(rows)
        order = buckets.longest_first(keys, [len(k) for k in keys])
        for chunk in buckets.chunks(order, self.batch_rows):
            length = buckets.bucket_length(len(keys[chunk[0]]), self.max_length)
            span = buckets.span_length(max(conts[i] for r in chunk for i in rows[keys[r]]),
                                       length)
            lead = [rows[keys[r]][0] for r in chunk]
            tok = buckets.right_padded([keys[r] for r in chunk], length, self.batch_rows)
            tgt = buckets.right_aligned([targets[i] for i in lead], span, self.batch_rows)
            ends = np.zeros(self.batch_rows, np.int32)
            ends[:len(chunk)] = [len(keys[r]) for r in chunk]
            want_last = any(len(rows[keys[r]]) > 1 for r in chunk)
            logp, greedy, last_logp = self.engine.score(tok, tgt, ends, want_last=want_last)
            self.tokens_scored += sum(len(keys[r]) for r in chunk)
            for slot, r in enumerate(chunk):
                for i in rows[keys[r]]:
                    results[i] = self._one(logp[slot], greedy[slot],
                                           last_logp[slot] if want_last else None,
                                           conts[i], targets[i][-1], i == lead[slot])

    def _score_shared_contexts(self, groups: list[list[int]], requests: Sequence[Request],
                               results: list[tuple[float, bool]]) -> None:
        """Requests sharing a context (the choices of a multiple-choice question): each
        context runs once into the KV cache, each continuation then over that cache. The
        numbers are the full rows' (same positions, same causal visibility)."""
        pieces = [members[k:k + SHARED_ROWS * self.batch_rows] for members in groups
                  for k in range(0, len(members), SHARED_ROWS * self.batch_rows)]
        pieces.sort(key=lambda members: -len(requests[members[0]][1]))
        batch: list[list[int]] = []
        for piece in pieces + [[]]:
            rows = sum(len(p) for p in batch)
            if batch and (not piece or len(batch) == self.batch_rows or
                          rows + len(piece) > SHARED_ROWS * self.batch_rows):
                self._score_shared_batch(batch, requests, results)
                batch = []
            batch.append(piece)

    def _score_shared_batch(self, batch: list[list[int]], requests: Sequence[Request],
                            results: list[tuple[float, bool]]) -> None:
        contexts = [list(requests[members[0]][1]) for members in batch]
        members = [i for piece in batch for i in piece]
        owner = np.zeros(buckets.round_up(len(members), self.batch_rows), np.int32)
        owner[:len(members)] = [c for c, piece in enumerate(batch) for _ in piece]
        ctx_tok, ctx_pos = buckets.left_padded(
            [c[:-1] for c in contexts],
            buckets.bucket_length(max(len(c) - 1 for c in contexts), self.max_length),
            self.batch_rows)
        conts = [list(requests[i][2]) for i in members]
        span = buckets.span_length(max(len(c) for c in conts), self.max_length)
        suffixes = [[contexts[owner[r]][-1]] + cont[:-1] for r, cont in enumerate(conts)]
        suf_pos = np.tile(np.arange(span, dtype=np.int32), (len(owner), 1))
        suf_pos[:len(members)] += np.asarray([len(contexts[owner[r]]) - 1
                                              for r in range(len(members))])[:, None]
        logp, greedy = self.engine.score_shared(
            ctx_tok, ctx_pos, owner, buckets.right_padded(suffixes, span, len(owner)), suf_pos,
            buckets.right_padded(conts, span, len(owner)))
        self.tokens_scored += sum(len(c) - 1 for c in contexts) + sum(map(len, conts))
        for r, (i, cont) in enumerate(zip(members, conts)):
            n = len(cont)
            results[i] = (float(logp[r, :n].sum(dtype=np.float64)), bool(greedy[r, :n].all()))

    @staticmethod
    def _one(logp: np.ndarray, greedy: np.ndarray, last_logp: np.ndarray | None, n: int,
             last_target: int, is_lead: bool) -> tuple[float, bool]:
        """One request's answer from its row's scored span (its last n positions), the last
        one read from the whole log-softmax when the row was scored for another request's
        target."""
        if is_lead:
            return float(logp[-n:].sum(dtype=np.float64)), bool(greedy[-n:].all())
        body = float(logp[len(logp) - n:-1].sum(dtype=np.float64))
        tail = float(last_logp[last_target])
        is_greedy = bool(greedy[len(logp) - n:-1].all()) and int(
            np.argmax(last_logp)) == last_target
        return body + tail, is_greedy

    def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False
                              ) -> list[float]:
        windows, owner = [], []
        for n, (text,) in enumerate(req.args for req in requests):
            for window in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, *window))
                owner.append(n)
        scores = self._loglikelihood_tokens(windows) if windows else []
        totals = [0.0] * len(requests)
        for n, (logp, _) in zip(owner, scores):
            totals[n] += logp
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", tuple(req.args), total)
        return totals

    # ---- generation
    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        out: list[str] = [""] * len(requests)
        eos_text = self.codec.text_of(self.eot_token_id)
        for members in groups.values():
            gen_kwargs = requests[members[0]].args[1]
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
            max_gen = int(kwargs.pop("max_gen_toks"))
            if max_gen >= self.max_length:
                raise ValueError(f"max_gen_toks={max_gen} must be below max_length="
                                 f"{self.max_length}")
            temperature = float(kwargs.get("temperature") or 0.0)
            if kwargs.get("do_sample"):
                temperature = temperature or 1.0
            else:
                temperature = 0.0
            contexts = [self._context_ids(requests[i].args[0], self.max_length - max_gen)
                        for i in members]
            order = buckets.longest_first(contexts, [len(c) for c in contexts])
            for chunk in buckets.chunks(order, self.batch_rows):
                texts = self._generate_chunk([contexts[j] for j in chunk], max_gen, until,
                                             temperature, float(kwargs.get("top_p") or 1.0),
                                             int(kwargs.get("top_k") or 0))
                for j, text in zip(chunk, texts):
                    i = members[j]
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out

    def _context_ids(self, context: str, keep: int) -> list[int]:
        """The prompt's ids as the hf backend's batch encoding makes them, cut from the left."""
        bos = self.codec.bos_id
        starts_with_bos = bos is not None and context.startswith(self.codec.text_of(bos))
        ids = self.codec.encode(context, add_special_tokens=not starts_with_bos)
        return ids[-keep:]

    def _generate_chunk(self, contexts: list[list[int]], max_gen: int, until: list[str],
                        temperature: float, top_p: float, top_k: int) -> list[str]:
        length = buckets.bucket_length(max(len(c) for c in contexts), self.max_length)
        tokens, positions = buckets.left_padded(contexts, length, self.batch_rows)
        eos, n = self.codec.eos_id, len(contexts)

        def finished(new: np.ndarray) -> bool:
            return all(self._stopped(row, eos, until) for row in new[:n])

        self._draws += 1
        new = self.engine.generate(tokens, positions, max_new=max_gen, block=self.decode_block,
                                   key=jax.random.fold_in(jax.random.key(self.seed),
                                                          self._draws),
                                   temperature=temperature, top_p=top_p, top_k=top_k,
                                   finished=finished)
        texts = []
        for row in new[:n]:
            ids = self._until_eos(row, eos)
            self.tokens_generated += len(ids)
            texts.append(postprocess_generated_text(self.tok_decode(ids), until, None))
        return texts

    @staticmethod
    def _until_eos(row: np.ndarray, eos: int) -> list[int]:
        hits = np.flatnonzero(row == eos)
        return [int(t) for t in (row[:hits[0]] if hits.size else row)]

    def _stopped(self, row: np.ndarray, eos: int, until: list[str]) -> bool:
        if (row == eos).any():
            return True
        text = self.tok_decode([int(t) for t in row])
        return any(stop and stop in text for stop in until)
