"""Synthetic tasks generated on the fly, nothing read: Bigram-Backcopy (a first-token sink in
CPU-minutes), pass keys and long-context retrieval tasks, and uniform random ids (source.py,
the `synthetic` data source).
"""
