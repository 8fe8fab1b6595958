"""Decode speed: KV-cache generation next to plain recomputation, in one run.

    python benchmarks/decode.py                                   # tiny and small, batch 1 and 8
    python benchmarks/decode.py --archs=tiny --batches=1 --new_tokens=16

For each (arch, batch): tokens/s of `gated_attention.inference.generation` (prefill once, then one
token
per step from the KV cache; one jitted scan) and of a recomputation baseline that runs the
whole sequence buffer through the model for every new token (also one jitted scan over a
fixed-length buffer, so neither side recompiles). Both decode greedily from the same random
prompts and must produce the same tokens, which the script checks. Random weights: speed does
not depend on them. Each side runs once to compile and warm up, then the median of the timed
runs counts (the cached side's time includes its prefill).
"""

from __future__ import annotations

import functools
import statistics
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from flax import nnx

from gated_attention.cli import flags as cli_flags
from gated_attention.config import run_config
from gated_attention.inference import generation as generate
from gated_attention.model.transformer import build_model


@functools.partial(jax.jit, static_argnames=("graphdef", "prompt_len", "new_tokens"))
def recompute_greedy(graphdef, state, prompts, *, prompt_len: int, new_tokens: int):
    """Greedy decoding without a cache: every step runs the full [b, prompt + new] buffer."""
    b = prompts.shape[0]
    buffer = jnp.zeros((b, prompt_len + new_tokens), jnp.int32).at[:, :prompt_len].set(prompts)

    def body(buffer, t):
        model = nnx.merge(graphdef, state)
        logits, _ = model(buffer)  # causal: the zeros after t do not change position t
        nxt = jnp.argmax(jax.lax.dynamic_index_in_dim(logits, t - 1, 1, False), -1)
        return jax.lax.dynamic_update_index_in_dim(buffer, nxt.astype(jnp.int32)[:, None], t,
                                                   1), None

    steps = jnp.arange(prompt_len, prompt_len + new_tokens)
    buffer, _ = jax.lax.scan(body, buffer, steps)
    return buffer[:, prompt_len:]


def timed(fn, repeats: int) -> tuple[float, np.ndarray]:
    out = np.asarray(fn())  # compile + warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = np.asarray(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def benchmark(arch: str, batch: int, args: types.SimpleNamespace) -> dict[str, float]:
    config = run_config.base_config(arch, args.variant)
    config.model.dtype = "float32"
    if "scan_layers" in config.model:
        config.model.scan_layers = False
    model = build_model(run_config.model_config(config), seed=0)
    rng = np.random.default_rng(0)
    prompts = rng.integers(3, model.cfg.vocab_size, (batch, args.prompt_len), dtype=np.int32)
    cached_s, cached = timed(lambda: generate.generate(
        model, prompts.tolist(), args.new_tokens), args.repeats)
    graphdef, state = nnx.split(model)
    plain_s, plain = timed(lambda: recompute_greedy(
        graphdef, state, jnp.asarray(prompts), prompt_len=args.prompt_len,
        new_tokens=args.new_tokens), args.repeats)
    same = float(np.mean(cached == plain))
    new = batch * args.new_tokens
    return {"cached": new / cached_s, "plain": new / plain_s, "agree": same}


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The script's flags, on `flag_values` (importing the module defines none)."""
    flags.DEFINE_string("archs", "tiny,small", "Comma-separated archs.",
                        flag_values=flag_values)
    flags.DEFINE_string("batches", "1,8", "Comma-separated batch sizes.",
                        flag_values=flag_values)
    flags.DEFINE_string("variant", "g1_sdpa_elementwise", "The attention variant.",
                        flag_values=flag_values)
    flags.DEFINE_integer("prompt_len", 32, "Prompt tokens.", flag_values=flag_values)
    flags.DEFINE_integer("new_tokens", 32, "Tokens generated.", flag_values=flag_values)
    flags.DEFINE_integer("repeats", 3, "Timed repeats (median reported).",
                         flag_values=flag_values)
    return flag_values


def main() -> None:
    args = cli_flags.Command("benchmarks/decode.py", __doc__).parse(
        define_flags(flags.FlagValues()))
    print(f"device: {jax.device_count()} x {jax.devices()[0].device_kind}; variant="
          f"{args.variant} prompt={args.prompt_len} new={args.new_tokens} float32; greedy; "
          f"median of {args.repeats}")
    print("| arch | batch | KV cache (tokens/s) | recompute (tokens/s) | speed-up | same tokens |")
    print("|---|---|---|---|---|---|")
    for arch in args.archs.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            r = benchmark(arch, batch, args)
            print(f"| {arch} | {batch} | {r['cached']:,.1f} | {r['plain']:,.1f} | "
                  f"{r['cached'] / r['plain']:.2f}x | {r['agree']:.0%} |", flush=True)


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    main()
