"""The one rank-polymorphism mechanism shared by every layer.

A layer describes its computation for one unbatched example whose inputs have a known number of
"core" dimensions (`Linear`: one, `Conv2d`: three, ...). `batch_apply` accepts any number of
extra leading batch dimensions on top, flattens them into one, runs the layer once on the
flattened batch (either `jax.vmap` of the unbatched function, or a kernel that already takes a
leading batch axis, such as a batched convolution), and restores the batch shape. The result
equals `jax.vmap` of the unbatched call, for any number of batch dimensions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax

__all__ = ["Core", "batch_apply", "describe_shape"]


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
        shape = tuple(jnp.shape(x))
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


def batch_apply(
    owner: str,
    fn: Callable[..., Any],
    inputs: Sequence[Core],
    *,
    vectorised: bool = False,
) -> Any:
    """Apply a layer's per-example `fn` to inputs with any number of leading batch dims.

    Arguments:
        owner: the layer's class name, for error messages.
        fn: the computation; takes the input values positionally.
        inputs: one `Core` per positional argument of `fn`.
        vectorised: if `False`, `fn` handles one unbatched example and is `jax.vmap`-ed over
            the flattened batch. If `True`, `fn` takes every batched input with exactly one
            leading batch axis (inputs without batch dimensions are broadcast to it) and is
            called once, also for an unbatched example (with a batch of one).

    Returns:
        `fn`'s output (any pytree of arrays) with the batch dimensions restored in front.
    """
    batch = _batch_shape(owner, inputs)
    values = [c.value for c in inputs]
    if not batch and not vectorised:
        return fn(*values)
    n = math.prod(batch)
    args: list[Any] = []
    axes: list[int | None] = []
    for _, x, dims in inputs:
        if dims is None or x is None:
            args.append(x)
            axes.append(None)
            continue
        core_shape = tuple(jnp.shape(x))[jnp.ndim(x) - len(dims) :]
        # `lax` reshapes bind one primitive, or none when the shape is already right.
        if jnp.ndim(x) == len(dims):
            if vectorised:
                args.append(lax.broadcast(x, (n,)) if batch else lax.reshape(x, (1,) + core_shape))
                axes.append(0)
            else:
                args.append(x)
                axes.append(None)
        else:
            args.append(lax.reshape(x, (n,) + core_shape))
            axes.append(0)
    out = fn(*args) if vectorised else jax.vmap(fn, in_axes=tuple(axes))(*args)
    return jtu.tree_map(lambda o: lax.reshape(o, batch + o.shape[1:]), out)
