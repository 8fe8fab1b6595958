"""lm-eval backends side by side: this project's JAX backend against lm-eval's `hf` backend
(transformers + torch) on the same Qwen3-style weights and the same requests, in one run.

    python benchmarks/harness.py            # a small Qwen3 (d 512, 4 layers), CPU
    python benchmarks/harness.py --tiny     # seconds: a smoke run

Needs the bench extra (torch, transformers, accelerate). The model is random weights in the
Qwen3 layout written by the project's own Hugging Face export; the tokenizer a byte-level BPE
trained here (Qwen3's conventions: no BOS, <|endoftext|> ends text). Both backends read the
same folder. Columns: tokens per second of `loglikelihood` (input tokens of the rows the hf
backend scores, per second) on two request mixes, multiple choice (16 questions of a
~250-token context with 4 choices of ~30 tokens each, as HellaSwag and MMLU with answer
texts: 64 requests) and unique contexts (64 requests of a ~250-token context and a ~30-token
continuation each), and of `generate_until` (new tokens per second: 16 prompts, 64 greedy
tokens each, no stop string met), each the best of --repeats calls after one warm-up call
(ours compiles there; its time is printed too); the two backends take turns call by call, so
a change in the load of a shared machine reaches both alike. It also prints the largest
difference of the two backends' log-likelihoods and whether their greedy generations are
identical. Batch size 16 for both.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

EOS = "<|endoftext|>"
SMALL = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, head_dim=64, intermediate_size=1536, vocab_size=4096,
             max_position_embeddings=512)
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, intermediate_size=40, vocab_size=512, max_position_embeddings=256)


def write_folder(folder: pathlib.Path, shape: dict) -> list[str]:
    """Random Qwen3 weights through the project's export, and a Qwen-style tokenizer.json."""
    from pydoc_data.topics import topics  # the language reference: ships with CPython

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from gated_attention import hf
    from gated_attention.config import run_config
    from gated_attention.model.transformer import build_model

    config = run_config.base_config("tiny", "baseline")
    config.model.update(dict(vocab_size=shape["vocab_size"], d_model=shape["hidden_size"],
                             num_layers=shape["num_hidden_layers"],
                             num_heads=shape["num_attention_heads"],
                             num_kv_heads=shape["num_key_value_heads"],
                             head_dim=shape["head_dim"], mlp_dim=shape["intermediate_size"]))
    config.data.seq_len = shape["max_position_embeddings"]
    model = build_model(run_config.model_config(config), seed=0)
    hf.save_pretrained(model, config, folder, layout="qwen3")
    corpus = [" ".join(t.split()) for _, t in sorted(topics.items())]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=min(shape["vocab_size"], 4000), special_tokens=[EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": EOS, "bos_token": None, "pad_token": EOS, "add_bos_token": False,
        "tokenizer_class": "PreTrainedTokenizerFast"}))
    return corpus


