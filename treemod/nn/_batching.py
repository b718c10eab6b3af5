"""The one rank-polymorphism mechanism shared by every layer.

A layer describes its computation for one unbatched example whose inputs have a known number of
"core" dimensions (`Linear`: one, `Conv2d`: three, ...). `batch_apply` accepts any number of
extra leading batch dimensions on top, flattens them into one, runs the layer once on the
flattened batch (with a kernel that takes a leading batch axis, such as a batched convolution),
and restores the batch shape. The result equals `jax.vmap` of the unbatched call, for any number
of batch dimensions.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax

# Whether no transform is tracing: eager layer calls take one compiled program.
from treemod._private_apis import trace_state_clean as _eager
from treemod._transforms.jit import filter_jit
from treemod._tree.filters import IS_ARRAY_TYPE

__all__ = ["Core", "batch_apply", "describe_shape"]

_R = TypeVar("_R")


class Core(NamedTuple):
    """One input of a layer: its name, value and core dimensions.

    `dims` names the core dimensions with their expected sizes (`None`: any size), e.g.
    `(("in_features", 3),)`. `dims=None` marks an input that is passed through unbatched.
    """

    name: str
    value: Any
    dims: tuple[tuple[str, int | None], ...] | None


def describe_shape(dims: Sequence[tuple[str, int | None]]) -> str:
    """`(*batch, in_features=3, length)` style description of expected core dims."""
    parts = ["*batch"] + [n if s is None else f"{n}={s}" for n, s in dims]
    return "(" + ", ".join(parts) + ")"


def _batch_shape(owner: str, inputs: Sequence[Core]) -> tuple[int, ...]:
    batch: tuple[int, ...] | None = None
    first = ""
    for name, x, dims in inputs:
        if dims is None or x is None:
            continue
        shape = tuple(np.shape(x))
        core = len(dims)
        ok = len(shape) >= core and all(
            s is None or shape[len(shape) - core + i] == s for i, (_, s) in enumerate(dims)
        )
        if not ok:
            raise ValueError(
                f"{owner}: `{name}` must have shape {describe_shape(dims)} (any number of leading "
                f"batch dimensions, including none); got shape {shape}."
            )
        b = shape[: len(shape) - core]
        if batch is None or (not batch and b):
            batch, first = b, name
        elif b and b != batch:
            raise ValueError(
                f"{owner}: `{name}` has batch dimensions {b} but `{first}` has {batch}; inputs "
                "must share their leading batch dimensions (or have none, to be broadcast)."
            )
    return () if batch is None else batch


def batch_apply(owner: str, method: Callable[..., _R], inputs: Sequence[Core]) -> _R:
    """Apply a layer's core computation to inputs with any number of leading batch dims.

    The core runs as its own cached, nested `filter_jit`. Layers with the same configuration
    and input shapes share it, so a deep model differentiates, transposes and lowers each
    distinct layer once rather than once per layer, and traces faster than the same code
    written inline. XLA inlines the nested calls, so the compiled program is essentially the
    inline one.

    Arguments:
        owner: the layer's class name, for error messages.
        method: the core, a method of the layer taking every batched input with exactly one
            leading batch axis (inputs without batch dimensions are broadcast to it; an
            unbatched example comes as a batch of one).
        inputs: one `Core` per positional argument of `method`.

    Returns:
        `method`'s output (any pytree of arrays) with the batch dimensions restored in front.
    """
    batch = _batch_shape(owner, inputs)
    n = math.prod(batch)
    ranks = tuple(None if dims is None else len(dims) for _, _, dims in inputs)
    values = [x for _, x, _ in inputs]
    arrays = all(x is None or IS_ARRAY_TYPE[type(x)] for x in values)
    if arrays and type(method) is types.MethodType and _eager():
        # An eager call: the reshapes, the core and the reshapes back are one compiled
        # program (one dispatch instead of three), cached per layer and input signature.
        # `method`'s own function, so the result has `method`'s type.
        eager: _R = _eager_apply(method.__func__, method.__self__, batch, n, ranks, values)
        return eager
    args = _to_rows(batch, n, ranks, values)
    core = filter_jit(method, explain_retraces=False)
    # Every layer of a class shares its core's cache (one version per shape and configuration,
    # as the eager cache below): many versions there are not a sign of retracing.
    core.cache.expect_many_versions()
    out = core(*args)
    # The reshapes keep the tree's structure and leaf types: the result has `method`'s type.
    restored: _R = jtu.tree_map(lambda o: lax.reshape(o, batch + o.shape[1:]), out)
    return restored


def _to_rows(
    batch: tuple[int, ...], n: int, ranks: tuple[int | None, ...], values: list[Any]
) -> list[Any]:
    """Each batched input with its batch dimensions flattened into one leading axis."""
    args: list[Any] = []
    for rank, x in zip(ranks, values, strict=True):
        if rank is None or x is None:
            args.append(x)
            continue
        core_shape = tuple(np.shape(x))[jnp.ndim(x) - rank :]
        # `lax` reshapes bind one primitive, or none when the shape is already right.
        if jnp.ndim(x) == rank:
            args.append(lax.broadcast(x, (n,)) if batch else lax.reshape(x, (1,) + core_shape))
        else:
            args.append(lax.reshape(x, (n,) + core_shape))
    return args


def _apply_rows(
    func: Callable[..., Any],
    layer: Any,
    batch: tuple[int, ...],
    n: int,
    ranks: tuple[int | None, ...],
    values: list[Any],
) -> Any:
    out = func(layer, *_to_rows(batch, n, ranks, values))
    return jtu.tree_map(lambda o: lax.reshape(o, batch + o.shape[1:]), out)


_eager_apply = filter_jit(_apply_rows, explain_retraces=False)
_eager_apply.cache.expect_many_versions()  # one cache for every layer configuration
