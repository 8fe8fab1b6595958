"""Draw docs/figures/hf_q_proj_layouts.png: which rows of q_proj are which head's queries and
gate, per Hugging Face layout. The rows are not drawn by hand: labelled queries and gates go
through the exporter's own packing (gated_attention/hf/tensor_map.py) and the figure reads the
labels back, so it shows what the code writes.

    python docs/figures/hf_q_proj_layouts.py
"""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from gated_attention.config import run_config  # noqa: E402
from gated_attention.hf import layouts, tensor_map  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 4
OUT = pathlib.Path(__file__).with_suffix(".png")
GATE = 1000  # labels: head * 100 + channel for queries, GATE + that for gate rows


def row_labels(variant: str, layout: str) -> np.ndarray:
    """The label of every q_proj row the exporter writes for `variant` in `layout`."""
    config = run_config.base_config("tiny", variant)
    config.model.update(d_model=1, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM)
    cfg = run_config.model_config(config)
    head, channel = np.meshgrid(np.arange(HEADS), np.arange(HEAD_DIM), indexing="ij")
    queries = (100 * head + channel)[None].astype(np.float32)  # [D=1, H, d]
    gate = queries + GATE if variant == "g1_sdpa_elementwise" else (100 * np.arange(HEADS)
                                                                    + GATE)[None]
    rows = tensor_map.pack_q_proj(queries, gate.astype(np.float32), cfg,
                                  layouts.LAYOUTS[layout])
    return rows[:, 0].astype(int)


def main() -> None:
    panels = [("official, elementwise (per kv group: G queries, then G gates)",
               "g1_sdpa_elementwise", "official"),
              ("official, headwise (per kv group: G queries, then G gate rows of 1)",
               "g1_sdpa_headwise", "official"),
              ("qwen3_next / qwen3_5 / qwen3_5_moe (per query head: d queries, then d gates)",
               "g1_sdpa_elementwise", "qwen3_next")]
    colours = plt.get_cmap("tab10")
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 4.2))
    for ax, (title, variant, layout) in zip(axes, panels):
        labels = row_labels(variant, layout)
        for row, label in enumerate(labels):
            is_gate = label >= GATE
            head = (label - GATE * is_gate) // 100
            ax.add_patch(plt.Rectangle((row, 0), 1, 1, facecolor=colours(head),
                                       alpha=0.35 if is_gate else 0.95,
                                       hatch="//" if is_gate else None, edgecolor="white"))
            if row == 0 or labels[row - 1] // 100 != label // 100:
                ax.text(row + 0.15, 0.5, f"{'g' if is_gate else 'q'}{head}", va="center",
                        fontsize=8)
        group = len(labels) // KV_HEADS if layout == "official" else 0
        if group:
            ax.axvline(group, color="black", linewidth=1.5)
        ax.set_xlim(0, len(labels))
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_xlabel("q_proj row (output feature)", fontsize=8)
    fig.suptitle(f"q_proj rows with {HEADS} query heads, {KV_HEADS} kv heads, head_dim "
                 f"{HEAD_DIM}: q = query rows (solid), g = gate rows (hatched), colour = head",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