def requests(corpus: list[str], n_ll: int, n_gen: int, gen_toks: int):
    """(multiple-choice, unique-context, generation) requests."""
    from lm_eval.api.instance import Instance

    text = " ".join(corpus)
    mc = [Instance("loglikelihood", {}, (text[q * 1499:q * 1499 + 1000],
                                         text[q * 1499 + 1000 + c * 120:
                                              q * 1499 + 1120 + c * 120]), 4 * q + c)
          for q in range(n_ll // 4) for c in range(4)]
    ll = [Instance("loglikelihood", {}, (text[i * 997:i * 997 + 1000],
                                         text[i * 997 + 1000:i * 997 + 1120]), i)
          for i in range(n_ll)]
    gen = [Instance("generate_until", {}, (text[i * 577:i * 577 + 400],
                                           {"until": ["\n\n\n\n"], "max_gen_toks": gen_toks,
                                            "do_sample": False}), i) for i in range(n_gen)]
    return mc, ll, gen


def timed_side_by_side(calls: list, repeats: int) -> list[tuple[float, float, object]]:
    """Per call: (first call's seconds, best of `repeats` later calls, the result). The calls
    take turns (first, second, first, second, ...), so a change in the shared machine's load
    reaches both backends alike instead of one backend's whole block."""
    out = []
    for call in calls:
        start = time.perf_counter()
        result = call()
        out.append([time.perf_counter() - start, float("inf"), result])
    for _ in range(repeats):
        for entry, call in zip(out, calls):
            start = time.perf_counter()
            entry[2] = call()
            entry[1] = min(entry[1], time.perf_counter() - start)
    return [tuple(entry) for entry in out]


def main() -> None:
    from absl import flags

    from gated_attention.cli import flags as cli_flags

    flag_values = flags.FlagValues()
    flags.DEFINE_bool("tiny", False, "A seconds-long smoke run on a tiny model.",
                      flag_values=flag_values)
    flags.DEFINE_integer("repeats", 3, "Calls per backend; the best is kept.",
                         flag_values=flag_values)
    args = cli_flags.Command("benchmarks/harness.py", __doc__).parse(flag_values)
    import jax
    import torch
    from lm_eval.models.huggingface import HFLM

    from gated_attention.evaluation import backend, engine
    from gated_attention.inference import loading

    shape = TINY if args.tiny else SMALL
    n_ll, n_gen, gen_toks = (8, 4, 8) if args.tiny else (64, 16, 64)
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp) / "model"
        corpus = write_folder(folder, shape)
        loaded = loading.load(hf_dir=str(folder))
        ours = backend.JaxLM(engine.Engine(loaded.model), loaded.codec,
                             max_length=shape["max_position_embeddings"], batch_size=16)
        theirs = HFLM(pretrained=str(folder), dtype="float32", batch_size=16, device="cpu",
                      max_length=shape["max_position_embeddings"])
        mixes = requests(corpus, n_ll, n_gen, gen_toks)
        cap = shape["max_position_embeddings"]
        ll_tokens = [sum(len((c + x)[-(cap + 1):]) - 1
                         for c, x in (ours._encode_pair(*r.args) for r in mix))
                     for mix in mixes[:2]]
        backends = (("lm-eval hf (torch)", theirs), ("gated_attention (JAX)", ours))
        rows = [[name] for name, _ in backends]
        for mix, tokens in zip(mixes[:2], ll_tokens):
            for row, (first, best, scores) in zip(rows, timed_side_by_side(
                    [lambda lm=lm, mix=mix: lm.loglikelihood(mix, disable_tqdm=True)
                     for _, lm in backends], args.repeats)):
                row += [tokens / best, first, scores]
        for row, (first, best, texts) in zip(rows, timed_side_by_side(
                [lambda lm=lm: lm.generate_until(mixes[2], disable_tqdm=True)
                 for _, lm in backends], args.repeats)):
            row += [n_gen * gen_toks / best, first, texts]
        print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}, torch "
              f"{torch.__version__} ({torch.get_num_threads()} threads); model {shape}; "
              f"load average {os.getloadavg()}")
        print("| backend | loglikelihood, multiple choice: tokens/s | first call s "
              "| loglikelihood, unique contexts: tokens/s | first call s "
              "| generate_until new tokens/s | first call s |")
        print("|---|---|---|---|---|---|---|")
        for name, mc_rate, f1, _, ll_rate, f2, _, gen_rate, f3, _ in rows:
            print(f"| {name} | {mc_rate:,.0f} | {f1:.1f} | {ll_rate:,.0f} | {f2:.1f} "
                  f"| {gen_rate:,.0f} | {f3:.1f} |")
        theirs_row, ours_row = rows
        diff = max(abs(a[0] - b[0]) for k in (3, 6) for a, b in zip(theirs_row[k],
                                                                     ours_row[k]))
        same = sum(a == b for a, b in zip(theirs_row[9], ours_row[9]))
        print(f"speed-up: loglikelihood multiple choice {ours_row[1] / theirs_row[1]:.2f}x, "
              f"unique contexts {ours_row[4] / theirs_row[4]:.2f}x, generate_until "
              f"{ours_row[7] / theirs_row[7]:.2f}x; max |loglikelihood difference| "
              f"{diff:.2e}; greedy texts identical: {same}/{len(theirs_row[9])}")


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    main()
