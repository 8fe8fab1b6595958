"""Flax NNX building blocks of the decoder: norms, RoPE, MLP, gates, attention, blocks."""
