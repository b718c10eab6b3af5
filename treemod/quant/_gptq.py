"""GPTQ checkpoints (`quant_method: "gptq"`, 4 bits): `GPTQLinear` holds a layer's `qweight`,
`qzeros`, `scales` and `g_idx` exactly as the checkpoint stores them, and dequantises a slice of
output columns at a time.

The format (AutoGPTQ's and GPTQModel's `pack`, `checkpoint_format: "gptq"`): the weight
transposed, `(in, out)`, its 4-bit levels packed eight to an int32 along the input axis, level
`8i + j` of a column in bits `4j` of `qweight[i]`; the zero points `(groups, out)` minus one,
packed eight to an int32 along the output axis the same way (`qzeros`); `scales` `(groups, out)`
in float16; `g_idx[i]` the group of input `i` (`i // group_size` unless `desc_act` reordered
them). `W[o, i] = scales[g, o] * (q[i, o] - (zero[g, o] + 1))` with `g = g_idx[i]`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from treemod._saving.errors import CheckpointError

from ._layers import QuantLinear, layer_fields, row_slices

__all__ = ["GPTQLinear", "gptq_config", "gptq_layers", "gptq_skeleton_layer"]

_SHIFTS = np.arange(0, 32, 4, dtype=np.int32)


def _unpack(packed: Array, axis: int) -> Array:
    """The eight 4-bit levels of each int32 of `packed`, spread along `axis` (0 or 1)."""
    shifts = _SHIFTS.reshape((1,) * packed.ndim + (8,))
    levels = (packed[..., None] >> shifts) & 15  # (..., 8): level j from bits 4j
    if axis == 0:
        levels = jnp.moveaxis(levels, -1, 1)  # (rows, 8, cols)
    return levels.reshape(*packed.shape[:axis], -1, *packed.shape[axis + 1 :])


class GPTQLinear(QuantLinear):
    """A 4-bit GPTQ layer holding the checkpoint's arrays as stored (see the module docstring):
    `W[o, i] = scales[g_idx[i], o] * (q[i, o] - zero[g_idx[i], o] - 1)`.

    Built by `treemod.models.from_pretrained` from a GPTQ checkpoint; see `QuantLinear`.

    Arguments:
        qweight: int32 `(in / 8, out)`.
        qzeros: int32 `(groups, out / 8)`.
        scales: float16 `(groups, out)`.
        g_idx: int32 `(in,)`.
    """

    qweight: Array
    qzeros: Array
    scales: Array
    g_idx: Array

    def sliced(self) -> tuple[Array, ...]:
        """The packed columns, zero points and scales of each slice of output columns."""
        n = self.slices

        def columns(a: Array) -> Array:
            return jnp.moveaxis(a.reshape(a.shape[0], n, -1), 1, 0)

        return columns(self.qweight), columns(self.qzeros), columns(self.scales)

    def dequantise_slice(self, arrays: tuple[Array, ...]) -> Array:
        """`scale * (q - zero - 1)` by `g_idx`, in float32 (exact for float16 scales), cast
        to `dtype`; `(rows, in)`."""
        qweight, qzeros, scales = arrays
        q = _unpack(qweight, 0)  # (in, rows)
        zeros = _unpack(qzeros, 1)[self.g_idx]  # (in, rows)
        w = scales[self.g_idx].astype(jnp.float32) * (q - zeros - 1).astype(jnp.float32)
        return w.T.astype(self.dtype)


def gptq_config(qconfig: Mapping[str, Any], where: str) -> int:
    """The group size of a GPTQ `quantization_config` treemod reads (4 bits, format "gptq").

    Arguments:
        qconfig: `config.json`'s `quantization_config`.
        where: the file, for messages.

    Returns:
        The group size.

    Raises:
        CheckpointError: other bit widths, `checkpoint_format`s or a group size that is not
            a positive int; the message names the option.
    """
    bits = qconfig.get("bits")
    if bits != 4:
        raise CheckpointError(
            f"{where}: quantization_config.bits={bits!r} is not read; treemod reads 4-bit GPTQ."
        )
    form = qconfig.get("checkpoint_format", "gptq")
    if form != "gptq":
        raise CheckpointError(
            f"{where}: quantization_config.checkpoint_format={form!r} is not read; treemod "
            "reads GPTQ's 'gptq' packing (zero points stored minus one)."
        )
    group = qconfig.get("group_size")
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise CheckpointError(
            f"{where}: quantization_config.group_size={group!r}; treemod reads a positive "
            "group size (-1, one group per row, is not read)."
        )
    return group


def gptq_layers(tensors: Mapping[str, Any]) -> dict[str, int]:
    """The GPTQ layers of a checkpoint: name -> number of groups (from `scales`' shape)."""
    out = {}
    for name in tensors:
        if name.endswith(".qweight"):
            p = name[: -len(".qweight")]
            out[p] = int(tensors[f"{p}.scales"].shape[0])
    return out


def gptq_skeleton_layer(layer: Any, name: str, groups: int, where: str) -> GPTQLinear:
    """The `GPTQLinear` (zero arrays of the stored shapes) replacing the float `layer`.

    Arguments:
        layer: the model's `Linear` at `name`.
        name: its name.
        groups: the stored number of groups.
        where: the checkpoint directory, for messages.

    Returns:
        The layer.
    """
    common = layer_fields(layer)
    n_out, n_in = common["out_features"], common["in_features"]
    if n_in % 8 or n_out % 8:
        raise CheckpointError(
            f"{where}: {name} is {n_out}x{n_in}; GPTQ packs eight levels an int32 along both "
            "axes, so both must be multiples of 8."
        )
    return GPTQLinear(
        qweight=jnp.zeros((n_in // 8, n_out), jnp.int32),
        qzeros=jnp.zeros((groups, n_out // 8), jnp.int32),
        scales=jnp.zeros((groups, n_out), jnp.float16),
        g_idx=jnp.zeros((n_in,), jnp.int32),
        slices=row_slices(n_out, 8),
        **common,
    )
