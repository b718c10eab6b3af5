"""`Int8Linear`, `NF4Linear` (NF4 or FP4) and `Int4Linear`: linear layers over quantised weights
whose matmul dequantises one slice of rows at a time inside the compiled program."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, PRNGKeyArray

from treemod._module.module import Module, field
from treemod.lora._select import AdaptedAsLinear
from treemod.nn._utils import lead

from . import _formats as fmt

__all__ = ["Int4Linear", "Int8Linear", "NF4Linear", "QuantLinear", "row_slices"]

# The matmul runs over at most this many slices of rows; each slice's float weight is the only
# full-precision piece alive, so the temporaries stay a fraction of the float weight.
MAX_SLICES = 16


def row_slices(rows: int, unit: int) -> int:
    """The number of slices for a matmul over `rows` rows dequantised `unit` rows at a time at
    the least: the largest count up to `MAX_SLICES` that splits `rows` into whole units."""
    if rows % unit:
        return 1
    units = rows // unit
    return max(n for n in range(1, MAX_SLICES + 1) if units % n == 0)


class QuantLinear(Module, AdaptedAsLinear):
    """The common part of the quantised linear layers: `y = x @ dequantise(W).T + bias`.

    Subclasses hold the packed weight and its scales and say how to dequantise a slice of
    rows; the call scans over `slices` slices of the output rows, dequantising each under
    `jax.checkpoint`, so neither the forward nor the backward pass holds the whole float
    weight. `treemod.lora.add_lora` wraps it like a `Linear` (it declares `AdaptedAsLinear`).

    Arguments:
        bias: the float bias, or `None`.
        in_features: the input size.
        out_features: the output size.
        dtype: the float dtype of the dequantised weight and of the computation (the dtype
            the weight had before quantisation).
        slices: how many slices of rows the matmul dequantises in turn.
    """

    bias: Array | None
    in_features: int = field(static=True)
    out_features: int = field(static=True)
    dtype: str = field(static=True)
    slices: int = field(static=True)

    def sliced(self) -> tuple[Array, ...]:
        """The arrays a slice of rows needs, each with a leading axis of `slices`."""
        raise NotImplementedError

    def dequantise_slice(self, arrays: tuple[Array, ...]) -> Array:
        """The float `(rows, in)` weight of one slice of `sliced()`."""
        raise NotImplementedError

    def dequantised_weight(self) -> Array:
        """The whole dequantised `(out, in)` weight (for `treemod.quant.dequantise`)."""
        parts = [self.dequantise_slice(a) for a in zip(*self.sliced(), strict=True)]
        return jnp.concatenate(parts).reshape(self.out_features, self.in_features)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Apply the layer.

        Arguments:
            x: `(*batch, in_features)`; cast to the layer's `dtype`.
            key: ignored (for a uniform interface with layers that need one).

        Returns:
            `(*batch, out_features)` in the layer's `dtype`.
        """
        if x.shape[-1:] != (self.in_features,):
            raise ValueError(
                f"{type(self).__name__}: the input's last axis must be in_features="
                f"{self.in_features}; got an input of shape {x.shape}."
            )
        x = x.astype(self.dtype)

        # Slice `i` is cut from the stored arrays inside the checkpoint, so the residuals for
        # the backward pass are those arrays themselves: under a `Stack`'s scan they are the
        # scan's inputs, not per-layer copies of the packed weights.
        @jax.checkpoint
        def one(i: Array) -> Array:
            arrays = tuple(lax.dynamic_index_in_dim(a, i, keepdims=False) for a in self.sliced())
            return x @ self.dequantise_slice(arrays).T

        ys = lax.map(one, jnp.arange(self.slices))  # (slices, *batch, rows)
        y = jnp.moveaxis(ys, 0, -2).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + lead(self.bias.astype(y.dtype), y.ndim)


class Int8Linear(QuantLinear):
    """Int8 weights with one scale per output channel (bitsandbytes' LLM.int8 row-wise format,
    without outliers): `W = q * absmax / 127`.

    Built by `treemod.quant.quantise(model, ..., scheme="int8")`; see `QuantLinear`.

    Arguments:
        weight: int8 `(out, in)`.
        absmax: float32 `(out,)`, each row's largest magnitude (bitsandbytes' `SCB`).
    """

    weight: Array
    absmax: Array

    def sliced(self) -> tuple[Array, ...]:
        """The int8 rows and their absmax, in `slices` slices."""
        n = self.slices
        return self.weight.reshape(n, -1, self.in_features), self.absmax.reshape(n, -1)

    def dequantise_slice(self, arrays: tuple[Array, ...]) -> Array:
        """`q * absmax * (1/127)` in float32, cast to `dtype`."""
        return fmt.dequantise_int8(arrays[0], arrays[1], self.dtype)


