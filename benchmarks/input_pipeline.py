"""Input pipeline speed per host CPU core, next to what one host's chips consume.

    python benchmarks/input_pipeline.py                 # the CPython docs, all on one core
    python benchmarks/input_pipeline.py --hf_tokenizer=/path/to/qwen/tokenizer.json

Rows:
- on-the-fly tokenization (what the local, tfds and seqio sources do on every host), for each
  tokenizer: bytes, SentencePiece BPE and a byte-level BPE `tokenizer.json` (trained here on
  the corpus with --vocab pieces, or the file given with --hf_tokenizer, e.g. the paper's);
- the ArrayRecord path (data.source=array_record): shards written once by data.prepare, then
  read, decoded, chunked, packed and batched by grain, with both data.packing modes.
The process is pinned to one core (os.sched_setaffinity), so every thread a library starts
shares it: the figures are tokens/s per host core. The table's last rows are what one host
needs at 50% MFU for dense_1p7b_28l at seq_len 4096: chips per host x 0.5 x peak bf16
FLOP/s / training FLOPs per token (inspect.train_flops_per_token).
"""

from __future__ import annotations

import datetime
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from absl import flags

from gated_attention.cli import flags as cli_flags
from gated_attention.config import run_config
from gated_attention.data import array_record_source, corpus, prepare, streams, tokenizer
from gated_attention.data.hf_tokenizer import HFTokenizer
from gated_attention.inspect import train_flops_per_token

# (chips per host, dense bf16 peak TFLOP/s per chip)
HOSTS = {"TPU v5e host (4 chips)": (4, 197.0), "TPU v5p host (4 chips)": (4, 459.0),
         "H200 host (8 GPUs)": (8, 989.0)}
TARGET_ARCH, TARGET_SEQ, TARGET_MFU = "dense_1p7b_28l", 4096, 0.5


def needed_tokens_per_s() -> dict[str, float]:
    cfg = run_config.model_config(run_config.base_config(TARGET_ARCH, "baseline"))
    per_token = train_flops_per_token(cfg, TARGET_SEQ)
    return {name: chips * TARGET_MFU * peak * 1e12 / per_token
            for name, (chips, peak) in HOSTS.items()}


def train_bpe(texts: list[str], vocab: int, path: Path) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(path))
    return str(path)


def time_tokenize(tok: Any, texts: list[str], min_seconds: float) -> tuple[float, int]:
    """(tokens/s, tokens per pass) of encoding every text, repeated for min_seconds."""
    tokens, passes, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < min_seconds or not passes:
        for i in range(0, len(texts), 256):
            tokens += sum(len(x) for x in tok.encode(texts[i:i + 256]))
        passes += 1
    return tokens / (time.perf_counter() - start), tokens // passes


def time_array_record(folder: str, packing: str, seq_len: int, batch: int,
                      min_seconds: float) -> float:
    data = run_config.data_section("tiny")
    data.update(dict(seq_len=seq_len, packing=packing))
    manifest = array_record_source.read_manifest(folder)
    docs = array_record_source.train_documents(folder, manifest, seed=0)
    it = iter(streams.batches(docs, data, batch, 0, seed=0, shuffle_bins=True))
    next(it)  # start the reader threads
    rows, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_seconds:
        rows += len(next(it)["inputs"])
    return rows * seq_len / (time.perf_counter() - start)


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The script's flags, on `flag_values` (importing the module defines none)."""
    flags.DEFINE_string("hf_tokenizer", "", "A tokenizer.json to time.",
                        flag_values=flag_values)
    flags.DEFINE_integer("vocab", 32_000, "Pieces of the trained ones.",
                         flag_values=flag_values)
    flags.DEFINE_integer("seq_len", 4096, "Tokens per row.", flag_values=flag_values)
    flags.DEFINE_integer("batch", 8, "Rows per host batch.", flag_values=flag_values)
    flags.DEFINE_float("seconds", 5.0, "Time per row.", flag_values=flag_values)
    flags.DEFINE_integer("cores", 1, "Cores to pin the process to.", flag_values=flag_values)
    return flag_values


def main() -> None:
    args = cli_flags.Command("benchmarks/input_pipeline.py", __doc__).parse(
        define_flags(flags.FlagValues()))
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:args.cores]))

    documents = corpus.cpython_docs()
    texts = [d.text for d in documents]
    work = Path(tempfile.mkdtemp(prefix="input_pipeline_"))
    hf_path = args.hf_tokenizer or train_bpe(texts, args.vocab, work / "tokenizer.json")
    tokenizers = {
        "byte": tokenizer.ByteTokenizer(),
        f"sentencepiece bpe {args.vocab}": tokenizer.get_tokenizer("sentencepiece", args.vocab,
                                                                   documents),
        f"hf {'file' if args.hf_tokenizer else 'byte-level bpe'} "
        f"{HFTokenizer(hf_path).vocab_size}": HFTokenizer(hf_path),
    }
    rows: list[tuple[str, float, str]] = []
    for name, tok in tokenizers.items():
        rate, per_pass = time_tokenize(tok, texts, args.seconds)
        rows.append((f"on-the-fly tokenization: {name}", rate,
                     f"{per_pass / 1e6:.2f}M tokens per pass"))

    config = run_config.base_config("tiny", "baseline")
    config.data.update(dict(tokenizer="hf", tokenizer_path=hf_path))
    config.model.vocab_size = -(-HFTokenizer(hf_path).vocab_size // 128) * 128
    start = time.perf_counter()
    manifest = prepare.prepare(config, str(work / "shards"), num_shards=4)
    rows.append(("prepare (tokenize + write shards, once)",
                 (manifest["splits"]["train"]["tokens"] + manifest["splits"]["held_out"]
                  ["tokens"]) / (time.perf_counter() - start), "4 shards, hf tokenizer"))
    for packing in ("segments", "concat"):
        rate = time_array_record(str(work / "shards"), packing, args.seq_len, args.batch,
                                 args.seconds)
        rows.append((f"ArrayRecord path, packing={packing}", rate,
                     f"batch {args.batch} x {args.seq_len}"))

    print(f"{datetime.date.today()}, {platform.processor() or platform.machine()}, pinned to "
          f"{args.cores} core(s), load average {os.getloadavg()[0]:.1f}")
    print("| path | tokens/s | notes |\n|---|---|---|")
    for name, rate, note in rows:
        print(f"| {name} | {rate:,.0f} | {note} |")
    for host, rate in needed_tokens_per_s().items():
        print(f"| needed by one {host}, {TARGET_ARCH} at {TARGET_MFU:.0%} MFU | {rate:,.0f} | "
              f"seq_len {TARGET_SEQ} |")


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    main()
