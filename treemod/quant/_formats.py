"""The quantisation formats as array functions: int8 per output channel, bitsandbytes' 4-bit
NF4 and FP4 (blockwise absmax with double quantisation; the two differ only by their 16
levels) and int4 with zero points in groups (GPTQ's)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array

__all__ = [
    "CODES_4BIT",
    "DYNAMIC_CODE",
    "FP4_CODE",
    "NESTED_BLOCK",
    "NF4_CODE",
    "absmax_4bit",
    "code_4bit",
    "dequantise_4bit",
    "dequantise_blockwise",
    "dequantise_int4",
    "dequantise_int8",
    "quantise_4bit",
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

# bitsandbytes' `get_4bit_type("fp4")`: 1 sign, 2 exponent and 1 mantissa bit divided by the
# largest magnitude, 12, in level order (level 8, the sign bit alone, is a zero too).
FP4_CODE = (
    np.array([0, 0.0625, 8, 12, 4, 6, 2, 3, 0, -0.0625, -8, -12, -4, -6, -2, -3], np.float32)
    / np.float32(12)
).astype(np.float32)

CODES_4BIT = {"nf4": NF4_CODE, "fp4": FP4_CODE}

# Float32 magnitudes by their bits (whose order is the values' order, subnormals included).
_TINY_BITS = 0x006CE3EE  # 1e-38, bitsandbytes' least divisor (and a last block's least absmax)
_SMALL_BITS = 0x21800000  # 2**-60: a block below it is scaled at 2**64 times its size
_HUGE_BITS = 0x7E800000  # 2**126: from it on, 1 / absmax is subnormal


def _least_int8_absmax() -> int:
    """The bits of the least float32 `a` with a finite `127 * (1 / a)`."""
    a = np.float32(127) / np.finfo(np.float32).max
    with np.errstate(over="ignore"):
        while np.isfinite(np.float32(127) * (np.float32(1) / a)):
            a = np.nextafter(a, np.float32(0))
        return int(np.nextafter(a, np.float32(1)).view(np.uint32))


_INT8_LEAST_BITS = _least_int8_absmax()


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
    """The index of the nearest `code` value, as bitsandbytes' `torch.bucketize` over the
    midpoints of the sorted code (a value on a midpoint goes down; equal codes keep their
    order, so FP4's +0 is level 0 and its -0 level 8)."""
    order = np.argsort(code, kind="stable")
    ranked = code[order]
    midpoints = jnp.asarray((ranked[:-1] + ranked[1:]) / np.float32(2))
    rank = jnp.searchsorted(midpoints, scaled, side="left")
    return jnp.asarray(order.astype(np.uint8))[rank]


def _blocks(flat: Array, block: int) -> tuple[Array, int]:
    """`flat` zero-padded to whole blocks, as `(blocks, block)`, and the padding."""
    pad = -flat.size % block
    return jnp.pad(flat, (0, pad)).reshape(-1, block), pad


# XLA's CPU arithmetic reads and writes subnormal float32 values as zero; torch's does not.
# bitsandbytes scales with torch, so the helpers below reach its results without a subnormal
# operand or result: they work at 2**64 times the size, or read the bits.


def _magnitude(x: Array) -> Array:
    """`|x|`'s bits (uint32), exact for subnormals."""
    return lax.bitcast_convert_type(x, jnp.uint32) & np.uint32(0x7FFFFFFF)


def _float(bits: Array) -> Array:
    return lax.bitcast_convert_type(bits, jnp.float32)


def _up(x: Array) -> Array:
    """`x * 2**64` exactly (`|x| < 2**63`), a subnormal `x` read from its bits."""
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    mantissa = (bits & np.uint32(0x7FFFFF)).astype(jnp.float32) * 2.0**-85
    subnormal = (bits & np.uint32(0x7F800000)) == 0
    return jnp.where(subnormal, jnp.where(bits >> 31 == 1, -mantissa, mantissa), x * 2.0**64)


def _split(a: Array) -> tuple[Array, Array]:
    """Veltkamp's split of a float32 into two 12-bit halves (`hi + lo == a` exactly)."""
    c = a * 4097.0
    hi = c - (c - a)
    return hi, a - hi


def _below_product(a: Array, b: Array) -> tuple[Array, Array]:
    """Whether `a * b < 1` and whether `a * b == 1`, exactly (Dekker's product; `a * b` near
    1)."""
    p = a * b
    (ah, al), (bh, bl) = _split(a), _split(b)
    err = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return (p < 1) | ((p == 1) & (err < 0)), (p == 1) & (err == 0)


def _huge_reciprocal(d: Array) -> Array:
    """`2**64` times torch's float32 `1 / d` for `d >= 2**126`, where that is subnormal: formed
    at 2**64 times its size and rounded to the subnormal grid (steps of 2**-85 there), ties
    decided by the exact product."""
    big = d * 2.0**-64
    r = 1.0 / big
    steps = r * 2.0**85
    below, exact = _below_product(big, r)  # 1 / big > r when big * r < 1
    tie = steps - jnp.floor(steps) == 0.5
    rounded = jnp.where(tie & ~exact, jnp.where(below, jnp.ceil(steps), jnp.floor(steps)),
                        jnp.round(steps))  # fmt: skip
    return rounded * 2.0**-85


def _times_reciprocal(x: Array, absmax_bits: Array, factor: float = 1.0) -> Array:
    """`x * (factor * (1 / max(absmax, 1e-38)))` rounded as torch rounds it in float32
    (bitsandbytes' scaling), for `absmax` given by its bits (broadcast against `x`)."""
    bits = jnp.maximum(absmax_bits, np.uint32(_TINY_BITS))
    d = _float(bits)
    small = _up(x) * (factor * (1.0 / _up(d)))
    huge = (x * (factor * _huge_reciprocal(d))) * 2.0**-64
    plain = x * (factor * (1.0 / d))
    return jnp.where(bits < _SMALL_BITS, small, jnp.where(bits >= _HUGE_BITS, huge, plain))


def _divided(x: Array, absmax_bits: Array) -> Array:
    """`x / max(absmax, 1e-38)` rounded as torch rounds it (bitsandbytes' last partial
    block), `absmax` given by its bits (a scalar)."""
    bits = jnp.maximum(absmax_bits, np.uint32(_TINY_BITS))
    d = _float(bits)
    small = bits < _SMALL_BITS
    # A barrier keeps this a division: XLA turns a division by a broadcast scalar into a
    # multiplication by its reciprocal, which rounds differently.
    divisor: Array = lax.optimization_barrier(
        jnp.broadcast_to(jnp.where(small, _up(d), d), x.shape)
    )
    return jnp.where(small, _up(x), x) / divisor


def quantise_blockwise(x: Array, code: np.ndarray, block: int) -> tuple[Array, Array]:
    """bitsandbytes' `quantize_blockwise`: each block of `x.ravel()` scaled by its absmax and
    rounded to the nearest `code` value.

    Arguments:
        x: the values (any shape; read in row-major order).
        code: the float32 levels in [-1, 1].
        block: the block size.

    Returns:
        `(indices, absmax)`: uint8 indices of `x.size` and float32 `(blocks,)`.
    """
    blocks, pad = _blocks(jnp.ravel(x).astype(jnp.float32), block)
    bits = jnp.max(_magnitude(blocks), axis=1)
    scaled = jnp.clip(_times_reciprocal(blocks, bits[:, None]), -1, 1)
    # bitsandbytes' CPU kernel divides an all-zero block by its zero absmax and finds the NaN
    # below every code value: index 0 (which dequantises to -0.0, not 0.0).
    q = jnp.where(bits[:, None] > 0, _bucketize(scaled, code), jnp.uint8(0))
    return q.ravel()[: x.size], _float(bits)


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


def code_4bit(quant_type: str) -> np.ndarray:
    """bitsandbytes' 16 levels of `quant_type` (`"nf4"` or `"fp4"`), in level order."""
    if quant_type not in CODES_4BIT:
        raise ValueError(
            f"quant_type must be one of {sorted(CODES_4BIT)} (bitsandbytes' 4-bit types); "
            f"got {quant_type!r}."
        )
    return CODES_4BIT[quant_type]


def _scaled_4bit(w: Array, block: int) -> tuple[Array, Array]:
    """bitsandbytes' `quantize_4bit` scaling on the CPU, as torch rounds it: whole blocks times
    the reciprocal of their absmax, a last partial block divided by its absmax (stored as at
    least 1e-38), clipped to [-1, 1]; and the absmax values.

    A positive value scaled to a subnormal (FP4's level 8 in torch, not level 0) is given the
    least normal size: XLA would flush it to zero. Whether torch's product is nonzero (above
    2**-150) is read at 2**64 times its size."""
    flat = jnp.ravel(w).astype(jnp.float32)
    full = flat.size - flat.size % block
    body = flat[:full].reshape(-1, block)
    bits = jnp.max(_magnitude(body), axis=1, initial=np.uint32(0))
    scaled = _times_reciprocal(body, bits[:, None]).ravel()
    upscaled = _times_reciprocal(_up(body), bits[:, None]).ravel()
    if full < flat.size:
        tail = flat[full:]
        last = jnp.maximum(jnp.max(_magnitude(tail)), np.uint32(_TINY_BITS))
        scaled = jnp.concatenate([scaled, _divided(tail, last)])
        upscaled = jnp.concatenate([upscaled, _divided(_up(tail), last)])
        bits = jnp.concatenate([bits, last[None]])
    subnormal = (scaled == 0) & (upscaled > 2.0**-86)
    scaled = jnp.where(subnormal, np.float32(2.0**-126), jnp.clip(scaled, -1, 1))
    return scaled, _float(bits)


# Compiled whole, the quantisers' elementwise steps fuse: eagerly each step would be a
# temporary of the weight's size (2.5 times slower on a 2048x4096 weight).
@functools.partial(jax.jit, static_argnums=(1, 2))
def _packed_4bit(w: Array, block: int, fp4: bool) -> tuple[Array, Array]:
    """The packed levels and the absmax values of `quantise_4bit`."""
    scaled, absmax = _scaled_4bit(w, block)
    q = _bucketize(jnp.pad(scaled, (0, scaled.size % 2)), FP4_CODE if fp4 else NF4_CODE)
    return (q[0::2] << 4) | q[1::2], absmax


def quantise_4bit(
    w: Array, block: int, double_quant: bool, quant_type: str = "nf4"
) -> dict[str, Array]:
    """bitsandbytes' `quantize_4bit` (its CPU backend), `compress_statistics=double_quant`.

    Arguments:
        w: the weight (any shape; read in row-major order).
        block: the block size (bitsandbytes' `blocksize`).
        double_quant: quantise the absmax values as well (8-bit, blocks of 256, after
            subtracting their mean, the `offset`).
        quant_type: `"nf4"` or `"fp4"`, the 16 levels (`code_4bit`).

    Returns:
        `packed` (uint8 `(ceil(w.size / 2),)`, two levels a byte, the first in the high
        nibble; an odd count is padded with the level of 0), `absmax` (float32, or uint8 with
        `nested_absmax` and `offset` when `double_quant`).

    Example:
        >>> import jax.numpy as jnp
        >>> state = quantise_4bit(jnp.array([[1.0, -0.5], [0.25, 0.0]]), 64, False, "fp4")
        >>> [hex(int(b)) for b in state["packed"]], state["absmax"].tolist()
        (['0x3d', '0x70'], [1.0])
    """
    packed, absmax = _packed_4bit(w, block, code_4bit(quant_type) is FP4_CODE)
    if not double_quant:
        return {"packed": packed, "absmax": absmax}
    # bitsandbytes' `absmax.mean()` is torch's float32 sum, whose order depends on the CPU's
    # vector width and thread count, so this offset can differ from its in the last bits.
    offset = jnp.mean(absmax)
    q_absmax, nested = quantise_blockwise(absmax - offset, DYNAMIC_CODE, NESTED_BLOCK)
    return {"packed": packed, "absmax": q_absmax, "nested_absmax": nested, "offset": offset}


def quantise_nf4(w: Array, block: int, double_quant: bool) -> dict[str, Array]:
    """`quantise_4bit(w, block, double_quant, "nf4")`."""
    return quantise_4bit(w, block, double_quant, "nf4")


def absmax_4bit(absmax: Array, nested_absmax: Array | None, offset: Array | None) -> Array:
    """The float32 absmax of each 4-bit block (undoing the double quantisation, if any)."""
    if nested_absmax is None or offset is None:
        return absmax
    return dequantise_blockwise(absmax, nested_absmax, DYNAMIC_CODE, NESTED_BLOCK) + offset


def dequantise_4bit(
    packed: Array, absmax: Array, block: int, dtype: Any, quant_type: str = "nf4"
) -> Array:
    """bitsandbytes' `dequantize_4bit` on the CPU: `code[level] * absmax` in float32, then cast
    to `dtype`.

    FP4's level 8 (a zero with the sign bit set) gives +0.0, as bitsandbytes' code table, its
    torch fallback and its vectorised CPU kernel give it; its scalar CPU kernel (rows not a
    multiple of 16 values, blocks under 2048) and its CUDA kernel give -0.0: the same value.

    Arguments:
        packed: uint8, two levels a byte (flat, or rows of whole blocks).
        absmax: the blocks' float32 absmax (see `absmax_4bit`).
        block: the block size.
        dtype: the output dtype.
        quant_type: `"nf4"` or `"fp4"`.

    Returns:
        The flat values (`2 * packed.size`) in `dtype`.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> packed = jnp.array([0x3D, 0x70], jnp.uint8)
        >>> dequantise_4bit(packed, jnp.array([2.0]), 64, "float32", "fp4").tolist()
        [2.0, -1.0, 0.5, 0.0]
    """
    flat = packed.ravel()
    levels = jnp.stack([flat >> 4, flat & 15], axis=-1).ravel()
    return dequantise_blockwise(levels, absmax, code_4bit(quant_type), block).astype(dtype)


def quantise_int8(w: Array) -> tuple[Array, Array]:
    """Per output channel (row) int8, as bitsandbytes' `int8_vectorwise_quant` (LLM.int8
    without outliers): `round(w * (127 / absmax_row))`, rounded as torch rounds it (its
    `127 / t` is `127 * (1 / t)`, two roundings).

    A row whose absmax is zero, or about below `127 / float32's max` (bitsandbytes' scale
    overflows to inf there and its levels are undefined), gets levels 0.

    Arguments:
        w: `(out, in)`.

    Returns:
        `(q, absmax)`: int8 `(out, in)` and float32 `(out,)` (bitsandbytes' `SCB`).

    Example:
        >>> import jax.numpy as jnp
        >>> q, absmax = quantise_int8(jnp.array([[1.0, -0.5], [0.0, 0.0]]))
        >>> q.tolist(), absmax.tolist()
        ([[127, -64], [0, 0]], [1.0, 0.0])
    """
    q, absmax = _int8(w)
    return q, absmax


@jax.jit
def _int8(w: Array) -> tuple[Array, Array]:
    x = w.astype(jnp.float32)
    bits = jnp.max(_magnitude(x), axis=1)
    q = jnp.round(_times_reciprocal(x, bits[:, None], 127.0))
    q = jnp.where((bits >= _INT8_LEAST_BITS)[:, None], q, 0.0)
    return q.astype(jnp.int8), _float(bits)


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
