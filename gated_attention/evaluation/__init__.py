"""Downstream evaluation through EleutherAI's lm-evaluation-harness (`lm-eval`).

- backend.py: `JaxLM`, lm-eval's `TemplateLM` backed by this project's model (loglikelihood
  with is_greedy, rolling log-likelihoods, generate_until), following lm-eval's `hf` backend's
  conventions so the numbers are that backend's;
- engine.py: the compiled scoring and KV-cache decoding, batched over length buckets and
  split over the mesh's devices; buckets.py: the buckets and padding;
- tokens.py: text <-> ids with transformers' conventions, from the tokenizer's own files;
- loading.py: a run's workdir or a Hugging Face folder; runner.py: tasks and lm-eval's output.

The command is `python -m gated_attention.harness` (gated_attention/harness.py).
"""
