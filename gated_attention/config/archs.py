"""The architectures and their training recipes, by name (`arch=` in a config string).

An arch name means one model and one run whichever config file builds it: its shapes
(ARCHS), its sequence length and dtype (ARCH_RUN_DEFAULTS), and how it trains
(ARCH_TRAINING: "section.field" values that run_config.base_config applies over the section
defaults).
"""

from __future__ import annotations

from typing import Any

# Shapes from the paper (docs/method.md); `tiny` trains in seconds on a CPU.
ARCHS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=1024, num_layers=4, d_model=128, num_heads=4, num_kv_heads=2,
                 head_dim=32, mlp_dim=384, tied_embeddings=True, qk_norm=True),
    "small": dict(vocab_size=32_000, num_layers=12, d_model=768, num_heads=12, num_kv_heads=6,
                  head_dim=64, mlp_dim=2560, tied_embeddings=True, qk_norm=True),
    "dense_1p7b_28l": dict(vocab_size=151_936, num_layers=28, d_model=2048, num_heads=16,
                           num_kv_heads=8, head_dim=128, mlp_dim=6144, tied_embeddings=True,
                           qk_norm=True),
    "dense_1p7b_48l": dict(vocab_size=151_936, num_layers=48, d_model=1536, num_heads=16,
                           num_kv_heads=8, head_dim=128, mlp_dim=4608, tied_embeddings=True,
                           qk_norm=True),
    "moe_15a2b": dict(vocab_size=151_936, num_layers=24, d_model=2048, num_heads=32,
                      num_kv_heads=4, head_dim=128, mlp_dim=768, tied_embeddings=False,
                      qk_norm=True, num_experts=128, experts_per_token=8, expert_mlp_dim=768,
                      moe_impl="auto"),
    "tiny_moe": dict(vocab_size=1024, num_layers=4, d_model=128, num_heads=4, num_kv_heads=2,
                     head_dim=32, mlp_dim=128, tied_embeddings=False, qk_norm=True,
                     num_experts=8, experts_per_token=2, expert_mlp_dim=128, moe_impl="auto"),
    "small_moe": dict(vocab_size=32_000, num_layers=12, d_model=768, num_heads=12,
                      num_kv_heads=6, head_dim=64, mlp_dim=512, tied_embeddings=False,
                      qk_norm=True, num_experts=32, experts_per_token=4, expert_mlp_dim=512,
                      moe_impl="auto"),
    # The synthetic sink task (data.source=bigram_backcopy, docs/sinks.md): 64 chain tokens
    # + BOS; a first-token sink forms in about 1,000 steps on a CPU.
    "sink_tiny": dict(vocab_size=65, num_layers=2, d_model=64, num_heads=1, num_kv_heads=1,
                      head_dim=32, mlp_dim=16, tied_embeddings=False, qk_norm=True),
    # Marked pass keys (data.source=passkey, docs/long_context.md): bytes; whole keys are
    # retrieved at 256 tokens after about 600 steps on a CPU.
    "passkey_tiny": dict(vocab_size=260, num_layers=2, d_model=64, num_heads=4, num_kv_heads=4,
                         head_dim=16, mlp_dim=128, tied_embeddings=True, qk_norm=True),
}
# Sequence length and dtype defaults per arch (the paper trains at 4096 in bf16).
ARCH_RUN_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": dict(seq_len=256, dtype="float32"),
    "tiny_moe": dict(seq_len=256, dtype="float32"),
    "small": dict(seq_len=1024, dtype="bfloat16"),
    "small_moe": dict(seq_len=1024, dtype="bfloat16"),
    "dense_1p7b_28l": dict(seq_len=4096, dtype="bfloat16"),
    "dense_1p7b_48l": dict(seq_len=4096, dtype="bfloat16"),
    "moe_15a2b": dict(seq_len=4096, dtype="bfloat16"),
    "sink_tiny": dict(seq_len=64, dtype="float32", source="bigram_backcopy"),
    "passkey_tiny": dict(seq_len=256, dtype="float32", source="passkey", tokenizer="byte"),
}
# How each arch trains unless told otherwise ("section.field": value, applied by
# base_config), so an arch name means one run whichever config file builds it
# (configs/tiny.py, configs/ablation.py, a table's file). Fields not named keep the section
# defaults (train_section, optimizer_section).
_CPU_MINUTES = {  # a run on a CPU in minutes, with a checkpoint and an eval every 100 steps
    "train.steps": 300, "train.batch_size": 16, "train.eval_every": 100,
    "train.checkpoint_every": 100, "optimizer.warmup_steps": 30,
}
# The paper recipes' chunked loss: vocabulary tiles of 8192 entries, whose live tile does not
# grow with the rows per chip. Token tiles (train.loss_tiles=tokens) save the recomputed
# logits matmul (-5.2% FLOPs at the 1.7B on v5p-8, benchmarks/RESULTS.md) but hold
# 4 x rows x chunk x vocab bytes at once: +2.4 GB per chip at 4 rows and 2048 positions,
# more than the 0.7 GiB the MoE's smallest v6e slice has left.
PAPER_LOSS_TILES, PAPER_LOSS_CHUNK = "vocab", 8192
_PAPER_SCALE = {  # FSDP over every chip, 1024 sequences a step, warm-up over 1,000 steps
    "model.remat": "dots_with_no_batch_dims_saveable", "train.batch_size": 1024,
    "train.eval_every": 1_000, "train.checkpoint_every": 1_000,
    "optimizer.warmup_steps": 1_000, "mesh.data": 1, "mesh.fsdp": -1,
    "train.loss_chunk_size": PAPER_LOSS_CHUNK, "train.loss_tiles": PAPER_LOSS_TILES,
}
# Table 2: 400B tokens at 4M tokens a step, peak learning rate 4e-3.
_DENSE_1P7B_RECIPE = {**_PAPER_SCALE, "train.steps": 95_000, "optimizer.peak_lr": 4e-3}
# Tables 1, 3, 4, 6: 100k steps, cosine from 2e-3 to 3e-5.
_MOE_15A2B_RECIPE = {**_PAPER_SCALE, "train.steps": 100_000, "optimizer.peak_lr": 2e-3,
                     "optimizer.final_lr": 3e-5}
# The synthetic sink task's recipe (docs/sinks.md): a first-token sink forms under it.
SINK_RECIPE = {
    "data.source": "bigram_backcopy", "data.seq_len": 64,
    "train.steps": 1000, "train.batch_size": 64, "train.eval_every": 500,
    "train.eval_batches": 2, "train.log_every": 50, "train.checkpoint_every": 1000,
    "optimizer.peak_lr": 1e-2, "optimizer.warmup_steps": 100, "optimizer.final_lr": 1e-4,
}
ARCH_TRAINING: dict[str, dict[str, Any]] = {
    "tiny": _CPU_MINUTES, "tiny_moe": _CPU_MINUTES,
    "dense_1p7b_28l": _DENSE_1P7B_RECIPE, "dense_1p7b_48l": _DENSE_1P7B_RECIPE,
    "moe_15a2b": _MOE_15A2B_RECIPE, "sink_tiny": SINK_RECIPE,
}
# Archs whose decoder blocks are scanned by default (model.scan_layers): deep enough that
# compiling layer by layer takes minutes.
SCANNED_ARCHS = ("dense_1p7b_28l", "dense_1p7b_48l", "moe_15a2b")
