"""Draw docs/figures/sink_emergence_tb.png: the sink forming in the baseline and not in G1
while they train, read from the runs' TensorBoard event files (what a user sees in
TensorBoard under telemetry/f_attn/layer<i>), beside the level uniform attention gives.

    python docs/figures/sink_emergence_tb.py runs/tables/sinks_cpu \
        sink_tiny-h2-baseline sink_tiny-h2-g1_sdpa_elementwise --seeds 0,1,2

One colour per variant, one line style per layer, one line per seed. The event files are read
with tensorboardX's protobufs and the TFRecord framing (length, CRC, event, CRC), so neither
tensorflow nor tensorboard is needed.
"""

from __future__ import annotations

import pathlib
import struct
import sys
from collections.abc import Sequence

from absl import flags

from gated_attention.cli import flags as cli_flags

OUT = pathlib.Path(__file__).with_suffix(".png")
SEQ_LEN = 64  # sink_tiny's sequence length: the uniform level depends on it


def scalars(tb_dir: pathlib.Path, prefix: str = "telemetry/") -> dict[str, list[tuple]]:
    """tag -> [(step, value), ...] for every scalar whose tag starts with `prefix`."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple]] = {}
    for path in sorted(tb_dir.glob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                if value.tag.startswith(prefix) and value.HasField("simple_value"):
                    out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return {tag: sorted(points) for tag, points in out.items()}


def draw(root: pathlib.Path, prefixes: Sequence[str], seeds: Sequence[int],
         out: pathlib.Path) -> None:
    from gated_attention.analysis.plots import LAYER_STYLES, layer_legend, new_figure, save
    from gated_attention.analysis.sink_report import uniform_first_token
    from gated_attention.analysis.telemetry_report import SINK_FACTOR

    fig = new_figure((7, 4))
    ax = fig.subplots()
    most_layers = 0
    for colour, prefix in enumerate(prefixes):
        for seed in seeds:
            tags = scalars(root / f"{prefix}-s{seed}" / "tb")
            layers = sorted(t for t in tags if t.rsplit("/", 1)[-1].startswith("layer")
                            and t.startswith("telemetry/f_attn/") and "_head" not in t)
            most_layers = max(most_layers, len(layers))
            for layer, tag in enumerate(layers):
                steps, values = zip(*tags[tag])
                ax.plot(steps, values, color=f"C{colour}",
                        linestyle=LAYER_STYLES[layer % len(LAYER_STYLES)], marker="o",
                        markersize=2.5, linewidth=1.0, alpha=0.9,
                        label=f"{prefix.rsplit('-', 1)[-1]}, layer {layer}")
    uniform = uniform_first_token(SEQ_LEN)
    levels = [ax.axhline(uniform, color="grey", linewidth=0.8, label="uniform attention"),
              ax.axhline(SINK_FACTOR * uniform, color="grey", linestyle=":", linewidth=0.8,
                         label=f"{SINK_FACTOR:g}x uniform")]
    ax.set(xlabel="training step", ylabel="F-Attn (attention on the first token)",
           title="Sink forming during training (TensorBoard telemetry, "
                 + ("seeds " if len(seeds) > 1 else "seed ") + ", ".join(map(str, seeds)) + ")")
    layer_legend(ax, [p.rsplit("-", 1)[-1] for p in prefixes], most_layers, extra=levels)
    save(fig, out)


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The script's flags, on `flag_values` (importing the module defines none); a grid root
    and run names without the -s<seed> suffix are the positional arguments."""
    flags.DEFINE_string("seeds", "0", "Comma-separated seeds.", flag_values=flag_values)
    flags.DEFINE_string("out", str(OUT), "The figure's path.", flag_values=flag_values)
    return flag_values


def main(argv: Sequence[str] | None = None) -> int:
    args = cli_flags.Command("docs/figures/sink_emergence_tb.py", __doc__,
                             positional=("root", "prefixes...")).parse(
        define_flags(flags.FlagValues()), argv)
    draw(pathlib.Path(args.root), args.prefixes, [int(s) for s in args.seeds.split(",")],
         pathlib.Path(args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
