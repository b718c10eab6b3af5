"""Initialisers: functions `init(key, shape, dtype=float32) -> array`.

Layers take them as `weight_init=` / `bias_init=`. Factories (`normal(0.02)`,
`variance_scaling(...)`) return such functions. Fans follow the PyTorch layout of weights,
`(out, in, *kernel)`: `fan_in = in * prod(kernel)`, `fan_out = out * prod(kernel)`.

Every initialiser also takes a complex dtype: the real and imaginary parts are then two
independent draws of the law it names, as PyTorch's `uniform_` and so its default complex
`Linear` and `Conv` initialisation (each part U(-1/sqrt(fan_in), 1/sqrt(fan_in))), and Equinox's
layers, draw them. (`jax.nn.initializers` and PyTorch's `normal_` instead split the variance
between the two parts.)

Example:
    >>> import jax, jax.numpy as jnp, treemod.nn as nn
    >>> w = nn.init.glorot_uniform(jax.random.key(0), (4, 3))
    >>> w.shape, w.dtype
    ((4, 3), dtype('float32'))
    >>> nn.init.zeros(jax.random.key(0), (2,), jnp.bfloat16)
    Array([0, 0], dtype=bfloat16)
"""

# Every import is under a private name (and no `from __future__ import annotations`, which
# would bind `annotations`), so the module's public names are its initialisers alone.
import functools as _functools
import math as _math
from collections.abc import Callable as _Callable
from collections.abc import Sequence as _Sequence
from typing import Any as _Any
from typing import Literal as _Literal

import jax as _jax
import jax.numpy as _jnp
from jaxtyping import Array as _Array
from jaxtyping import PRNGKeyArray as _PRNGKeyArray

__all__ = [
    "Initializer",
    "constant",
    "fans",
    "glorot_normal",
    "glorot_uniform",
    "he_normal",
    "he_uniform",
    "kaiming_normal",
    "kaiming_uniform",
    "lecun_normal",
    "lecun_uniform",
    "normal",
    "ones",
    "orthogonal",
    "pytorch_default",
    "truncated_normal",
    "uniform",
    "variance_scaling",
    "xavier_normal",
    "xavier_uniform",
    "zeros",
]

_DType = _Any


def _normal(
    key: _PRNGKeyArray, shape: tuple[int, ...], stddev: float = 1.0, mean: float = 0.0
) -> _Array:
    return _jax.random.normal(key, shape, _jnp.float32) * stddev + mean


def _uniform(key: _PRNGKeyArray, shape: tuple[int, ...], minval: float, maxval: float) -> _Array:
    return _jax.random.uniform(key, shape, _jnp.float32, minval, maxval)


def _truncated_normal(
    key: _PRNGKeyArray,
    shape: tuple[int, ...],
    lower: float = -2.0,
    upper: float = 2.0,
    stddev: float = 1.0,
    mean: float = 0.0,
) -> _Array:
    return _jax.random.truncated_normal(key, lower, upper, shape, _jnp.float32) * stddev + mean


Initializer = _Callable[..., _Array]
"""The type of an initialiser: `init(key, shape, dtype=jnp.float32) -> Array`."""


def _draw(
    name: str,
    sample: _Callable[[_PRNGKeyArray, tuple[int, ...]], _Array],
    key: _PRNGKeyArray,
    shape: _Sequence[int],
    dtype: _DType,
) -> _Array:
    """`sample(key, shape)` (float32), drawn as one flat vector and reshaped.

    JAX's random numbers depend only on the flat index, so the values are those of drawing
    `shape` directly; but inside `jit` a 1-d draw compiles faster, and transposing it (as
    channels-last layers do with their kernels) costs no extra compile time. For a complex
    `dtype` the real and imaginary parts are two independent draws of the same law, from the
    two halves of `key`.
    """
    shape, flat = tuple(shape), (_math.prod(shape),)
    if _jnp.issubdtype(dtype, _jnp.complexfloating):
        real_key, imag_key = _jax.random.split(key)
        return _jax.lax.complex(sample(real_key, flat), sample(imag_key, flat)).reshape(shape)
    if not _jnp.issubdtype(dtype, _jnp.floating):
        raise TypeError(
            f"init.{name}: dtype must be a floating or complex dtype, got {_jnp.dtype(dtype)}."
        )
    return sample(key, flat).reshape(shape)