class NF4Linear(QuantLinear):
    """bitsandbytes' 4-bit weights exactly as its `Linear4bit` holds them: the row-major
    weight in blocks of `block_size`, each scaled by its absmax and rounded to the nearest of
    16 levels, two levels a byte; with double quantisation the absmax values are themselves
    8-bit in blocks of 256 around their mean (`offset`). The levels are NF4's normal ones
    (the default) or FP4's (`quant_type="fp4"`); nothing else differs.

    Built by `treemod.quant.quantise(model, ..., scheme="nf4")` (or `"fp4"`) and by loading a
    bitsandbytes 4-bit checkpoint; see `QuantLinear`.

    Arguments:
        weight: uint8 `(out * in // 2,)`, the packed levels.
        absmax: float32 `(blocks,)`, or uint8 with double quantisation.
        nested_absmax: float32 `(ceil(blocks / 256),)`, or `None`.
        offset: the float32 mean subtracted from the absmax values, or `None`.
        block_size: bitsandbytes' `blocksize`.
        quant_type: bitsandbytes' `quant_type`, `"nf4"` or `"fp4"`.
    """

    weight: Array
    absmax: Array
    nested_absmax: Array | None
    offset: Array | None
    block_size: int = field(static=True)
    quant_type: str = field(static=True, default="nf4")

    def __check_init__(self) -> None:
        if self.quant_type not in fmt.CODES_4BIT:
            raise ValueError(
                f"NF4Linear: quant_type must be one of {sorted(fmt.CODES_4BIT)} (bitsandbytes' "
                f"4-bit types); got {self.quant_type!r}."
            )
        offset = self.offset
        if (
            isinstance(offset, jax.Array)
            and not isinstance(offset, jax.core.Tracer)
            and not bool(jnp.all(jnp.isfinite(offset)))
        ):
            raise ValueError(
                "NF4Linear: the double quantisation's offset (the mean of the blocks' absmax "
                "values) is not finite: the absmax values overflow float32. Quantise this "
                "layer with double_quant=False."
            )

    def sliced(self) -> tuple[Array, ...]:
        """The packed levels and their blocks' float32 absmax, in `slices` slices."""
        absmax = fmt.absmax_4bit(self.absmax, self.nested_absmax, self.offset)
        n = self.slices
        return self.weight.reshape(n, -1), absmax.reshape(n, -1)

    def dequantise_slice(self, arrays: tuple[Array, ...]) -> Array:
        """`level value * absmax` in float32, cast to `dtype`."""
        flat = fmt.dequantise_4bit(
            arrays[0], arrays[1], self.block_size, self.dtype, self.quant_type
        )
        return flat.reshape(-1, self.in_features)


class Int4Linear(QuantLinear):
    """Asymmetric int4 weights with a scale and a zero point per group of input columns
    (GPTQ's and AWQ's format): `W = scale * (q - zero)`.

    Built by `treemod.quant.quantise(model, ..., scheme="int4")`; see `QuantLinear`.

    Arguments:
        weight: uint8 `(out, in // 2)`, the packed levels, column `2j` in the low nibble.
        scales: float32 `(out, in // group_size)`.
        zeros: uint8 `(out, in // group_size)`.
        group_size: the input columns sharing one scale and zero point.
    """

    weight: Array
    scales: Array
    zeros: Array
    group_size: int = field(static=True)

    def sliced(self) -> tuple[Array, ...]:
        """The packed rows, their scales and zero points, in `slices` slices."""
        n = self.slices
        return tuple(a.reshape(n, -1, a.shape[-1]) for a in (self.weight, self.scales, self.zeros))

    def dequantise_slice(self, arrays: tuple[Array, ...]) -> Array:
        """`scale * (q - zero)` in float32, cast to `dtype`."""
        return fmt.dequantise_int4(arrays[0], arrays[1], arrays[2], self.dtype)


def nf4_unit(in_features: int, block_size: int) -> int:
    """The fewest rows that hold whole 4-bit blocks (a slice of rows must)."""
    return block_size // math.gcd(in_features, block_size)


def layer_fields(layer: Any) -> dict[str, Any]:
    """The fields every quantised layer takes from the float `Linear` it replaces."""
    return dict(
        bias=layer.bias,
        in_features=int(layer.in_features),
        out_features=int(layer.out_features),
        dtype=jnp.dtype(layer.weight.dtype).name,
    )
