"""Per-device memory of a training run on a mesh, before launching it.

Parameters, gradients and AdamW moments are exact: float32 weights split by the logical
rules (`sharding.fit_spec` on each parameter's shape). Activations are an estimate, in bytes
per token and layer, with p = bytes of the compute dtype, D = d_model, Hd = query heads x
head_dim, Kd = kv heads x head_dim, G = gate width (0 ungated), F = mlp_dim (or
experts_per_token x expert_mlp_dim), each divided by the tensor-parallel size when it splits:

    everything (remat="none"):   p (5 D + 6 Hd + 6 Kd + 2 G + 3 F) + 4 H      (4 H: f32 LSE)
    dots_with_no_batch_dims:     p (3 D + Hd + 2 Kd + G + 2 F)    (projection outputs kept)
    full / nothing_saveable:     p D                               (block input only)

times L layers, plus one layer's "everything" while it is recomputed (remat only), plus the
loss's float32 logits and their gradient (`loss_bytes`): 8 V bytes per token for the plain
loss, 8 x chunk per token for vocabulary tiles (train.loss_tiles=vocab), 8 V x chunk per
batch row for token tiles. attention_impl="xla" also keeps the
float32 S x S probabilities (4 H S per token and layer); flash kernels ("auto" on TPU/GPU) do
not. Tokens per device = (batch_size / grad_accum / batch shards) x seq_len.

The activation estimate is only a guide: checked against the XLA TPU compiler it is off by
20% (fsdp + full remat) to 3x (data parallel, no remat: XLA fuses most of what it counts).
With an accelerator (`inspect --mesh ... --accelerator=v5p-64`, libtpu installed) the train
step is compiled for that slice and the compiler's own per-device total replaces it
(`compiled_train_step`); parameters and optimizer state stay exact either way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from jax.sharding import PartitionSpec

from gated_attention.model.accounting import gate_width, param_leaves
from gated_attention.model.model_config import ModelConfig
from gated_attention.parallel import sharding

GiB = 1024**3
# Memory per chip (HBM) of the accelerators people train these models on.
ACCELERATORS = {"TPU v5e": 16 * GiB, "TPU v4": 32 * GiB, "TPU v6e": 32 * GiB,
                "H100": 80 * 10**9, "TPU v5p": 95 * GiB, "H200": 141 * 10**9}
PARAM_BYTES = 4  # weights, gradients and moments are float32


def parse_mesh_flag(text: str) -> dict[str, int]:
    """`data=1,fsdp=8,tensor=1` -> {"data": 1, "fsdp": 8, "tensor": 1}."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in sharding.MESH_AXES + sharding.DCN_KEYS:
            raise ValueError(f"--mesh part {part!r} must look like axis=size with axis one of "
                             f"{', '.join(sharding.MESH_AXES + sharding.DCN_KEYS)}")
        try:
            out[key.strip()] = int(value)
        except ValueError:
            raise ValueError(f"--mesh {key.strip()}={value!r} must be an integer") from None
    return out


def _split(dim: int, axes: Any, axis_sizes: Mapping[str, int]) -> int:
    """How many ways a dimension of size `dim` is split by a logical rule's axes."""
    spec = sharding.fit_spec(PartitionSpec(axes), (dim,), axis_sizes)
    return sharding.shard_factor(spec, axis_sizes)


def parameter_bytes(cfg: ModelConfig, axis_sizes: Mapping[str, int],
                    rules: sharding.Rules = sharding.LOGICAL_RULES) -> int:
    """float32 parameter bytes held by one device (the largest shard of each weight)."""
    total = 0
    for _, shape, names in param_leaves(cfg):
        spec = sharding.fit_spec(sharding.logical_to_spec(names, rules), shape, axis_sizes)
        total += math.prod(shape) // sharding.shard_factor(spec, axis_sizes) * PARAM_BYTES
    return total


