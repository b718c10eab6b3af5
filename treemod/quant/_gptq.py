"""GPTQ checkpoints (`quant_method: "gptq"`, 4 bits): `GPTQLinear` holds a layer's `qweight`,
`qzeros`, `scales` and `g_idx` exactly as the checkpoint stores them, and dequantises a slice of
output columns at a time; `gptq_from_int4` writes treemod's `Int4Linear` layers in the format.

The format (AutoGPTQ's and GPTQModel's `pack`): the weight transposed, `(in, out)`, its 4-bit
levels packed eight to an int32 along the input axis, level `8i + j` of a column in bits `4j` of
`qweight[i]`; the zero points `(groups, out)` packed eight to an int32 along the output axis the
same way (`qzeros`), minus one in `checkpoint_format: "gptq"` (v1) and as they are in
`"gptq_v2"`; `scales` `(groups, out)` in float16; `g_idx[i]` the group of input `i`
(`i // group_size` unless `desc_act` reordered them). `W[o, i] = scales[g, o] * (q[i, o] -
zero[g, o])` with `g = g_idx[i]`, where `zero` is the stored value plus one in v1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from treemod._module.module import field
from treemod._saving.errors import CheckpointError

from ._layers import Int4Linear, QuantLinear, layer_fields, row_slices

__all__ = ["GPTQLinear", "gptq_config", "gptq_from_int4", "gptq_layers", "gptq_skeleton_layer"]

# `checkpoint_format` -> what is added to a stored zero point to get the zero point.
FORMATS = {"gptq": 1, "gptq_v2": 0}

_SHIFTS = np.arange(0, 32, 4, dtype=np.int32)


def _unpack(packed: Array, axis: int) -> Array:
    """The eight 4-bit levels of each int32 of `packed`, spread along `axis` (0 or 1)."""
    shifts = _SHIFTS.reshape((1,) * packed.ndim + (8,))
    levels = (packed[..., None] >> shifts) & 15  # (..., 8): level j from bits 4j
    if axis == 0:
        levels = jnp.moveaxis(levels, -1, 1)  # (rows, 8, cols)
    return levels.reshape(*packed.shape[:axis], -1, *packed.shape[axis + 1 :])


def _pack(levels: np.ndarray, axis: int) -> np.ndarray:
    """`_unpack`'s inverse: 4-bit `levels` packed eight to an int32 along `axis` (0 or 1, its
    size a multiple of 8), level `8i + j` in bits `4j` of word `i`."""
    moved = np.moveaxis(np.asarray(levels).astype(np.uint32), axis, 0)
    words = moved.reshape(-1, 8, *moved.shape[1:])
    packed = np.zeros_like(words[:, 0])
    for j in range(8):
        packed |= words[:, j] << np.uint32(4 * j)
    return np.ascontiguousarray(np.moveaxis(packed, 0, axis)).view(np.int32)


class GPTQLinear(QuantLinear):
    """A 4-bit GPTQ layer holding the checkpoint's arrays as stored (see the module docstring):
    `W[o, i] = scales[g_idx[i], o] * (q[i, o] - stored_zero[g_idx[i], o] - zero_offset)`.

    Built by `treemod.models.from_pretrained` from a GPTQ checkpoint; see `QuantLinear`.

    Arguments:
        qweight: int32 `(in / 8, out)`.
        qzeros: int32 `(groups, out / 8)`.
        scales: float16 `(groups, out)`.
        g_idx: int32 `(in,)`.
        zero_offset: 1 for `checkpoint_format: "gptq"` (zero points stored minus one), 0 for
            `"gptq_v2"`.
    """

    qweight: Array
    qzeros: Array
    scales: Array
    g_idx: Array
    zero_offset: int = field(static=True, default=1)

    def sliced(self) -> tuple[Array, ...]:
        """The packed columns, zero points and scales of each slice of output columns."""
        n = self.slices

        def columns(a: Array) -> Array:
            return jnp.moveaxis(a.reshape(a.shape[0], n, -1), 1, 0)

        return columns(self.qweight), columns(self.qzeros), columns(self.scales)

    def dequantise_slice(self, arrays: tuple[Array, ...]) -> Array:
        """`scale * (q - stored_zero - zero_offset)` by `g_idx`, in float32 (exact for float16
        scales), cast to `dtype`; `(rows, in)`."""
        qweight, qzeros, scales = arrays
        q = _unpack(qweight, 0)  # (in, rows)
        zeros = _unpack(qzeros, 1)[self.g_idx] + self.zero_offset  # (in, rows)
        w = scales[self.g_idx].astype(jnp.float32) * (q - zeros).astype(jnp.float32)
        return w.T.astype(self.dtype)


def gptq_config(qconfig: Mapping[str, Any], where: str) -> tuple[int, int]:
    """The group size and zero offset of a GPTQ `quantization_config` treemod reads (4 bits,
    `checkpoint_format` "gptq" or "gptq_v2"; `format` where `checkpoint_format` is absent, as
    `transformers` reads it).

    Arguments:
        qconfig: `config.json`'s `quantization_config`.
        where: the file, for messages.

    Returns:
        `(group_size, zero_offset)`: `zero_offset` is 1 for "gptq", 0 for "gptq_v2".

    Raises:
        CheckpointError: other bit widths, `checkpoint_format`s or a group size that is not
            a positive int; the message names the option.
    """
    bits = qconfig.get("bits")
    if bits != 4:
        raise CheckpointError(
            f"{where}: quantization_config.bits={bits!r} is not read; treemod reads 4-bit GPTQ."
        )
    key = "checkpoint_format" if qconfig.get("checkpoint_format") is not None else "format"
    form = qconfig.get(key) or "gptq"
    if form not in FORMATS:
        raise CheckpointError(
            f"{where}: quantization_config.{key}={form!r} is not read; treemod reads GPTQ's "
            "'gptq' packing (zero points stored minus one) and 'gptq_v2' (stored as they are)."
        )
    group = qconfig.get("group_size")
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise CheckpointError(
            f"{where}: quantization_config.group_size={group!r}; treemod reads a positive "
            "group size (-1, one group per row, is not read)."
        )
    return group, FORMATS[form]


def gptq_layers(tensors: Mapping[str, Any]) -> dict[str, int]:
    """The GPTQ layers of a checkpoint: name -> number of groups (from `scales`' shape)."""
    out = {}
    for name in tensors:
        if name.endswith(".qweight"):
            p = name[: -len(".qweight")]
            out[p] = int(tensors[f"{p}.scales"].shape[0])
    return out


def gptq_skeleton_layer(
    layer: Any, name: str, groups: int, zero_offset: int, where: str
) -> GPTQLinear:
    """The `GPTQLinear` (zero arrays of the stored shapes) replacing the float `layer`.

    Arguments:
        layer: the model's `Linear` at `name`.
        name: its name.
        groups: the stored number of groups.
        zero_offset: `gptq_config`'s.
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
        zero_offset=zero_offset,
        slices=row_slices(n_out, 8),
        **common,
    )


def _block(name: str) -> tuple[str, str] | None:
    """`("model.layers", "self_attn.q_proj")` for `"model.layers.3.self_attn.q_proj"`."""
    head, sep, rest = name.partition(".")
    while sep:
        index, dot, inner = rest.partition(".")
        if index.isdigit() and dot:
            return head, inner
        head, sep, rest = f"{head}.{index}", dot, inner
    return None


def _placement(layers: Sequence[str], floats: Sequence[str]) -> tuple[str, list[str]]:
    """`block_name_to_quantize` and the names in a block of `layers`, after checking that
    `transformers`' GPTQ loader (which quantises every `Linear` under the block whose name ends
    as a listed one) quantises exactly `layers`."""
    found = {name: _block(name) for name in layers}
    blocks = {b[0] for b in found.values() if b is not None}
    block = min(blocks, default="")
    outside = [name for name, b in found.items() if b is None or b[0] != block]
    if outside:
        raise ValueError(
            f"save_pretrained: the int4 layer {outside[0]!r} is outside the "
            f"model's repeated blocks ({', '.join(sorted(blocks)) or 'none'}); transformers' "
            "GPTQ loader quantises the layers of one list of blocks only. Quantise only layers "
            "of the blocks (leave e.g. lm_head float), or treemod.quant.dequantise(model)."
        )
    inner = sorted({b[1] for b in found.values() if b is not None})
    for name in floats:
        ends = [i for i in inner if name.endswith(i)]
        if name.startswith(f"{block}.") and ends:
            raise ValueError(
                f"save_pretrained: {name!r} is float but the int4 layers include {ends[0]!r} "
                f"of another block; transformers' GPTQ loader quantises every layer of "
                f"{block} whose name ends so (modules_in_block_to_quantize). Quantise the "
                "same layers in every block."
            )
    return block, inner


def gptq_from_int4(
    layers: Mapping[str, Int4Linear], floats: Sequence[str]
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """GPTQ's tensors and `quantization_config` for treemod's `Int4Linear` layers.

    The levels and zero points are kept; the float32 scales become float16 (GPTQ stores them
    so), which moves each dequantised weight by at most 2^-11 of itself. The zero points are
    written as they are (`checkpoint_format: "gptq_v2"`) when one is 0, which the "gptq" format
    (zero points minus one) cannot hold; otherwise minus one in "gptq", which more loaders read.

    Arguments:
        layers: the model's `Int4Linear` layers by `treemod.state_dict` name.
        floats: the names of its float `Linear`s.

    Returns:
        `(tensors, quantization_config)`: each layer's `qweight`, `qzeros`, `scales` and `g_idx`
        by name, and the config (`sym` and `desc_act` false, the group size, the block list and
        the layers in a block `transformers` quantises).

    Raises:
        ValueError: layers of different group sizes, sizes not multiples of 8, scales beyond
            float16's range, or layers `transformers` would not quantise as they are; the
            message names a layer.
    """
    sizes = {layer.group_size for layer in layers.values()}
    first = next(iter(layers))
    if len(sizes) > 1:
        raise ValueError(
            f"save_pretrained: the int4 layers have group sizes {sorted(sizes)} ({first!r}: "
            f"{layers[first].group_size}); GPTQ's quantization_config holds one. Quantise with "
            "one group_size."
        )
    block, inner = _placement(list(layers), floats)
    offset = 1 if all(int(np.min(layer.zeros)) >= 1 for layer in layers.values()) else 0
    tensors: dict[str, np.ndarray] = {}
    for name, layer in layers.items():
        if layer.in_features % 8 or layer.out_features % 8:
            raise ValueError(
                f"save_pretrained: {name!r} is {layer.out_features}x{layer.in_features}; GPTQ "
                "packs eight levels an int32 along both axes, so both must be multiples of 8."
            )
        packed = np.asarray(layer.weight)
        levels = np.stack([packed & 15, packed >> 4], axis=-1).reshape(layer.out_features, -1)
        with np.errstate(over="ignore"):  # an overflow is the error below
            scales = np.asarray(layer.scales).T.astype(np.float16)
        if not np.isfinite(scales).all():
            raise ValueError(
                f"save_pretrained: {name!r} has scales beyond float16's range (65504), which "
                "GPTQ stores them in; dequantise the layer instead."
            )
        tensors |= {
            f"{name}.qweight": _pack(levels.T, 0),
            f"{name}.qzeros": _pack(np.asarray(layer.zeros).T.astype(np.int64) - offset, 1),
            f"{name}.scales": scales,
            f"{name}.g_idx": (np.arange(layer.in_features) // layer.group_size).astype(np.int32),
        }
    form = "gptq" if offset else "gptq_v2"
    qconfig = {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": sizes.pop(),
        "desc_act": False,
        "sym": False,
        "checkpoint_format": form,
        "format": form,
        "block_name_to_quantize": block,
        "modules_in_block_to_quantize": [inner],
    }
    return tensors, qconfig
