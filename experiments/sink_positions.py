"""Where the sink task's largest activations and the G2 value gate sit, paired over seeds.

    python -m experiments.sink_positions --root runs/tables/sinks_cpu [--seeds 0,1,2,3,4]
        [--batches 8] [--batch_size 8] [--out runs/tables/sink_positions.json]

Two of the small-scale Table 4's disagreements with the paper are about *where* something
sits, so they are measured by position on the held-out sequences `gated_attention.analyze`
uses (the same batches, so whole-sequence values equal its M-Act):

- M-Act by position: the largest |hidden state| (a layer's output, `resid_after_ffn`) at the
  first token (BOS), at the copy positions (trigger queries, whose next token is a copy), at
  a trigger right after BOS (nothing to copy) and at the other positions, each averaged over
  layers as M-Act is; baseline against G1
  elementwise, paired by seed. The paper's M-Act falls with G1 because its baseline's peak is
  on the sink token; here G1 raises the whole-sequence M-Act, and the split says whether it
  rises at BOS or at the copy positions.
- The G2 value gate at the first-token key: the mean gate score where position 0's value is
  gated against the mean at every other key position, per layer, over seeds. A gate that
  shut BOS's value would make the sink a no-op; one that keeps it open does not.

Every seed's numbers come from that run's last checkpoint; the paired differences go through
experiments.paired_stats (95% t interval, p, and the exact sign-flip p).
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from absl import flags

from experiments import paired_stats
from gated_attention.cli import flags as cli_flags

KINDS = ("bos", "copy", "first_trigger", "other")
RUN_NAME = "sink_tiny-h2-{variant}-s{seed}"
M_ACT_PAIR = ("baseline", "g1_sdpa_elementwise")
G2 = "g2_value_elementwise"


def position_kinds(copy: np.ndarray, trigger: np.ndarray) -> dict[str, np.ndarray]:
    """[b, s] masks of the position kinds, which partition the positions: BOS (position 0),
    copy positions (bigram_backcopy.copy_positions: a trigger after a real token), a trigger
    at position 1 (right after BOS: nothing to copy, the chain applies; the one-seed look
    below found the gated models' peak there) and every other position."""
    copy, trigger = np.asarray(copy, bool), np.asarray(trigger, bool)
    bos = np.zeros_like(copy)
    bos[:, 0] = True
    first = np.zeros_like(copy)
    first[:, 1:2] = trigger[:, 1:2]
    copy = copy & ~bos & ~first
    return {"bos": bos, "copy": copy, "first_trigger": first, "other": ~(bos | copy | first)}


def max_abs_by_kind(resid: np.ndarray, kinds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """[L, b, s, D] hidden states -> per kind, [L] the largest |value| at its positions
    (over rows, positions and dimensions); NaN for a kind with no position in the batch."""
    resid = np.abs(np.asarray(resid, np.float64))
    peak_per_position = resid.max(axis=-1)  # [L, b, s]
    out = {}
    for kind, mask in kinds.items():
        if not mask.any():
            out[kind] = np.full(resid.shape[0], np.nan)
            continue
        out[kind] = np.where(mask[None], peak_per_position, -np.inf).max(axis=(1, 2))
    return out


def gate_sums_by_key(gates: np.ndarray) -> dict[str, tuple[np.ndarray, int]]:
    """[L, b, s, ...] gate scores -> per key kind ("first": position 0, "rest": the others),
    ([L] sum of the per-position mean score, number of positions): sums, so batches pool."""
    gates = np.asarray(gates, np.float64)
    per_position = gates.reshape(*gates.shape[:3], -1).mean(axis=-1)  # [L, b, s]
    return {"first": (per_position[:, :, 0].sum(axis=1), per_position.shape[1]),
            "rest": (per_position[:, :, 1:].sum(axis=(1, 2)),
                     per_position.shape[1] * (per_position.shape[2] - 1))}


def measure_batches(forward: Any, batches: Iterable[Mapping[str, Any]], kinds_of: Any
                    ) -> dict[str, Any]:
    """Per-kind M-Act (mean over layers of the per-layer maxima, pooled over the batches)
    and, where the model has gate scores, the mean gate at the first key and the others.

    forward(batch) -> (resid [L, b, s, D], gates [L, b, s, ...] or None); kinds_of(inputs)
    -> position_kinds' masks. Kept apart from the model so that a test can feed it arrays."""
    peaks: dict[str, np.ndarray] | None = None
    sums: dict[str, list[Any]] = {}
    counts: dict[str, int] = {}
    for batch in batches:
        resid, gates = forward(batch)
        kinds = kinds_of(np.asarray(batch["inputs"]))
        new = max_abs_by_kind(resid, kinds)
        peaks = new if peaks is None else {k: np.fmax(peaks[k], new[k]) for k in new}
        for kind, mask in kinds.items():
            counts[kind] = counts.get(kind, 0) + int(mask.sum())
        if gates is not None:
            for key, (total, count) in gate_sums_by_key(gates).items():
                acc = sums.setdefault(key, [0.0, 0])
                acc[0] = acc[0] + total
                acc[1] += count
    if peaks is None:
        raise ValueError("measure_batches got no batches")
    out: dict[str, Any] = {f"m_act_{k}": None if np.isnan(v).any() else float(np.mean(v))
                           for k, v in peaks.items()}
    out.update({f"m_act_{k}_per_layer": v.tolist() for k, v in peaks.items()})
    out.update({f"positions_{k}": n for k, n in counts.items()})
    for key, (total, count) in sums.items():
        per_layer = np.asarray(total) / count
        out[f"gate_{key}_key_per_layer"] = per_layer.tolist()
        out[f"gate_{key}_key"] = float(per_layer.mean())
    return out


def measure_run(workdir: pathlib.Path, batches: int = 8, batch_size: int = 8) -> dict[str, Any]:
    """measure_batches on a run's last checkpoint and the held-out batches `analyze` uses."""
    import jax.numpy as jnp
    from flax import nnx

    from gated_attention.analysis import run_analysis
    from gated_attention.data.synthetic import bigram_backcopy
    from gated_attention.model import capture
    from gated_attention.training import loop

    model, config = loop.load_params(workdir)
    held_out, chain, _ = run_analysis.analysis_batches(config, workdir, batch_size, batches)
    names = frozenset({"resid_after_ffn", "gate_scores"})

    @nnx.jit
    def run(model: Any, inputs: Any, positions: Any, segment_ids: Any) -> Any:
        model(inputs, positions=positions, segment_ids=segment_ids, capture=names)
        return capture.collect(model)

    def forward(batch: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
        layers = run(model, jnp.asarray(batch["inputs"], jnp.int32),
                     jnp.asarray(batch["positions"]), jnp.asarray(batch["segment_ids"]))
        resid = np.stack([np.asarray(layer["resid_after_ffn"]) for layer in layers])
        gates = (np.stack([np.asarray(layer["gate_scores"]) for layer in layers])
                 if "gate_scores" in layers[0] else None)
        return resid, gates

    return measure_batches(forward, held_out, lambda inputs: position_kinds(
        bigram_backcopy.copy_positions(chain, inputs), chain.is_trigger[inputs]))


def paired_entry(diffs: Sequence[float | None]) -> dict[str, Any]:
    """paired_stats.paired as JSON: mean, 95% t interval, p, sign-flip p, n and failures."""
    p = paired_stats.paired(diffs)
    return {"n": p.n, "failed": p.failed, "mean": p.mean, "low": p.low, "high": p.high,
            "p": p.p, "p_sign_flip": p.p_sign_flip, "degenerate": p.degenerate,
            "diffs": [None if d is None else float(d) for d in diffs]}


def compare(per_run: Mapping[str, Mapping[int, Mapping[str, Any] | None]],
            seeds: Sequence[int]) -> dict[str, Any]:
    """The two experiments from per-run measurements (variant -> seed -> measure_run's dict,
    None for a missing run, which counts as a failure of its pair)."""
    def value(variant: str, seed: int, key: str) -> float | None:
        run = per_run.get(variant, {}).get(seed)
        return None if run is None or run.get(key) is None else float(run[key])

    out: dict[str, Any] = {"seeds": list(seeds), "m_act": {}, "g2_gate": {}}
    base, gated = M_ACT_PAIR
    for kind in KINDS:
        key = f"m_act_{kind}"
        pairs = [(value(base, s, key), value(gated, s, key)) for s in seeds]
        out["m_act"][kind] = {
            base: [a for a, _ in pairs], gated: [b for _, b in pairs],
            "difference": paired_entry([None if a is None or b is None else b - a
                                        for a, b in pairs])}
    first = [value(G2, s, "gate_first_key") for s in seeds]
    rest = [value(G2, s, "gate_rest_key") for s in seeds]
    out["g2_gate"] = {"first_key": first, "rest_keys": rest, "difference": paired_entry(
        [None if a is None or b is None else a - b for a, b in zip(first, rest, strict=True)])}
    layers = [per_run.get(G2, {}).get(s) for s in seeds]
    out["g2_gate"]["per_layer"] = [
        None if r is None else {"first": r["gate_first_key_per_layer"],
                                "rest": r["gate_rest_key_per_layer"]} for r in layers]
    return out


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def difference_text(entry: Mapping[str, Any], digits: int = 3) -> str:
    """mean [95% CI], p (or the degenerate / one-seed forms), and failures, as in the tables."""
    if entry["mean"] is None:
        return f"- ({entry['failed']} failed)"
    text = f"{entry['mean']:+.{digits}f}"
    if entry["degenerate"]:
        text += f" (all {entry['n']} equal), sign-flip p {entry['p_sign_flip']:.2g}"
    elif entry["low"] is None:
        text += " (one seed)"
    else:
        text += (f" [{entry['low']:+.{digits}f}, {entry['high']:+.{digits}f}], p "
                 f"{entry['p']:.2g}, sign-flip p {entry['p_sign_flip']:.2g}")
    if entry["failed"]:
        text += f", {entry['failed']} of {entry['n'] + entry['failed']} missing"
    return text


def markdown(result: Mapping[str, Any]) -> str:
    """The two experiments as markdown tables: per seed, then the paired difference."""
    seeds = result["seeds"]
    base, gated = M_ACT_PAIR
    head = "| position | " + " | ".join(f"seed {s}: baseline / G1" for s in seeds)
    lines = [head + " | G1 minus baseline [95% CI] |",
             "|---|" + "---|" * (len(seeds) + 1)]
    names = {"bos": "first token (BOS)", "copy": "copy positions",
             "first_trigger": "trigger at position 1", "other": "other positions"}
    for kind in KINDS:
        entry = result["m_act"][kind]
        cells = [f"{_num(a, 2)} / {_num(b, 2)}" for a, b in zip(entry[base], entry[gated],
                                                               strict=True)]
        lines.append(f"| {names[kind]} | " + " | ".join(cells)
                     + f" | {difference_text(entry['difference'], 2)} |")
    gate = result["g2_gate"]
    lines += ["", "| G2 value gate | " + " | ".join(f"seed {s}" for s in seeds)
              + " | first minus other keys [95% CI] |", "|---|" + "---|" * (len(seeds) + 1)]
    lines.append("| at the first-token key | " + " | ".join(_num(v, 4) for v in gate["first_key"])
                 + f" | {difference_text(gate['difference'], 4)} |")
    lines.append("| at every other key | " + " | ".join(_num(v, 4) for v in gate["rest_keys"])
                 + " | |")
    return "\n".join(lines)


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    flags.DEFINE_string("root", "runs/tables/sinks_cpu", "The sinks grid's root (make tables).",
                        flag_values=flag_values)
    flags.DEFINE_string("seeds", "0,1,2,3,4", "Comma-separated seeds.", flag_values=flag_values)
    flags.DEFINE_integer("batches", 8, "Held-out batches (as analyze).", flag_values=flag_values)
    flags.DEFINE_integer("batch_size", 8, "Rows per batch (as analyze).",
                         flag_values=flag_values)
    flags.DEFINE_string("out", "", "Where the JSON goes (default: <root>/sink_positions.json).",
                        flag_values=flag_values)
    return flag_values


def main(argv: Sequence[str] | None = None) -> int:
    cli = cli_flags.Command("experiments.sink_positions", __doc__)
    args = cli.parse(define_flags(flags.FlagValues()), argv)
    root = pathlib.Path(args.root)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    per_run: dict[str, dict[int, dict[str, Any] | None]] = {}
    for variant in (*M_ACT_PAIR, G2):
        for seed in seeds:
            workdir = root / RUN_NAME.format(variant=variant, seed=seed)
            run = (measure_run(workdir, args.batches, args.batch_size)
                   if (workdir / "record.json").exists() else None)
            per_run.setdefault(variant, {})[seed] = run
            print(f"{workdir.name}: {'missing' if run is None else 'measured'}", flush=True)
    result = {"per_run": {v: {str(s): r for s, r in runs.items()} for v, runs in per_run.items()},
              **compare(per_run, seeds)}
    out = pathlib.Path(args.out) if args.out else root / "sink_positions.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    sys.exit(main())
