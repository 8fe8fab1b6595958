"""Analysis of trained models: attention sinks, massive activations, gate scores, sparsity,
attention maps, training stability, and the plots that show them (docs/method.md, "Metrics").

Everything here reads what the model exposes through `capture=` (gated_attention/model/capture.py)
or what training wrote to metrics.jsonl; nothing re-implements the model.
"""
