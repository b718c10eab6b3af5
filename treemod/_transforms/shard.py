"""`filter_shard`: place (or constrain) the arrays of a pytree on devices, leaving the rest."""

from __future__ import annotations

from typing import Any

import jax
import jax.tree_util as jtu

from treemod._tree.filters import IS_ARRAY_TYPE

__all__ = ["filter_shard"]


def _is_placement(x: Any) -> bool:
    return x is None or isinstance(x, jax.sharding.Sharding | jax.Device)


def _shard_leaf(x: Any, placement: Any) -> Any:
    if placement is None or not IS_ARRAY_TYPE[type(x)]:
        return x
    if isinstance(x, jax.core.Tracer):
        if isinstance(placement, jax.Device):
            placement = jax.sharding.SingleDeviceSharding(placement)
        return jax.lax.with_sharding_constraint(x, placement)
    return jax.device_put(x, placement)


def filter_shard(x: Any, device_or_shardings: Any) -> Any:
    """Shard the array leaves of a pytree; every other leaf is returned unchanged.

    Inside `filter_jit` (on traced arrays) it is `jax.lax.with_sharding_constraint`; outside,
    it is `jax.device_put`. Use it to replicate a model and split a batch across devices for
    data parallelism; `filter_jit` then runs the step on every device and keeps the shardings.

    Arguments:
        x: any pytree (a model, a batch, ...).
        device_or_shardings: a `jax.sharding.Sharding` or `jax.Device` for all arrays, or a
            pytree prefix of `x` with one at each leaf (`None` leaves that part alone).

    Returns:
        `x` with its arrays sharded.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np, treemod as tm
        >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()), ("batch",))
        >>> n = len(jax.devices())
        >>> batch = tm.filter_shard({"x": jnp.ones((n, 2)), "tag": "train"},
        ...                         NamedSharding(mesh, P("batch")))
        >>> len(batch["x"].sharding.device_set) == n, batch["tag"]
        (True, 'train')
    """
    if _is_placement(device_or_shardings):
        return jtu.tree_map(lambda leaf: _shard_leaf(leaf, device_or_shardings), x)
    try:
        return jtu.tree_map(
            lambda placement, sub: jtu.tree_map(lambda leaf: _shard_leaf(leaf, placement), sub),
            device_or_shardings,
            x,
            is_leaf=_is_placement,
        )
    except ValueError as e:
        raise ValueError(
            "filter_shard: device_or_shardings must be a Sharding, a Device, or a pytree prefix "
            f"of x with one at each leaf: {e}"
        ) from None