def zeros(key: _PRNGKeyArray, shape: _Sequence[int], dtype: _DType = _jnp.float32) -> _Array:
    """All zeros (the key is ignored).

    Example:
        >>> import jax, treemod.nn as nn
        >>> nn.init.zeros(jax.random.key(0), (2,))
        Array([0., 0.], dtype=float32)
    """
    return _jnp.zeros(tuple(shape), dtype)


def ones(key: _PRNGKeyArray, shape: _Sequence[int], dtype: _DType = _jnp.float32) -> _Array:
    """All ones (the key is ignored).

    Example:
        >>> import jax, treemod.nn as nn
        >>> nn.init.ones(jax.random.key(0), (2,))
        Array([1., 1.], dtype=float32)
    """
    return _jnp.ones(tuple(shape), dtype)


def constant(value: float) -> Initializer:
    """An initialiser filling with `value`.

    Arguments:
        value: the fill value.

    Example:
        >>> import jax, treemod.nn as nn
        >>> nn.init.constant(0.5)(jax.random.key(0), (2,))
        Array([0.5, 0.5], dtype=float32)
    """

    def init(key: _PRNGKeyArray, shape: _Sequence[int], dtype: _DType = _jnp.float32) -> _Array:
        return _jnp.full(tuple(shape), value, dtype)

    return init


def normal(stddev: float = 1.0, mean: float = 0.0) -> Initializer:
    """An initialiser drawing from N(mean, stddev²).

    Arguments:
        stddev: the standard deviation.
        mean: the mean.

    Example:
        >>> import jax, treemod.nn as nn
        >>> nn.init.normal(0.02)(jax.random.key(0), (3, 2)).shape
        (3, 2)
    """

    def init(key: _PRNGKeyArray, shape: _Sequence[int], dtype: _DType = _jnp.float32) -> _Array:
        sample = _functools.partial(_normal, stddev=stddev, mean=mean)
        return _draw("normal", sample, key, shape, dtype).astype(dtype)

    return init


def truncated_normal(
    stddev: float = 1.0, mean: float = 0.0, lower: float = -2.0, upper: float = 2.0
) -> Initializer:
    """An initialiser drawing from N(mean, stddev²) truncated to `lower`..`upper` stddevs.

    `stddev` is that of the untruncated normal (as in PyTorch's `trunc_normal_`, with bounds
    given in standard deviations).

    Arguments:
        stddev: the standard deviation before truncation.
        mean: the mean.
        lower: the lower bound, in standard deviations.
        upper: the upper bound, in standard deviations.

    Example:
        >>> import jax, treemod.nn as nn
        >>> w = nn.init.truncated_normal(1.0)(jax.random.key(0), (1000,))
        >>> bool(abs(w).max() <= 2.0)
        True
    """

    def init(key: _PRNGKeyArray, shape: _Sequence[int], dtype: _DType = _jnp.float32) -> _Array:
        sample = _functools.partial(
            _truncated_normal, lower=lower, upper=upper, stddev=stddev, mean=mean
        )
        return _draw("truncated_normal", sample, key, shape, dtype).astype(dtype)

    return init


def uniform(minval: float = 0.0, maxval: float = 1.0) -> Initializer:
    """An initialiser drawing from U(minval, maxval).

    Arguments:
        minval: the lower bound.
        maxval: the upper bound.

    Example:
        >>> import jax, treemod.nn as nn
        >>> w = nn.init.uniform(-0.1, 0.1)(jax.random.key(0), (100,))
        >>> bool((abs(w) <= 0.1).all())
        True
    """

    def init(key: _PRNGKeyArray, shape: _Sequence[int], dtype: _DType = _jnp.float32) -> _Array:
        sample = _functools.partial(_uniform, minval=minval, maxval=maxval)
        return _draw("uniform", sample, key, shape, dtype).astype(dtype)

    return init