def activation_bytes_per_token(cfg: ModelConfig, axis_sizes: Mapping[str, int], seq_len: int,
                               rules: sharding.Rules = sharding.LOGICAL_RULES) -> float:
    """Estimated activation bytes per token on one device (see the module docstring)."""
    table = dict(rules)
    p = {"float32": 4, "bfloat16": 2, "float16": 2}[cfg.dtype]
    heads, kv_heads = cfg.heads
    t_h = _split(heads, table.get("heads"), axis_sizes)
    t_kv = _split(kv_heads, table.get("kv_heads"), axis_sizes)
    ffn = cfg.experts[1] * cfg.expert_mlp_dim if cfg.is_moe else cfg.mlp_dim
    t_f = _split(ffn, table.get("mlp"), axis_sizes)
    D, hd, kd = cfg.d_model, heads * cfg.head_dim / t_h, kv_heads * cfg.head_dim / t_kv
    G, F = gate_width(cfg) / t_h, ffn / t_f
    everything = p * (5 * D + 6 * hd + 6 * kd + 2 * G + 3 * F) + 4 * heads / t_h
    if cfg.attention_impl == "xla":
        everything += 4 * heads / t_h * seq_len
    saved = {"none": everything,
             "dots_with_no_batch_dims_saveable": p * (3 * D + hd + 2 * kd + G + 2 * F),
             "full": p * D, "nothing_saveable": p * D}[cfg.remat]
    recompute = 0.0 if cfg.remat == "none" else everything
    return cfg.num_layers * saved + recompute


def loss_bytes(cfg: ModelConfig, axis_sizes: Mapping[str, int], rows: int, seq_len: int,
               loss_tiles: str = "vocab", loss_chunk: int = 0,
               rules: sharding.Rules = sharding.LOGICAL_RULES) -> int:
    """The loss's live float32 logits and their gradient on one device, for `rows` sequences
    of `seq_len` per device: whole ([rows, seq, V / vocab shards]) for the plain loss
    (loss_chunk 0), one [rows, seq, chunk] vocabulary tile, or one [rows, chunk, V / vocab
    shards] token tile (losses.chunked_cross_entropy / token_tiled_cross_entropy)."""
    vocab = cfg.vocab_size / _split(cfg.vocab_size, dict(rules).get("vocab"), axis_sizes)
    if not loss_chunk:
        return round(8 * rows * seq_len * vocab)
    if loss_tiles == "tokens":
        return round(8 * rows * min(loss_chunk, seq_len) * vocab)
    return 8 * rows * seq_len * min(loss_chunk, cfg.vocab_size)


def per_device(cfg: ModelConfig, axis_sizes: Mapping[str, int], *, batch_size: int,
               grad_accum: int, seq_len: int, loss_tiles: str = "vocab", loss_chunk: int = 0,
               rules: sharding.Rules = sharding.LOGICAL_RULES) -> dict[str, Any]:
    """Bytes per device: parameters, gradients, AdamW moments, activations (the loss's logits
    among them, and what the plain loss would hold instead), and the total."""
    micro = batch_size // grad_accum
    batch_shards = _split(micro, dict(rules).get("batch"), axis_sizes)
    rows = micro // batch_shards
    tokens = rows * seq_len
    params = parameter_bytes(cfg, axis_sizes, rules)
    loss = loss_bytes(cfg, axis_sizes, rows, seq_len, loss_tiles, loss_chunk, rules)
    activations = round(tokens * activation_bytes_per_token(cfg, axis_sizes, seq_len, rules)) \
        + loss
    out = {"params": params, "grads": params, "optimizer_state": 2 * params,
           "activations": activations, "loss_logits": loss,
           "loss_logits_plain": loss_bytes(cfg, axis_sizes, rows, seq_len, rules=rules),
           "tokens_per_device": tokens, "remat": cfg.remat, "batch_size": batch_size,
           "grad_accum": grad_accum}
    out["total"] = 4 * params + activations
    out["fits_on"] = [name for name, hbm in ACCELERATORS.items() if out["total"] <= 0.9 * hbm]
    return out


def fit_levers(mesh: Mapping[str, int], batch_size: int, grad_accum: int, remat: str, *,
               more_devices: str, mesh_flags: str = "config") -> str:
    """One line naming the overrides that shrink a step's memory per device, from what the
    run sets now: weights sharded over every device, fewer sequences per micro-batch, full
    remat, more devices. mesh_flags: "config" (--config.mesh.*) or "inspect" (--mesh=)."""
    levers = []
    data, fsdp = mesh.get("data", 1), mesh.get("fsdp", 1)
    if data > 1:
        wide = (f"--config.mesh.data=1 --config.mesh.fsdp={data * fsdp}" if mesh_flags ==
                "config" else f"--mesh=data=1,fsdp={data * fsdp}")
        levers.append(f"weights sharded over the data-parallel devices too ({wide})")
    micro = batch_size // grad_accum
    if micro > 1 and batch_size % (2 * grad_accum) == 0:
        levers.append(f"fewer sequences per micro-batch (--config.train.grad_accum="
                      f"{2 * grad_accum} or more; {micro} now)")
    if remat != "full":
        levers.append(f"--config.model.remat=full (each block recomputed in the backward; "
                      f"{remat} now)")
    levers.append(more_devices)
    return "to fit: " + "; ".join(levers)


