"""The quantisation formats as array functions: int8 per output channel, NF4 (bitsandbytes'
blockwise absmax with double quantisation) and int4 with zero points in groups (GPTQ's)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

__all__ = [
    "DYNAMIC_CODE",
    "NF4_CODE",
    "NESTED_BLOCK",
    "dequantise_blockwise",
    "dequantise_int4",
    "dequantise_int8",
    "dequantise_nf4",
    "nf4_absmax",
    "quantise_blockwise",
    "quantise_int4",
    "quantise_int8",
    "quantise_nf4",
]

# bitsandbytes' `get_4bit_type("nf4")`: the QLoRA paper's normal-float levels, as float32.
NF4_CODE = np.array(
    [
        -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
        -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
        0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
        0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
    ],
    np.float32,
)  # fmt: skip

# bitsandbytes quantises the NF4 absmax values in blocks of 256 (`compress_statistics`).
NESTED_BLOCK = 256


def _torch_linspace(start: float, end: float, steps: int) -> np.ndarray:
    """`torch.linspace(start, end, steps)` in float32, bit for bit: the first half counts up
    from `start`, the second down from `end`, each product taken in float64."""
    first, last = np.float32(start), np.float32(end)
    step = np.float32((last - first) / np.float32(steps - 1))
    k = np.arange(steps)
    up = (first + step * k).astype(np.float32)
    down = (last - step * (steps - 1 - k)).astype(np.float32)
    return np.where(k < steps // 2, up, down).astype(np.float32)


def _dynamic_code() -> np.ndarray:
    """bitsandbytes' `create_dynamic_map(signed=True)` (8 bits, 7 exponent bits), sorted."""
    values: list[np.float32] = []
    for i in range(7):
        bounds = _torch_linspace(0.1, 1.0, 2**i + 1)
        means = (bounds[:-1] + bounds[1:]) / np.float32(2)
        scaled = np.float32(10.0 ** (i - 6)) * means
        values += [*scaled, *(-scaled)]
    return np.sort(np.array([*values, 0.0, 1.0], np.float32))


DYNAMIC_CODE = _dynamic_code()


def _bucketize(scaled: Array, code: np.ndarray) -> Array:
    """The index of the nearest code value (bitsandbytes' midpoints; a tie goes down)."""
    midpoints = jnp.asarray((code[:-1] + code[1:]) / np.float32(2))
    return jnp.searchsorted(midpoints, scaled, side="left").astype(jnp.uint8)


def _blocks(flat: Array, block: int) -> tuple[Array, int]:
    """`flat` zero-padded to whole blocks, as `(blocks, block)`, and the padding."""
    pad = -flat.size % block
    return jnp.pad(flat, (0, pad)).reshape(-1, block), pad


def quantise_blockwise(x: Array, code: np.ndarray, block: int) -> tuple[Array, Array]:
    """bitsandbytes' `quantize_blockwise`: each block of `x.ravel()` scaled by its absmax and
    rounded to the nearest `code` value.

    Arguments:
        x: the values (any shape; read in row-major order).
        code: the sorted float32 levels in [-1, 1].
        block: the block size.

    Returns:
        `(indices, absmax)`: uint8 indices of `x.size` and float32 `(blocks,)`.
    """
    blocks, pad = _blocks(jnp.ravel(x).astype(jnp.float32), block)
    absmax = jnp.max(jnp.abs(blocks), axis=1)
    scaled = jnp.clip(blocks * (1.0 / jnp.maximum(absmax, 1e-38))[:, None], -1, 1)
    return _bucketize(scaled.ravel()[: x.size], code), absmax


def dequantise_blockwise(q: Array, absmax: Array, code: np.ndarray, block: int) -> Array:
    """bitsandbytes' `dequantize_blockwise`: `code[q] * absmax[block]` in float32.

    Arguments:
        q: uint8 indices (flat).
        absmax: float32 `(blocks,)`.
        code: the levels.
        block: the block size.

    Returns:
        float32 values of `q`'s size.
    """
    values, _ = _blocks(jnp.asarray(code)[q.astype(jnp.int32)], block)
    return (values * absmax[:, None]).ravel()[: q.size]


def quantise_nf4(w: Array, block: int, double_quant: bool) -> dict[str, Array]:
    """bitsandbytes' `quantize_4bit(quant_type="nf4")`, with `compress_statistics=double_quant`.

    Arguments:
        w: the weight (any shape, an even number of elements).
        block: the block size (bitsandbytes' `blocksize`).
        double_quant: quantise the absmax values as well (8-bit, blocks of 256, after
            subtracting their mean, the `offset`).

    Returns:
        `packed` (uint8, two levels a byte, the first in the high nibble), `absmax` (float32,
        or uint8 with `nested_absmax` and `offset` when `double_quant`).
    """
    q, absmax = quantise_blockwise(w, NF4_CODE, block)
    packed = (q[0::2] << 4) | q[1::2]
    if not double_quant:
        return {"packed": packed, "absmax": absmax}
    # bitsandbytes' `absmax.mean()` sums in an order that depends on the CPU's vector width, so
    # this offset can differ from its in the last bit (the levels then agree, see the tests).
    offset = jnp.mean(absmax)
    q_absmax, nested = quantise_blockwise(absmax - offset, DYNAMIC_CODE, NESTED_BLOCK)
    return {"packed": packed, "absmax": q_absmax, "nested_absmax": nested, "offset": offset}


