"""Grouped-query self-attention with QK-norm, RoPE and every gate of the paper.

Order as in docs/method.md: project q/k/v from the block's normalised input X; gate G4/G3/G2 on the
projection outputs; q/k RMSNorm; RoPE; SDPA through `ops.attention`; G1 gate (fused into the
kernel when it is a plain `attn * act(X W)`), or a parameter-free transform; concat heads;
o_proj; G5 gate. The G1 gate never goes through QK-norm or RoPE. QK-norm and RoPE run as one
float32 expression rounded once (`RMSNorm.normalize_and_rotate`): the compiled step then
stores no float32 copy of q or k between them (benchmarks/RESULTS.md, the 1.7B against
MaxText). A plain G1 gate projection runs beside q_proj's: two matmuls forward, one each way
backward (layers/paired_projection.py says why the forward stays two).

Beyond the paper (docs/beyond.md): more than one gated position (`extra_gate_positions`, one
Gate module each, `gate_<position>`); exclusive self-attention (XSA, arXiv 2603.09078:
z_i = y_i - (y_i . v_i) v_i / |v_i|^2 per head, v_i the value the head read at its own token)
after SDPA and before any G1 gate; a sliding window passed to the kernel. Interventions
(gated_attention/intervene.py) set `head_mask` (an `Intervention` variable, never a Param):
heads whose mask is 0 contribute nothing to o_proj.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention import ops
from gated_attention.model.layers.gates import Gate, Intervention  # noqa: F401 - re-exported
from gated_attention.model.layers.kv_cache import KVCache
from gated_attention.model.layers.norms import RMSNorm, rms_normalize
from gated_attention.model.layers.paired_projection import paired_projection
from gated_attention.model.layers.params import cast, param
from gated_attention.model.layers.rope import apply_rope
from gated_attention.model.layers.switch_head import SwitchHeadProjection
from gated_attention.model.model_config import ModelConfig
from gated_attention.ops import reference
from gated_attention.parallel import sharding

GATE_TARGETS = {"sdpa": "heads", "query": "heads", "key": "kv_heads", "value": "kv_heads"}
XSA_EPS = 1e-12  # only guards an all-zero value vector


def exclusive_self_attention(out: jax.Array, v: jax.Array) -> jax.Array:
    """Remove from each head's output y_i its component along the head's own value v_i.

    out [b, s, h, d]; v [b, s, kv_heads, d] (query head n reads kv head n // (h / kv_heads)).
    """
    h, kv_heads = out.shape[2], v.shape[2]
    dtype = jnp.promote_types(out.dtype, jnp.float32)
    v_own = jnp.repeat(v.astype(dtype), h // kv_heads, axis=2)
    y = out.astype(dtype)
    along = jnp.einsum("bshd,bshd->bsh", y, v_own) / (
        jnp.einsum("bshd,bshd->bsh", v_own, v_own) + XSA_EPS)
    return (y - along[..., None] * v_own).astype(out.dtype)


def _mesh_axes() -> dict:
    """Mesh axes that split the batch and the heads (for kernels run per device)."""
    rules = sharding.active_rules()
    return {name: sharding.logical_to_spec((name,), rules)[0] for name in ("batch", "heads")}


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        variant = cfg.variant
        heads, kv_heads = cfg.heads
        D, d, dtype = cfg.d_model, cfg.head_dim, cfg.compute_dtype
        self.q_proj = param(rngs, (D, heads, d), ("embed", "heads", "head_dim"))
        switch = variant.switch_target
        projection = lambda: SwitchHeadProjection(  # noqa: E731
            D, kv_heads, d, variant.switch_experts, variant.switch_top_k, rngs=rngs, dtype=dtype)
        self.k_proj = (projection() if switch == "kv"
                       else param(rngs, (D, kv_heads, d), ("embed", "kv_heads", "head_dim")))
        self.v_proj = (projection() if switch in ("v", "kv")
                       else param(rngs, (D, kv_heads, d), ("embed", "kv_heads", "head_dim")))
        self.o_proj = param(rngs, (heads, d, D), ("heads", "head_dim", "embed"))
        if cfg.qkv_bias:  # Qwen-style imports (gated_attention/hf); zero-initialised
            self.q_bias = param(rngs, (heads, d), ("heads", "head_dim"), init="zeros")
            self.k_bias = param(rngs, (kv_heads, d), ("kv_heads", "head_dim"), init="zeros")
            self.v_bias = param(rngs, (kv_heads, d), ("kv_heads", "head_dim"), init="zeros")
        if cfg.o_proj_bias:
            self.o_bias = param(rngs, (D,), ("embed",), init="zeros")
        if cfg.qk_norm:
            norm = lambda: RMSNorm(d, rngs=rngs, eps=cfg.norm_eps,  # noqa: E731
                                   zero_centred=cfg.zero_centred_norm, axis_name="head_dim")
            self.q_norm, self.k_norm = norm(), norm()
        def make_gate(position: str) -> Gate:
            if position == "dense_output":
                return Gate(variant, D, heads=None, head_dim=None, rngs=rngs, dtype=dtype)
            axis = GATE_TARGETS[position]
            return Gate(variant, D, heads=heads if axis == "heads" else kv_heads,
                        head_dim=d, heads_axis=axis, rngs=rngs, dtype=dtype)

        self.gate = make_gate(variant.gate_position) if variant.gated else None
        for position in variant.extra_positions:
            setattr(self, f"gate_{position}", make_gate(position))
        # An Intervention [heads] set by gated_attention/intervene.py (None: every head).
        self.head_mask = nnx.data(None)
        if variant.normalizer == "learned_sink":
            self.sink_logits = param(rngs, (heads,), ("heads",), init="zeros")

    def _project(self, proj: nnx.Param | SwitchHeadProjection, x: jax.Array,
                 bias: str = "") -> jax.Array:
        if isinstance(proj, SwitchHeadProjection):
            return proj(x)
        return self._with_bias(jnp.einsum("bsD,Dhd->bshd", x, cast(proj, self.cfg.compute_dtype)),
                               bias)

    def _with_bias(self, y: jax.Array, bias: str) -> jax.Array:
        """y plus the projection's bias `bias` (q_bias, k_bias, v_bias) where the model has
        them (cfg.qkv_bias)."""
        return y + cast(getattr(self, bias), y.dtype) if self.cfg.qkv_bias and bias else y

    def _project_q_and_gate(self, x: jax.Array, fuse_gate: bool,
                            ) -> tuple[jax.Array, jax.Array | None]:
        """q before any query gate, and the G1 gate's logits when the kernel fuses the gate
        (else None). A plain gate projection runs beside q_proj's, one matmul each way in
        the backward (layers/paired_projection.py)."""
        if not fuse_gate:
            return self._project(self.q_proj, x, "q_bias"), None
        kernel = self.gate.plain_kernel(self.cfg.d_model)
        if kernel is None:
            return self._project(self.q_proj, x, "q_bias"), self.gate.logits(x)
        q, logits = paired_projection(x, cast(self.q_proj, self.cfg.compute_dtype),
                                      cast(kernel, self.gate.dtype))
        return self._with_bias(q, "q_bias"), logits

    def gate_for(self, position: str) -> Gate | None:
        """The gate module at `position` (gate_position or one of extra_gate_positions)."""
        variant = self.cfg.variant
        if self.gate is not None and variant.gate_position == position:
            return self.gate
        return getattr(self, f"gate_{position}", None) if position in variant.extra_positions \
            else None

    def _gate_at(self, position: str, y: jax.Array, x: jax.Array) -> jax.Array:
        gate = self.gate_for(position)
        return y if gate is None else gate(y, x)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None = None,
                 capture: frozenset[str] = frozenset(), kv_cache: KVCache | None = None,
                 ) -> jax.Array:
        """kv_cache: decoding; x holds the new tokens only and keys/values go to the cache."""
        cfg, variant = self.cfg, self.cfg.variant
        x = x.astype(cfg.compute_dtype)
        needs_ungated = bool(capture & {"sdpa_before_gate", "sdpa_after_gate"})
        fuse_gate = (variant.fusable_sdpa_gate and not needs_ungated
                     and getattr(self.gate, "forced", None) is None)
        q, gate_logits = self._project_q_and_gate(x, fuse_gate)
        q = self._gate_at("query", q, x)
        k = self._gate_at("key", self._project(self.k_proj, x, "k_bias"), x)
        v = self._gate_at("value", self._project(self.v_proj, x, "v_bias"), x)
        # QK-norm and RoPE in float32, one rounding to the compute dtype after both.
        rope = dict(base=cfg.rope_base, scaling=cfg.rope_scaling, rotary_dim=cfg.rotary_dim)
        if cfg.qk_norm:
            q = self.q_norm.normalize_and_rotate(q, positions, **rope)
            k = self.k_norm.normalize_and_rotate(k, positions, **rope)
        else:
            q, k = apply_rope(q, positions, **rope), apply_rope(k, positions, **rope)
        sink = self.sink_logits[...] if variant.normalizer == "learned_sink" else None
        if self.gate is not None and "gate_scores" in capture:
            self.sow(nnx.Intermediate, "gate_scores", self.gate.scores(x))
        self._capture_attention(q, k, segment_ids, sink, capture)

        attend = (ops.attention if kv_cache is None
                  else functools.partial(kv_cache.attend, positions=positions,
                                         rope_base=cfg.rope_base,
                                         rope_scaling=cfg.rope_scaling))
        out = attend(
            q, k, v,
            gate=gate_logits,
            gate_activation=variant.activation,
            segment_ids=segment_ids, causal=True, normalizer=variant.normalizer,
            sink_logits=sink, impl=cfg.attention_impl,
            block_sizes=dict(cfg.block_sizes) or None, mesh_axes=_mesh_axes(),
            splash_fused_backward=cfg.splash_fused_backward,
            **({"window": variant.window} if variant.window else {}),
        )
        if variant.exclusive_self_attention:
            out = exclusive_self_attention(out, v)
        if not fuse_gate:
            if "sdpa_before_gate" in capture:
                self.sow(nnx.Intermediate, "sdpa_before_gate", out)
            if variant.sdpa_transform == "silu":
                out = jax.nn.silu(out)
            elif variant.sdpa_transform == "rmsnorm":
                out = rms_normalize(out, cfg.norm_eps).astype(out.dtype)
            out = self._gate_at("sdpa", out, x)
            if "sdpa_after_gate" in capture:
                self.sow(nnx.Intermediate, "sdpa_after_gate", out)
        if self.head_mask is not None:
            out = out * self.head_mask[...].astype(out.dtype)[:, None]
        out = jnp.einsum("bshd,hdD->bsD", out, cast(self.o_proj, cfg.compute_dtype))
        if cfg.o_proj_bias:
            out = out + cast(self.o_bias, out.dtype)
        return self._gate_at("dense_output", out, x)

    def _capture_attention(self, q: jax.Array, k: jax.Array, segment_ids: jax.Array | None,
                           sink: jax.Array | None, capture: frozenset[str]) -> None:
        kwargs = dict(segment_ids=segment_ids, causal=True,
                      normalizer=self.cfg.variant.normalizer, sink_logits=sink,
                      window=self.cfg.variant.window)
        if "attention_probs" in capture:
            self.sow(nnx.Intermediate, "attention_probs",
                     reference.attention_weights(q, k, **kwargs))
        if "first_token_attention" in capture:
            self.sow(nnx.Intermediate, "first_token_attention",
                     reference.first_token_weights(q, k, **kwargs))