def fans(shape: _Sequence[int], in_axis: int = 1, out_axis: int = 0) -> tuple[int, int]:
    """`(fan_in, fan_out)` of a weight of `shape` (PyTorch layout `(out, in, *kernel)` by default).

    A 1-d shape has `fan_in = fan_out = shape[0]`.

    Arguments:
        shape: the weight shape.
        in_axis: the input-feature axis.
        out_axis: the output-feature axis.

    Example:
        >>> import treemod.nn as nn
        >>> nn.init.fans((16, 3, 5, 5))
        (75, 400)
    """
    shape = tuple(shape)
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    n_in, n_out = shape[in_axis], shape[out_axis]
    receptive = _math.prod(
        s for i, s in enumerate(shape) if i not in (in_axis % len(shape), out_axis % len(shape))
    )
    return n_in * receptive, n_out * receptive


def variance_scaling(
    scale: float,
    mode: _Literal["fan_in", "fan_out", "fan_avg"],
    distribution: _Literal["uniform", "normal", "truncated_normal"],
    in_axis: int = 1,
    out_axis: int = 0,
) -> Initializer:
    """An initialiser with variance `scale / n`, where `n` is the fan chosen by `mode`.

    `uniform` draws from U(-sqrt(3 scale/n), sqrt(3 scale/n)); `normal` from N(0, scale/n);
    `truncated_normal` from a normal truncated at two standard deviations, rescaled to have
    variance `scale/n`.

    Arguments:
        scale: the variance scale.
        mode: `"fan_in"`, `"fan_out"` or `"fan_avg"`.
        distribution: `"uniform"`, `"normal"` or `"truncated_normal"`.
        in_axis: the input-feature axis of the weight.
        out_axis: the output-feature axis of the weight.

    Example:
        >>> import jax, treemod.nn as nn
        >>> init = nn.init.variance_scaling(2.0, "fan_in", "normal")
        >>> init(jax.random.key(0), (64, 32)).shape
        (64, 32)
    """
    if mode not in ("fan_in", "fan_out", "fan_avg"):
        raise ValueError(f"variance_scaling: mode must be fan_in, fan_out or fan_avg; got {mode!r}")
    if distribution not in ("uniform", "normal", "truncated_normal"):
        raise ValueError(
            "variance_scaling: distribution must be uniform, normal or truncated_normal; "
            f"got {distribution!r}"
        )

    def init(key: _PRNGKeyArray, shape: _Sequence[int], dtype: _DType = _jnp.float32) -> _Array:
        fan_in, fan_out = fans(shape, in_axis, out_axis)
        n = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[mode]
        variance = scale / max(n, 1)
        shape = tuple(shape)
        if distribution == "uniform":
            bound = _math.sqrt(3.0 * variance)
            sample = _functools.partial(_uniform, minval=-bound, maxval=bound)
            x = _draw("variance_scaling", sample, key, shape, dtype)
        elif distribution == "normal":
            x = _draw("variance_scaling", _normal, key, shape, dtype) * _math.sqrt(variance)
        else:
            std = _math.sqrt(variance) / 0.87962566103423978
            x = _draw("variance_scaling", _truncated_normal, key, shape, dtype) * std
        return x.astype(dtype)

    return init


def glorot_uniform(
    key: _PRNGKeyArray, shape: _Sequence[int], dtype: _DType = _jnp.float32
) -> _Array:
    """Glorot (Xavier) uniform: U(-a, a) with a = sqrt(6 / (fan_in + fan_out)).

    Example:
        >>> import jax, treemod.nn as nn
        >>> nn.init.glorot_uniform(jax.random.key(0), (3, 2)).shape
        (3, 2)
    """
    return variance_scaling(1.0, "fan_avg", "uniform")(key, shape, dtype)


def glorot_normal(
    key: _PRNGKeyArray, shape: _Sequence[int], dtype: _DType = _jnp.float32
) -> _Array:
    """Glorot (Xavier) normal: N(0, 2 / (fan_in + fan_out)).

    Example:
        >>> import jax, treemod.nn as nn
        >>> nn.init.glorot_normal(jax.random.key(0), (3, 2)).shape
        (3, 2)
    """
    return variance_scaling(1.0, "fan_avg", "normal")(key, shape, dtype)