def nf4_absmax(absmax: Array, nested_absmax: Array | None, offset: Array | None) -> Array:
    """The float32 absmax of each NF4 block (undoing the double quantisation, if any)."""
    if nested_absmax is None or offset is None:
        return absmax
    return dequantise_blockwise(absmax, nested_absmax, DYNAMIC_CODE, NESTED_BLOCK) + offset


def dequantise_nf4(packed: Array, absmax: Array, block: int, dtype: Any) -> Array:
    """bitsandbytes' `dequantize_4bit` for NF4: `NF4_CODE[level] * absmax` in float32, then
    cast to `dtype`.

    Arguments:
        packed: uint8, two levels a byte (flat, or rows of whole blocks).
        absmax: the blocks' float32 absmax (see `nf4_absmax`).
        block: the block size.
        dtype: the output dtype.

    Returns:
        The flat values (`2 * packed.size`) in `dtype`.
    """
    flat = packed.ravel()
    levels = jnp.stack([flat >> 4, flat & 15], axis=-1).ravel()
    return dequantise_blockwise(levels, absmax, NF4_CODE, block).astype(dtype)


def quantise_int8(w: Array) -> tuple[Array, Array]:
    """Per output channel (row) int8, as bitsandbytes' `int8_vectorwise_quant` (LLM.int8
    without outliers): `round(w * 127 / absmax_row)`.

    Arguments:
        w: `(out, in)`.

    Returns:
        `(q, absmax)`: int8 `(out, in)` and float32 `(out,)` (bitsandbytes' `SCB`).
    """
    absmax = jnp.max(jnp.abs(w.astype(jnp.float32)), axis=1)
    # An all-zero row would divide by zero (NaN levels); its levels are 0 instead.
    scale = jnp.where(absmax > 0, 127.0 / jnp.where(absmax > 0, absmax, 1.0), 0.0)
    q = jnp.round(w.astype(jnp.float32) * scale[:, None])
    return q.astype(jnp.int8), absmax


def dequantise_int8(q: Array, absmax: Array, dtype: Any) -> Array:
    """bitsandbytes' `int8_vectorwise_dequant`: `q * absmax * (1/127)` in float32, cast.

    Arguments:
        q: int8 `(rows, in)`.
        absmax: float32 `(rows,)`.
        dtype: the output dtype.

    Returns:
        `(rows, in)` in `dtype`.
    """
    scaled = q.astype(jnp.float32) * absmax[:, None] * np.float32(7.874015718698502e-3)
    return scaled.astype(dtype)


def quantise_int4(w: Array, group: int) -> tuple[Array, Array, Array]:
    """Asymmetric 4-bit in groups of `group` input columns, as GPTQ's `Quantizer` (bits=4,
    sym=False) defines it: the range includes 0, `scale = (max - min) / 15`,
    `zero = round(-min / scale)`, `q = clip(round(w / scale) + zero, 0, 15)`.

    Arguments:
        w: `(out, in)`; `in` a multiple of `group` and even.
        group: the group size (GPTQ's and AWQ's `group_size`).

    Returns:
        `(packed, scales, zeros)`: uint8 `(out, in // 2)` (column `2j` in the low nibble,
        GPTQ's order), float32 `(out, in // group)` and uint8 `(out, in // group)`.
    """
    out, n_in = w.shape
    g = w.astype(jnp.float32).reshape(out, n_in // group, group)
    low = jnp.minimum(jnp.min(g, axis=-1), 0.0)
    high = jnp.maximum(jnp.max(g, axis=-1), 0.0)
    empty = (low == 0) & (high == 0)
    low, high = jnp.where(empty, -1.0, low), jnp.where(empty, 1.0, high)
    scales = (high - low) / 15
    zeros = jnp.round(-low / scales)
    q = jnp.clip(jnp.round(g / scales[..., None]) + zeros[..., None], 0, 15)
    q = q.astype(jnp.uint8).reshape(out, n_in)
    return q[:, 0::2] | (q[:, 1::2] << 4), scales, zeros.astype(jnp.uint8)


def dequantise_int4(packed: Array, scales: Array, zeros: Array, dtype: Any) -> Array:
    """GPTQ's dequantisation, `scale * (q - zero)` per group, in float32, then cast.

    Arguments:
        packed: uint8 `(rows, in // 2)`.
        scales: float32 `(rows, groups)`.
        zeros: uint8 `(rows, groups)`.
        dtype: the output dtype.

    Returns:
        `(rows, in)` in `dtype`.
    """
    rows = packed.shape[0]
    q = jnp.stack([packed & 15, packed >> 4], axis=-1).reshape(rows, scales.shape[1], -1)
    centred = q.astype(jnp.float32) - zeros.astype(jnp.float32)[..., None]
    return (centred * scales[..., None]).reshape(rows, -1).astype(dtype)