def notes(info: Mapping[str, Any]) -> list[str]:
    """Lines after the memory table: what would make a run that fits on none listed fit."""
    if info["fits_on"]:
        return []
    return [fit_levers(info["mesh"], info["batch_size"], info["grad_accum"], info["remat"],
                       mesh_flags="inspect",
                       more_devices="more devices (--mesh=data=1,fsdp=N, or --num_devices)")]


def compiled_train_step(config: Any, accelerator: str) -> dict[str, Any]:
    """The XLA TPU compiler's per-device memory for the run's train step on `accelerator`
    (a gcloud name such as v5p-64), compiled deviceless on this machine (needs libtpu)."""
    from gated_attention.compile import target as target_compile
    from gated_attention.compile.tpu_topologies import parse_accelerator

    tpu = parse_accelerator(accelerator)
    mesh = target_compile.tpu_mesh(tpu.topology, config.mesh)
    step = target_compile.compile_step(config, mesh, "train")
    hbm = tpu.hbm_bytes * tpu.chips // mesh.devices.size
    return {"accelerator": tpu.accelerator, "devices": mesh.devices.size,
            "hbm_per_device": hbm, **step.memory,
            "fits": step.memory["total"] <= hbm}


def report(config: Any, mesh_flag: str = "", num_devices: int | None = None,
           accelerator: str = "") -> dict[str, Any]:
    """The memory section of `python -m gated_attention.inspect` for config.mesh (or --mesh);
    with `accelerator`, the compiler's figure for that TPU slice too."""
    import copy

    import jax

    from gated_attention.config.run_config import model_config

    mesh_config = {k: v for k, v in dict(config.mesh).items() if k != "rules"}
    flag = parse_mesh_flag(mesh_flag)
    if flag:
        mesh_config = {axis: 1 for axis in sharding.MESH_AXES} | flag
    compiled = None
    if accelerator:
        config = copy.deepcopy(config)
        for axis, size in mesh_config.items():
            config.mesh[axis] = size
        compiled = compiled_train_step(config, accelerator)
        num_devices = compiled["devices"]
    if num_devices is None:
        num_devices = (math.prod(v for v in flag.values()) if flag and -1 not in flag.values()
                       else jax.device_count())
    axis_sizes = sharding.full_mesh_shape(mesh_config, num_devices)
    rules = sharding.rules_from_config(config.mesh)
    info = per_device(model_config(config), axis_sizes, batch_size=config.train.batch_size,
                      grad_accum=config.train.get("grad_accum", 1),
                      seq_len=config.data.seq_len,
                      loss_tiles=config.train.get("loss_tiles", "vocab"),
                      loss_chunk=config.train.get("loss_chunk_size", 0), rules=rules)
    if compiled is not None:
        info["compiled_train_step"] = compiled
    return {"mesh": axis_sizes, **info}


def _human(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / 2**20:.1f} MiB"


def format_rows(info: Mapping[str, Any]) -> list[tuple[str, str]]:
    mesh = ",".join(f"{k}={v}" for k, v in info["mesh"].items())
    rows = [(f"per-device memory (mesh {mesh})", "")]
    for key in ("params", "grads", "optimizer_state", "activations", "total"):
        rows.append((f"  {key}", _human(info[key])))
    rows.append((f"  activations: remat={info['remat']}, tokens/device",
                 f"{info['tokens_per_device']:,}"))
    if "loss_logits" in info:
        saved = info["loss_logits_plain"] - info["loss_logits"]
        rows.append(("  of which the loss's float32 logits and gradient", _human(
            info["loss_logits"]) + (f" (the plain loss: {_human(info['loss_logits_plain'])}, "
                                    f"{_human(saved)} more)" if saved else "")))
    rows.append(("  fits on (90% of HBM)", ", ".join(info["fits_on"]) or "none listed"))

    compiled = info.get("compiled_train_step")
    if compiled:
        rows.append((f"compiled train step on {compiled['accelerator']} (XLA TPU compiler)", ""))
        for key in ("arguments", "temporaries", "total", "hbm_per_device"):
            rows.append((f"  {key}", _human(compiled[key])))
        rows.append(("  fits", "yes" if compiled["fits"] else "NO"))
    return rows
