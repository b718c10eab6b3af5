"""compressed-tensors checkpoints in the `pack-quantized` format (int4 and int8 weights):
`PackedLinear` holds a layer's `weight_packed`, `weight_scale`, `weight_zero_point` and
`weight_shape` as the checkpoint stores them.

The format (compressed-tensors' `PackedQuantizationCompressor` and `pack_to_int32`): the
signed `b`-bit levels plus `2^(b-1)`, packed `32 / b` to an int32 along the input axis, level
`k` of a word in bits `b * k`; asymmetric zero points packed the same way along the output axis;
`weight_scale` `(out, groups)` in the model's dtype; `weight_shape` the float weight's shape.
`W[o, i] = (q[o, i] - zero[o, g]) * scale[o, g]` with `g = i // group_size` (one group per row
for the `channel` strategy).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from treemod._module.module import field
from treemod._saving.errors import CheckpointError

from ._layers import QuantLinear, layer_fields, row_slices

__all__ = ["PackedLinear", "packed_config", "packed_layers", "packed_skeleton_layer"]


def _unpack(packed: Array, bits: int, axis: int) -> Array:
    """The signed levels of `packed`, spread along `axis` (0 or 1)."""
    per = 32 // bits
    shifts = (np.arange(per, dtype=np.int32) * bits).reshape((1,) * packed.ndim + (per,))
    levels = ((packed[..., None] >> shifts) & ((1 << bits) - 1)) - (1 << (bits - 1))
    if axis == 0:
        levels = jnp.moveaxis(levels, -1, 1)  # (rows, per, cols)
    return levels.reshape(*packed.shape[:axis], -1, *packed.shape[axis + 1 :])


class PackedLinear(QuantLinear):
    """A compressed-tensors `pack-quantized` layer holding the checkpoint's arrays as stored
    (see the module docstring): `W[o, i] = (q[o, i] - zero[o, g]) * scale[o, g]`.

    Built by `treemod.models.from_pretrained` from a compressed-tensors checkpoint; see
    `QuantLinear`.

    Arguments:
        weight_packed: int32 `(out, in * bits / 32)`.
        weight_scale: `(out, groups)`, in the checkpoint's float dtype.
        weight_zero_point: int32 `(out * bits / 32, groups)`, or `None` (symmetric).
        weight_shape: int32 `(2,)`, `(out, in)`.
        bits: 4 or 8.
        group_size: the input columns sharing a scale.
    """

    weight_packed: Array
    weight_scale: Array
    weight_zero_point: Array | None
    weight_shape: Array
    bits: int = field(static=True)
    group_size: int = field(static=True)

    def sliced(self) -> tuple[Array, ...]:
        """The packed rows, their scales (and zero points) in `slices` slices."""
        n = self.slices
        out = [a.reshape(n, -1, a.shape[-1]) for a in (self.weight_packed, self.weight_scale)]
        if self.weight_zero_point is not None:
            out.append(self.weight_zero_point.reshape(n, -1, self.weight_zero_point.shape[-1]))
        return tuple(out)

    def dequantise_slice(self, arrays: tuple[Array, ...]) -> Array:
        """`(q - zero) * scale` in float32 (exact for 16-bit scales), cast to `dtype`."""
        q = _unpack(arrays[0], self.bits, 1)
        groups = np.arange(self.in_features) // self.group_size
        centred = q if len(arrays) == 2 else q - _unpack(arrays[2], self.bits, 0)[:, groups]
        scale = arrays[1].astype(jnp.float32)[:, groups]
        return (centred.astype(jnp.float32) * scale).astype(self.dtype)


def packed_config(qconfig: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The weight options of a compressed-tensors `quantization_config` treemod reads.

    Arguments:
        qconfig: `config.json`'s `quantization_config`.
        where: the file, for messages.

    Returns:
        `{"bits", "symmetric", "group_size"}` (`group_size` `None` for `channel`).

    Raises:
        CheckpointError: a format other than `pack-quantized`, a status other than
            `compressed`, activation or KV-cache quantisation, act-order, float weights, bits
            other than 4 and 8, a strategy other than `group` / `channel`, or groups with
            different options; the message names the option.
    """

    def refuse(option: str, value: Any, read: str) -> CheckpointError:
        return CheckpointError(
            f"{where}: quantization_config.{option}={value!r} is not read; treemod reads "
            f"compressed-tensors {read}."
        )

    form = qconfig.get("format")
    if form != "pack-quantized":
        raise refuse("format", form, "'pack-quantized' checkpoints")
    status = qconfig.get("quantization_status")
    if status != "compressed":
        raise refuse("quantization_status", status, "'compressed' checkpoints")
    if qconfig.get("kv_cache_scheme") is not None:
        raise refuse("kv_cache_scheme", qconfig["kv_cache_scheme"], "weight-only checkpoints")
    groups = qconfig.get("config_groups") or {}
    found: list[dict[str, Any]] = []
    for key, group in groups.items():
        for side in ("input_activations", "output_activations"):
            if group.get(side) is not None:
                raise refuse(f"config_groups.{key}.{side}", group[side], "weight-only schemes")
        if group.get("format") not in (None, "pack-quantized"):
            raise refuse(f"config_groups.{key}.format", group["format"], "'pack-quantized'")
        w = group.get("weights") or {}
        path = f"config_groups.{key}.weights"
        if w.get("type") != "int":
            raise refuse(f"{path}.type", w.get("type"), "integer weights")
        if w.get("num_bits") not in (4, 8):
            raise refuse(f"{path}.num_bits", w.get("num_bits"), "4- and 8-bit weights")
        if w.get("strategy") not in ("group", "channel"):
            raise refuse(f"{path}.strategy", w.get("strategy"), "'group' and 'channel'")
        if w.get("actorder") is not None:
            raise refuse(f"{path}.actorder", w.get("actorder"), "weights without act-order")
        found.append(
            {
                "bits": int(w["num_bits"]),
                "symmetric": bool(w.get("symmetric", True)),
                "group_size": w.get("group_size") if w["strategy"] == "group" else None,
            }
        )
    if not found or any(f != found[0] for f in found):
        raise CheckpointError(
            f"{where}: quantization_config.config_groups holds {len(found)} weight schemes; "
            "treemod reads checkpoints whose groups share one."
        )
    return found[0]


