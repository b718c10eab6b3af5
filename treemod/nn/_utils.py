"""Small helpers shared by the layers: default dtype, keys at call time, tuple arguments."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

COMPLEX_LAYERS = "Linear, Conv, ConvTranspose and Embedding"


def default_dtype(owner: str, dtype: Any, complex_ok: bool = False) -> Any:
    """`dtype`, or float32 when `None`; raises for other dtypes than floating (and complex, for
    the layers that allow it: a complex `Linear` computes what PyTorch's does)."""
    dtype = jnp.float32 if dtype is None else jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) or (
        complex_ok and jnp.issubdtype(dtype, jnp.complexfloating)
    ):
        return dtype
    allowed = "a floating or complex" if complex_ok else "a real floating"
    hint = "" if complex_ok else f" (complex parameters: {COMPLEX_LAYERS})"
    raise TypeError(
        f"{owner}: dtype must be {allowed} dtype, e.g. jnp.bfloat16{hint}; got {dtype}."
    )


def require_key(owner: str, key: Any) -> None:
    """Raise a clear error, naming the layer, when a constructor got no key, or something else
    than one PRNG key: a seed, a float array, a batch of keys, raw key data of the wrong shape."""
    if key is None:
        raise TypeError(
            f"{owner} needs a PRNG key to initialise its parameters: pass `key=jax.random.key(0)` "
            "(or a subkey, e.g. from `treemod.nn.KeySeq`)."
        )
    dtype = getattr(key, "dtype", None)
    typed = dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    if dtype is None or not (typed or dtype == np.uint32):
        what = f"an array of dtype {dtype}" if dtype is not None else repr(key)
        raise TypeError(
            f"{owner}: `key` must be a PRNG key, got {what}. Pass `key=jax.random.key(0)` "
            "(a seed becomes a key with jax.random.key(seed))."
        )
    shape = tuple(np.shape(key))
    if typed and shape != ():
        raise TypeError(
            f"{owner}: `key` must be one PRNG key, got an array of keys of shape {shape}. Pass "
            f"one of them (keys[0]); to build one {owner} per key, map the constructor: "
            f"treemod.filter_vmap(lambda k: {owner}(..., key=k))(keys)."
        )
    if not typed:
        impl = str(getattr(jax.config, "jax_default_prng_impl", "threefry2x32"))
        want = _raw_key_shape(impl)
        if shape != want:
            raise TypeError(
                f"{owner}: `key` is a uint32 array of shape {shape}, but raw key data of the "
                f"default PRNG ({impl}) has shape {want} (a batch of keys or another PRNG's "
                "data?). Pass one key, `key=jax.random.key(0)`."
            )


@functools.cache
def _raw_key_shape(impl: str) -> tuple[int, ...]:
    """The shape of one raw (uint32) key of the PRNG implementation `impl`."""
    return tuple(jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=impl))).shape)