def he_uniform(key: _PRNGKeyArray, shape: _Sequence[int], dtype: _DType = _jnp.float32) -> _Array:
    """He (Kaiming) uniform for ReLU: U(-a, a) with a = sqrt(6 / fan_in).

    Example:
        >>> import jax, treemod.nn as nn
        >>> nn.init.he_uniform(jax.random.key(0), (3, 2)).shape
        (3, 2)
    """
    return variance_scaling(2.0, "fan_in", "uniform")(key, shape, dtype)


def he_normal(key: _PRNGKeyArray, shape: _Sequence[int], dtype: _DType = _jnp.float32) -> _Array:
    """He (Kaiming) normal for ReLU: N(0, 2 / fan_in).

    Example:
        >>> import jax, treemod.nn as nn
        >>> nn.init.he_normal(jax.random.key(0), (3, 2)).shape
        (3, 2)
    """
    return variance_scaling(2.0, "fan_in", "normal")(key, shape, dtype)


def lecun_uniform(
    key: _PRNGKeyArray, shape: _Sequence[int], dtype: _DType = _jnp.float32
) -> _Array:
    """LeCun uniform: U(-a, a) with a = sqrt(3 / fan_in).

    Example:
        >>> import jax, treemod.nn as nn
        >>> nn.init.lecun_uniform(jax.random.key(0), (3, 2)).shape
        (3, 2)
    """
    return variance_scaling(1.0, "fan_in", "uniform")(key, shape, dtype)


def lecun_normal(key: _PRNGKeyArray, shape: _Sequence[int], dtype: _DType = _jnp.float32) -> _Array:
    """LeCun normal: N(0, 1 / fan_in).

    Example:
        >>> import jax, treemod.nn as nn
        >>> nn.init.lecun_normal(jax.random.key(0), (3, 2)).shape
        (3, 2)
    """
    return variance_scaling(1.0, "fan_in", "normal")(key, shape, dtype)


xavier_uniform = glorot_uniform
xavier_normal = glorot_normal
kaiming_uniform = he_uniform
kaiming_normal = he_normal


def pytorch_default(
    key: _PRNGKeyArray, shape: _Sequence[int], dtype: _DType = _jnp.float32
) -> _Array:
    """PyTorch's default Linear/Conv weight init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

    This is `kaiming_uniform_(a=sqrt(5))`, PyTorch's default.

    Example:
        >>> import jax, treemod.nn as nn
        >>> w = nn.init.pytorch_default(jax.random.key(0), (8, 4))
        >>> bool((abs(w) <= 0.5).all())
        True
    """
    return variance_scaling(1.0 / 3.0, "fan_in", "uniform")(key, shape, dtype)


def orthogonal(scale: float = 1.0, column_axis: int = -1) -> Initializer:
    """An initialiser giving a (semi-)orthogonal matrix times `scale` (`torch.nn.init.orthogonal_`).

    The shape is flattened to a matrix `(shape[0], prod(shape[1:]))` (PyTorch's convention);
    its rows (or columns, whichever are fewer) are orthonormal.

    Arguments:
        scale: a multiplier (PyTorch's `gain`).
        column_axis: unused, kept for signature compatibility with `jax.nn.initializers`.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn
        >>> q = nn.init.orthogonal()(jax.random.key(0), (3, 3))
        >>> bool(jnp.allclose(q @ q.T, jnp.eye(3), atol=1e-5))
        True
    """

    def init(key: _PRNGKeyArray, shape: _Sequence[int], dtype: _DType = _jnp.float32) -> _Array:
        shape = tuple(shape)
        if len(shape) < 2:
            raise ValueError(f"init.orthogonal needs a shape with at least 2 dims; got {shape}.")
        rows, cols = shape[0], _math.prod(shape[1:])
        a = _draw("orthogonal", _normal, key, (max(rows, cols), min(rows, cols)), dtype)
        q, r = _jnp.linalg.qr(a)
        q = q * _jnp.sign(_jnp.diagonal(r))[None, :]  # a unit phase for complex
        if rows < cols:
            q = q.T
        return (q.reshape(shape) * scale).astype(dtype)

    return init