def packed_layers(tensors: Mapping[str, Any]) -> dict[str, int]:
    """The packed layers of a checkpoint: name -> number of groups (`weight_scale`'s)."""
    out = {}
    for name in tensors:
        if name.endswith(".weight_packed"):
            p = name[: -len(".weight_packed")]
            out[p] = int(tensors[f"{p}.weight_scale"].shape[-1])
    return out


def packed_skeleton_layer(
    layer: Any, name: str, options: Mapping[str, Any], groups: int, scale_dtype: Any, where: str
) -> PackedLinear:
    """The `PackedLinear` (zero arrays of the stored shapes) replacing the float `layer`.

    Arguments:
        layer: the model's `Linear` at `name`.
        name: its name.
        options: `packed_config`'s.
        groups: the stored number of groups.
        scale_dtype: the stored scales' dtype.
        where: the checkpoint directory, for messages.

    Returns:
        The layer.
    """
    common = layer_fields(layer)
    n_out, n_in = common["out_features"], common["in_features"]
    bits = options["bits"]
    per = 32 // bits
    group = options["group_size"] or n_in
    if n_in % per or n_in % group or n_in // group != groups or n_out % per:
        raise CheckpointError(
            f"{where}: {name} is {n_out}x{n_in} with {groups} scale groups; treemod reads "
            f"packed layers whose sizes are multiples of {per} and of group_size={group}."
        )
    return PackedLinear(
        weight_packed=jnp.zeros((n_out, n_in // per), jnp.int32),
        weight_scale=jnp.zeros((n_out, groups), scale_dtype),
        weight_zero_point=(
            None if options["symmetric"] else jnp.zeros((n_out // per, groups), jnp.int32)
        ),
        weight_shape=jnp.zeros((2,), jnp.int32),
        bits=bits,
        group_size=group,
        slices=row_slices(n_out, per),
        **common,
    )