def check_size(owner: str, name: str, value: Any, minimum: int = 1) -> int:
    """`value` if it is an int >= `minimum` (a size); else a `ValueError` naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        want = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        hint = " (a bool is not a size)" if isinstance(value, bool | np.bool_) else ""
        raise ValueError(f"{owner}: `{name}` must be {want}; got {value!r}{hint}.")
    return int(value)


def check_number(
    owner: str,
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    note: str = "",
) -> float:
    """`value` as a float if it is a real number (not a bool or a string) within the bounds.

    The numeric counterpart of `check_size`, for hyper-parameters that are not sizes:
    probabilities (`low=0, high=1`), `eps` (`low=0, low_open=True`), momentum, a base. NaN and
    infinities are refused; `note` is appended to the message (what the argument means).
    Raises a `ValueError` naming the layer and the argument, as `check_size` does.
    """
    if low is not None and high is not None:
        want = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
    elif low == 0 and low_open:
        want = "a positive number"
    elif low is not None:
        want = f"a number {'>' if low_open else '>='} {low:g}"
    else:
        want = "a finite number"
    number = isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )
    if number:
        v = float(value)
        low_ok = low is None or (v > low if low_open else v >= low)
        if np.isfinite(v) and low_ok and (high is None or v <= high):
            return v
    hint = ""
    if isinstance(value, bool | np.bool_):
        hint = " (a bool is not a number here)"
    elif isinstance(value, str):
        hint = f" (a str: pass the number itself, e.g. {name}={value.strip()})"
    elif not number:
        hint = f" (a {type(value).__name__})"
    raise ValueError(f"{owner}: `{name}` must be {want}; got {value!r}{hint}.{note}")


def check_padding(
    owner: str, padding: Any, n: int, strings: tuple[str, ...] = ()
) -> str | tuple[tuple[int, int], ...]:
    """`padding` as `(low, high)` pairs per spatial dimension, or one of `strings` (upper case).

    Takes an int, one int or `(low, high)` pair per spatial dimension (each an int >= 0: a
    bool, float or negative pad is refused, as PyTorch refuses them), or, where the layer
    allows strings, one of `strings` in any case (`"same"` and `"valid"` as PyTorch spells them).
    """
    if isinstance(padding, str):
        if padding.upper() in strings:
            return padding.upper()
        ints = f"an int or {n} ints / (low, high) pairs of ints >= 0"
        if not strings:
            raise ValueError(
                f"{owner}: `padding` must be {ints} (this layer takes no string padding); "
                f"got {padding!r}."
            )
        allowed = " or ".join(", ".join(repr(s) for s in strings).rsplit(", ", 1))
        raise ValueError(
            f"{owner}: string `padding` must be {allowed} (any case); got {padding!r}. Or pass "
            f"{ints}."
        )
    if not hasattr(padding, "__iter__"):
        pad = check_size(owner, "padding", padding, minimum=0)
        return ((pad, pad),) * n
    values = tuple(padding)
    if len(values) != n:
        strs = f", one of {', '.join(repr(s) for s in strings)}," if strings else ""
        raise ValueError(
            f"{owner}: `padding` must be an int{strs} or a sequence of {n} ints or (low, high) "
            f"pairs, one per spatial dimension; got {padding!r}."
        )
    out: list[tuple[int, int]] = []
    for i, p in enumerate(values):
        if isinstance(p, str) or not hasattr(p, "__iter__"):
            pad = check_size(owner, f"padding[{i}]", p, minimum=0)
            out.append((pad, pad))
            continue
        pair = tuple(p)
        if len(pair) != 2:
            raise ValueError(
                f"{owner}: `padding[{i}]` must be an int or a (low, high) pair; got {p!r}."
            )
        lo, hi = (check_size(owner, f"padding[{i}][{j}]", v, minimum=0) for j, v in enumerate(pair))
        out.append((lo, hi))
    return tuple(out)


def as_tuple(
    owner: str, name: str, value: int | Sequence[int], n: int, minimum: int = 1
) -> tuple[int, ...]:
    """Expand an int to an `n`-tuple, or check a sequence has length `n` (ints >= `minimum`)."""
    if isinstance(value, str) or not hasattr(value, "__iter__"):  # a size, or not one
        return (check_size(owner, name, value, minimum),) * n
    values = tuple(value)
    if len(values) != n:
        raise ValueError(
            f"{owner}: `{name}` must be an int or a sequence of {n} ints; got {value!r}."
        )
    return tuple(check_size(owner, f"{name}[{i}]", v, minimum) for i, v in enumerate(values))


@functools.cache
def _type_accepts_key(cls: type) -> bool:
    call = cls.__dict__.get("__call__") or next(
        (k.__dict__["__call__"] for k in cls.__mro__ if "__call__" in k.__dict__), None
    )
    if call is None:
        return False
    try:
        params = inspect.signature(call).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "key" or p.kind is p.VAR_KEYWORD for p in params)


def accepts_key(layer: Any) -> bool:
    """Whether `layer` is a module whose `__call__` takes a `key` keyword (decided per type)."""
    from treemod._module.module import Module

    return isinstance(layer, Module) and _type_accepts_key(type(layer))


def lead(a: ArrayLike, ndim: int) -> jax.Array:
    """Reshape `a` with leading ones to rank `ndim` (explicit broadcasting, no rank promotion).

    `lax.reshape` binds one primitive (and none when the rank is already `ndim`), which keeps
    the layers cheap to trace; `jnp.reshape` would stage a nested `jit` per call.
    """
    shape = tuple(np.shape(a))
    return lax.reshape(a, (1,) * (ndim - len(shape)) + shape)


def matmul_t(x: jax.Array, weight: jax.Array) -> jax.Array:
    """`x @ weight.T` for `x` of shape `(..., in)` and `weight` of shape `(out, in)`.

    One `dot_general` contracting the last axes, so tracing stages no transpose; inputs of
    different dtypes take `jnp.matmul`'s promotion rules instead.
    """
    if x.dtype != weight.dtype:
        return jnp.matmul(x, weight.T)
    return lax.dot_general(x, weight, (((x.ndim - 1,), (1,)), ((), ())))


def promote_input(x: Any, dtype: Any = None) -> Any:
    """`x` with integer and boolean arrays cast to `dtype` (the default float dtype if `None`).

    JAX's default promotion of an integer array against a float parameter: layers accept the
    integer inputs Equinox accepts and compute in floating point. Floating and complex inputs
    pass through unchanged.
    """
    dt = getattr(x, "dtype", None)
    if dt is None:
        x = jnp.asarray(x)
        dt = x.dtype
    if dt.kind in "iub":
        return x.astype(jnp.result_type(float) if dtype is None else dtype)
    return x


def compute_dtype(dtype: Any) -> Any:
    """The dtype to compute statistics in: at least float32 (without strict-promotion rules)."""
    return jnp.dtype(jnp.float32) if jnp.finfo(dtype).bits < 32 else jnp.dtype(dtype)


def with_spatial_dims(init: Any, num_spatial_dims: int) -> Any:
    """The `__init__` of a per-dimension layer (`Conv2d`, ...): `init` (the N-d layer's
    `__init__`) with its `num_spatial_dims` argument bound, and the remaining signature (for
    `inspect.signature`, IDEs and the API docs)."""
    sig = inspect.signature(init)
    params = list(sig.parameters.values())
    index = [p.name for p in params].index("num_spatial_dims") - 1  # its place after `self`

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) >= index:
            init(self, *args[:index], num_spatial_dims, *args[index:], **kwargs)
        else:  # the arguments before it were passed by keyword
            init(self, *args, num_spatial_dims=num_spatial_dims, **kwargs)

    # A function takes any attribute; `inspect.signature` reads this one.
    __init__.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[p for p in params if p.name != "num_spatial_dims"]
    )
    __init__.__module__ = init.__module__
    return __init__
