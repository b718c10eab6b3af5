"""AWQ checkpoints (`quant_method: "awq"`, `version: "gemm"`, 4 bits): `AWQLinear` holds a
layer's `qweight`, `qzeros` and `scales` exactly as the checkpoint stores them.

The format (AutoAWQ's `WQLinear_GEMM.from_linear` and `dequantize_gemm`): the weight transposed,
`(in, out)`, its 4-bit levels packed eight to an int32 along the output axis in the order
`[0, 2, 4, 6, 1, 3, 5, 7]` (bits `4i` of word `c` hold column `8c + order[i]`); the zero points
`(groups, out)` packed the same way (`qzeros`); `scales` `(groups, out)` in float16; the groups
are consecutive runs of `group_size` inputs. `W[o, i] = (q[i, o] - zero[g, o]) * scales[g, o]`
with `g = i // group_size`.
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

__all__ = ["AWQLinear", "awq_config", "awq_layers", "awq_skeleton_layer"]

# Column `j` of a block of eight is in nibble `REVERSE[j]` (the inverse of AWQ's order).
REVERSE = np.array([0, 4, 1, 5, 2, 6, 3, 7])
_SHIFTS = np.arange(0, 32, 4, dtype=np.int32)


def _unpack(packed: Array) -> Array:
    """`(rows, cols)` int32 -> `(rows, 8 * cols)` levels in column order."""
    levels = (packed[..., None] >> _SHIFTS.reshape(1, 1, 8)) & 15
    return levels[..., REVERSE].reshape(packed.shape[0], -1)


class AWQLinear(QuantLinear):
    """A 4-bit AWQ (GEMM) layer holding the checkpoint's arrays as stored (see the module
    docstring): `W[o, i] = (q[i, o] - zero[g, o]) * scales[g, o]`, `g = i // group_size`.

    Built by `treemod.models.from_pretrained` from an AWQ checkpoint; see `QuantLinear`.

    Arguments:
        qweight: int32 `(in, out / 8)`.
        qzeros: int32 `(groups, out / 8)`.
        scales: float16 `(groups, out)`.
        group_size: the consecutive inputs sharing a scale and zero point.
    """

    qweight: Array
    qzeros: Array
    scales: Array
    group_size: int = field(static=True)

    def sliced(self) -> tuple[Array, ...]:
        """The packed columns, zero points and scales of each slice of output columns."""
        n = self.slices
        return tuple(
            jnp.moveaxis(a.reshape(a.shape[0], n, -1), 1, 0)
            for a in (self.qweight, self.qzeros, self.scales)
        )

    def dequantise_slice(self, arrays: tuple[Array, ...]) -> Array:
        """`(q - zero) * scale` in float32 (exact for float16 scales), cast to `dtype`;
        `(rows, in)`."""
        qweight, qzeros, scales = arrays
        groups = np.arange(self.in_features) // self.group_size
        centred = _unpack(qweight) - _unpack(qzeros)[groups]  # (in, rows)
        w = centred.astype(jnp.float32) * scales.astype(jnp.float32)[groups]
        return w.T.astype(self.dtype)


def awq_config(qconfig: Mapping[str, Any], where: str) -> int:
    """The group size of an AWQ `quantization_config` treemod reads (4 bits, GEMM, zero point).

    Arguments:
        qconfig: `config.json`'s `quantization_config`.
        where: the file, for messages.

    Returns:
        The group size.

    Raises:
        CheckpointError: other bits, versions (`gemv`, `exllama`, ...), no zero point or a
            group size that is not a positive int; the message names the option.
    """
    checks = [
        ("bits", qconfig.get("bits", qconfig.get("w_bit")), (4,), "4-bit AWQ"),
        ("version", str(qconfig.get("version", "gemm")).lower(), ("gemm",), "the 'gemm' packing"),
        ("zero_point", qconfig.get("zero_point", True), (True,), "AWQ with zero points"),
    ]
    for option, value, allowed, read in checks:
        if value not in allowed:
            raise CheckpointError(
                f"{where}: quantization_config.{option}={value!r} is not read; treemod reads "
                f"{read}."
            )
    group = qconfig.get("group_size", qconfig.get("q_group_size"))
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise CheckpointError(
            f"{where}: quantization_config.group_size={group!r}; treemod reads a positive "
            "group size."
        )
    return group


def awq_layers(tensors: Mapping[str, Any]) -> list[str]:
    """The AWQ layers of a checkpoint (those with a `qweight`; `g_idx` marks GPTQ's)."""
    return [n[: -len(".qweight")] for n in tensors if n.endswith(".qweight")]


def awq_skeleton_layer(layer: Any, name: str, group: int, where: str) -> AWQLinear:
    """The `AWQLinear` (zero arrays of the stored shapes) replacing the float `layer`.

    Arguments:
        layer: the model's `Linear` at `name`.
        name: its name.
        group: the group size.
        where: the checkpoint directory, for messages.

    Returns:
        The layer.
    """
    common = layer_fields(layer)
    n_out, n_in = common["out_features"], common["in_features"]
    if n_out % 8 or n_in % group:
        raise CheckpointError(
            f"{where}: {name} is {n_out}x{n_in}; AWQ packs eight output columns an int32 and "
            f"groups of group_size={group} inputs, so they must divide the sizes."
        )
    return AWQLinear(
        qweight=jnp.zeros((n_in, n_out // 8), jnp.int32),
        qzeros=jnp.zeros((n_in // group, n_out // 8), jnp.int32),
        scales=jnp.zeros((n_in // group, n_out), jnp.float16),
        group_size=group,
        slices=row_slices(n_out, 8),
        **common,
    )
