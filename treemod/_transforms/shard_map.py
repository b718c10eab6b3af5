"""`filter_shard_map`: `jax.shard_map` over any pytree (arrays split, other leaves static)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh

from treemod._transforms.wrapper import P, R
from treemod._tree.filters import combine, is_array, partition

__all__ = ["filter_shard_map"]


def filter_shard_map(
    fun: Callable[P, R], *, mesh: Mesh, in_specs: Any, out_specs: Any, check_vma: bool = True
) -> Callable[P, R]:
    """`jax.shard_map` over any pytree: each device runs `fun` on its blocks of the arrays.

    Arrays anywhere in the positional arguments (models included) are split by `in_specs`;
    every other leaf is passed unchanged to every device, and non-array leaves of the output
    are returned as they are.

    Arguments:
        fun: the per-device function (called with positional arguments only).
        mesh: the device mesh.
        in_specs: a `PartitionSpec` for all arrays, or a pytree prefix of the positional
            arguments (a tuple, one entry per argument) with a `PartitionSpec` at each leaf.
        out_specs: the same for the output.
        check_vma: `jax.shard_map`'s check that outputs replicated by `out_specs` are.

    Returns:
        The mapped function, with `fun`'s signature.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> from jax.sharding import PartitionSpec as P
        >>> mesh = jax.make_mesh((8,), ("data",), (jax.sharding.AxisType.Auto,))
        >>> total = tm.filter_shard_map(
        ...     lambda x, op: jax.lax.psum(op(x), "data"), mesh=mesh, in_specs=(P("data"), P()),
        ...     out_specs=P())
        >>> total(jnp.arange(16.0), jnp.sum)
        Array(120., dtype=float32)
    """
    if not callable(fun):
        raise TypeError(f"filter_shard_map expects a callable; got {type(fun).__name__}.")
    call: Callable[..., Any] = fun  # called with the rebuilt positional arguments

    def mapped(*args: P.args, **kwargs: P.kwargs) -> R:
        if kwargs:
            raise TypeError(
                f"filter_shard_map({getattr(fun, '__name__', fun)!r}): pass arguments "
                f"positionally (jax.shard_map has no keyword arguments); got {sorted(kwargs)}."
            )
        dynamic, static = partition(args, is_array)
        static_out: list[Any] = []

        def per_device(*dynamic_args: Any) -> Any:
            out = call(*combine(dynamic_args, static))
            out_dynamic, out_static = partition(out, is_array)
            static_out.append(out_static)
            return out_dynamic

        out = jax.shard_map(
            per_device, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma
        )(*dynamic)
        return combine(out, static_out[-1])  # type: ignore[no-any-return]

    return mapped
