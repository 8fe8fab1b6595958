"""Decoder-only language model built from layers/: embed, N decoder blocks, norm, logits.

With `model.scan_layers` the N blocks are one DecoderBlock whose parameters carry a leading
"layers" axis, run by `nnx.scan` (remat inside the scan body): the compiler sees one layer
instead of N, so compile time stays flat in depth. `stack_layer_params` /
`unstack_layer_params` convert a parameter state between the per-layer and the scanned
layouts (checkpoints, imported weights).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention.model.capture import validate_capture
from gated_attention.model.layers.block import DecoderBlock
from gated_attention.model.layers.kv_cache import KVCache
from gated_attention.model.layers.norms import RMSNorm
from gated_attention.model.layers.params import cast, param
from gated_attention.model.model_config import REMAT_POLICIES, ModelConfig
from gated_attention.parallel.sharding import constrain

Aux = dict[str, jax.Array]


class Transformer(nnx.Module):
    """Pre-norm decoder LM. `__call__` returns (logits [b, s, vocab] float32, aux losses)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = param(rngs, (cfg.vocab_size, cfg.d_model), ("vocab", "embed"))
        if cfg.scan_layers:
            self.layers = _stacked_blocks(cfg, rngs)
        else:
            self.layers = nnx.List([DecoderBlock(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.d_model, rngs=rngs, eps=cfg.norm_eps,
                                  zero_centred=cfg.zero_centred_norm)
        if not cfg.tied_embeddings:
            self.lm_head = param(rngs, (cfg.d_model, cfg.vocab_size), ("embed", "vocab"))

    def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
                 segment_ids: jax.Array | None = None,
                 capture: frozenset[str] | tuple[str, ...] = frozenset(),
                 kv_caches: list[KVCache] | None = None,
                 logits_dtype: jnp.dtype = jnp.float32,
                 ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """kv_caches: one per layer when decoding (gated_attention/generate.py).
        logits_dtype: what the logits matmul writes (float32 accumulation either way;
        train.logits_dtype)."""
        x, head, aux_total = self.features(tokens, positions=positions,
                                           segment_ids=segment_ids, capture=capture,
                                           kv_caches=kv_caches)
        logits = jnp.einsum("bsD,VD->bsV", x, head, preferred_element_type=logits_dtype)
        logits = constrain(logits, ("batch", "length", "vocab"))
        return logits, aux_total

    def output_table(self, table: jax.Array) -> jax.Array:
        """The logits' projection as [vocab, d_model] in the compute dtype: the gathered
        embedding table itself when tied, else lm_head transposed."""
        if self.cfg.tied_embeddings:
            return table
        return cast(self.lm_head, self.cfg.compute_dtype).T

    def features(self, tokens: jax.Array, *, positions: jax.Array | None = None,
                 segment_ids: jax.Array | None = None,
                 capture: frozenset[str] | tuple[str, ...] = frozenset(),
                 kv_caches: list[KVCache] | None = None,
                 ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """(final hidden states [b, s, d_model], output table [vocab, d_model], aux losses):
        the logits are `x @ table.T` (`__call__`), or never formed whole
        (losses.chunked_cross_entropy)."""
        cfg = self.cfg
        capture = validate_capture(capture)
        if capture and kv_caches is not None:
            raise ValueError("capture needs the whole sequence; run the model over the finished "
                             "text instead of capturing while decoding with kv_caches")
        if kv_caches is not None and cfg.scan_layers:
            raise ValueError("decoding with kv_caches needs per-layer blocks: build the model "
                             "with model.scan_layers=False (unstack_layer_params converts the "
                             "parameters)")
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        # FSDP: the table is cast to the compute dtype while still sharded, then its embed
        # dimension gathered once (as for every weight) and used for both the lookup and,
        # when tied, the logits; so the looked-up rows come out split by batch, and the
        # table's gradient is summed in the compute dtype and reduce-scattered back to the
        # parameter's sharded layout (one [vocab, d_model] buffer, not one per use, in f32).
        table = gathered_table(cast(self.embed, cfg.compute_dtype))
        x = jnp.take(table, tokens, axis=0)
        x = constrain(x, ("batch", "length", "embed"))
        if cfg.scan_layers:
            x, aux_total = self._run_scanned(x, positions, segment_ids, capture)
        else:
            x, aux_total = self._run_layer_by_layer(x, positions, segment_ids, capture,
                                                    kv_caches)
        x = self.final_norm(x)
        return x, self.output_table(table), aux_total

    def _run_layer_by_layer(self, x: jax.Array, positions: jax.Array,
                            segment_ids: jax.Array | None, capture: frozenset[str],
                            kv_caches: list[KVCache] | None = None) -> tuple[jax.Array, Aux]:
        aux_total: Aux = {}
        for i, block in enumerate(self.layers):
            if kv_caches is not None:
                x, aux = block(x, positions, segment_ids, capture, kv_caches[i])
            elif self.cfg.remat != "none" and not capture:
                run = nnx.remat(lambda blk, *a: blk(*a), policy=REMAT_POLICIES[self.cfg.remat])
                x, aux = run(block, x, positions, segment_ids)
            else:
                x, aux = block(x, positions, segment_ids, capture)
            x = constrain(x, ("batch", "length", "embed"))
            for name, value in aux.items():
                aux_total[name] = aux_total.get(name, 0.0) + value
        return x, aux_total

    def _run_scanned(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None,
                     capture: frozenset[str]) -> tuple[jax.Array, Aux]:
        """One traced block, scanned over the stacked layer axis; aux summed over layers.

        Captured intermediates are sown inside the scan, so they come out stacked along the
        layer axis (capture.collect splits them per layer).
        """

        def one_block(block: DecoderBlock, h: jax.Array) -> tuple[jax.Array, Aux]:
            h, aux = block(h, positions, segment_ids, capture)
            return constrain(h, ("batch", "length", "embed")), aux

        if self.cfg.remat != "none" and not capture:
            one_block = nnx.remat(one_block, policy=REMAT_POLICIES[self.cfg.remat],
                                  prevent_cse=False)
        scan = nnx.scan(one_block, in_axes=(0, nnx.Carry), out_axes=(nnx.Carry, 0))
        x, aux = scan(self.layers, x)
        return x, {name: value.sum(axis=0) for name, value in aux.items()}


@jax.custom_vjp
def gathered_table(table: jax.Array) -> jax.Array:
    """The embedding table with its embed dimension gathered (FSDP), for the lookup and the
    tied logits. Its gradient, summed from both uses, is constrained back to the parameter's
    layout (vocab, embed): the compiler reduce-scatters it (each device receives its shard)
    instead of all-reducing a whole [vocab, d_model] copy to every device."""
    return constrain(table, ("vocab", None))


def _gathered_table_fwd(table: jax.Array) -> tuple[jax.Array, None]:
    return gathered_table(table), None


def _gathered_table_bwd(_: None, cotangent: jax.Array) -> tuple[jax.Array]:
    return (constrain(cotangent, ("vocab", "embed")),)


gathered_table.defvjp(_gathered_table_fwd, _gathered_table_bwd)


def _stacked_blocks(cfg: ModelConfig, rngs: nnx.Rngs) -> DecoderBlock:
    """num_layers blocks as one DecoderBlock whose parameters gain a leading "layers" axis."""

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def create(rngs: nnx.Rngs) -> DecoderBlock:
        return DecoderBlock(cfg, rngs=rngs)

    return create(rngs)


def _layer_index(part: Any) -> int | None:
    return int(part) if isinstance(part, int) or str(part).isdigit() else None


def stack_layer_params(params: nnx.State, cfg: ModelConfig) -> nnx.State:
    """Per-layer parameters (`layers.<i>.…`) -> the scanned layout (`layers.…`, [L, ...]).

    `cfg` describes the model (its scan_layers is ignored); the result matches
    `nnx.state(Transformer(cfg.replace(scan_layers=True)), nnx.Param)`.
    """
    per_layer: dict[tuple[Any, ...], dict[int, jax.Array]] = {}
    rest: dict[tuple[Any, ...], jax.Array] = {}
    for path, leaf in nnx.to_flat_state(params):
        value = leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf
        if path[0] == "layers" and len(path) > 1 and _layer_index(path[1]) is not None:
            per_layer.setdefault(("layers", *path[2:]), {})[_layer_index(path[1])] = value
        else:
            rest[tuple(path)] = value
    values = dict(rest)
    for path, layers in per_layer.items():
        if sorted(layers) != list(range(cfg.num_layers)):
            raise ValueError(f"{'.'.join(map(str, path))}: layers {sorted(layers)} given, "
                             f"the model has {cfg.num_layers}")
        values[path] = jnp.stack([layers[i] for i in range(cfg.num_layers)])
    return _fill(abstract_model(cfg.replace(scan_layers=True)), values)


def unstack_layer_params(params: nnx.State, cfg: ModelConfig) -> nnx.State:
    """The scanned layout (`layers.…`, [L, ...]) -> per-layer parameters (`layers.<i>.…`)."""
    values: dict[tuple[Any, ...], jax.Array] = {}
    for path, leaf in nnx.to_flat_state(params):
        value = leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf
        if path[0] == "layers":
            for i in range(cfg.num_layers):
                values[("layers", i, *path[1:])] = value[i]
        else:
            values[tuple(path)] = value
    return _fill(abstract_model(cfg.replace(scan_layers=False)), values)


def _fill(model: Transformer, values: dict[tuple[Any, ...], jax.Array]) -> nnx.State:
    """The Param state of (abstract) `model` with every value taken from `values` by path."""
    flat = []
    target = nnx.to_flat_state(nnx.state(model, nnx.Param))
    missing = [p for p, _ in target if tuple(p) not in values]
    extra = set(values) - {tuple(p) for p, _ in target}
    if missing or extra:
        name = ".".join(map(str, (missing or sorted(extra, key=str))[0]))
        raise ValueError(f"parameter {name} is {'missing' if missing else 'not in the model'}")
    for path, var in target:
        value = values[tuple(path)]
        if tuple(value.shape) != tuple(var.get_value().shape):
            raise ValueError(f"parameter {'.'.join(map(str, path))}: shape {value.shape}, the "
                             f"model wants {var.get_value().shape}")
        flat.append((path, var.replace(value)))
    return nnx.from_flat_state(flat)


def per_layer(model: Transformer) -> Transformer:
    """The same model with one block per layer (what decoding with a KV cache and Hugging
    Face export read); a per-layer model is returned as it is."""
    if not model.cfg.scan_layers:
        return model
    cfg = model.cfg.replace(scan_layers=False)
    params = unstack_layer_params(nnx.state(model, nnx.Param), model.cfg)
    graphdef, _, rest = nnx.split(abstract_model(cfg), nnx.Param, ...)
    return nnx.merge(graphdef, params, rest)


def build_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    return Transformer(cfg, rngs=nnx.Rngs(params=seed))


def abstract_model(cfg: ModelConfig) -> Transformer:
    """The model with ShapeDtypeStructs for weights: parameter counts of 15B models on a laptop."""
    return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(params=0)))
