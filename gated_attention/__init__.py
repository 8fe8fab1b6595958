"""Gated attention for LLMs in JAX/Flax NNX.

Importing the package changes nothing: the commands (the modules at this level) choose the
platform first (cli/platform.py).
"""
