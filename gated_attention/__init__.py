"""Gated attention for LLMs in JAX/Flax NNX."""
