"""Activation sharding by logical name: `axis_rules` (the active mesh and rule table) and
`constrain` (`jax.lax.with_sharding_constraint` through them).

The rules are read when a function is traced, as `jax.sharding.use_mesh` is: trace (call a new
`filter_jit` wrapper, or the first call of one) inside `with tm.axis_rules(mesh, rules):`.
Without active rules `constrain` returns its input and traces nothing, so layers call it
unconditionally: `nn.Stack` on the hidden state it carries between layers, the zoo's `attend`
on the heads axis of queries, keys and values.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from jax.lax import with_sharding_constraint
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec, reshard

from treemod._sharding.axes import AxisNames
from treemod._sharding.rules import MeshAxes, Rules, check_rules, mesh_axes

__all__ = ["active_axis_rules", "axis_rules", "constrain", "constrain_hidden"]

X = TypeVar("X")
# (mesh, rules, whether the mesh has explicit axes: `reshard` rather than a constraint)
_ACTIVE: contextvars.ContextVar[tuple[Mesh, Rules, bool] | None] = contextvars.ContextVar(
    "treemod_axis_rules", default=None
)


@contextlib.contextmanager
def axis_rules(mesh: Mesh, rules: Rules) -> Iterator[None]:
    """Make `mesh` and `rules` the ones `constrain` uses while tracing, inside the block.

    Arguments:
        mesh: the device mesh.
        rules: the rule table (`tm.fsdp_rules()`, `tm.tensor_parallel_rules()`, ...), as for
            `tm.shard`; activations are split by its `(name, mesh axes)` rules.

    Returns:
        A context manager (also a decorator). Functions traced inside it constrain their
        activations; a `filter_jit` function traced before keeps its compiled program. A mesh
        of explicit axes (`jax.make_mesh`'s default) is also set as `jax.set_mesh` does.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> mesh = jax.make_mesh((8,), ("data",))
        >>> with tm.axis_rules(mesh, tm.fsdp_rules()):
        ...     y = jax.jit(lambda x: tm.constrain(x * 2, ("batch", "embed")))(jnp.ones((8, 4)))
        >>> y.sharding.spec[0]
        'data'
    """
    check_rules(rules, mesh)
    explicit = any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ()))
    token = _ACTIVE.set((mesh, tuple(rules), explicit))
    try:
        # Explicit axes need the mesh set for tracing, as `jax.set_mesh` does.
        with jax.set_mesh(mesh) if explicit else contextlib.nullcontext():
            yield
    finally:
        _ACTIVE.reset(token)


def active_axis_rules() -> tuple[Mesh, Rules] | None:
    """The `(mesh, rules)` of the innermost `axis_rules` block, or `None` outside any."""
    active = _ACTIVE.get()
    return None if active is None else active[:2]


def activation_spec(shape: tuple[int, ...], names: AxisNames, mesh: Mesh, rules: Rules) -> Any:
    """The `PartitionSpec` of an activation: each named dimension takes the first rule of its
    name whose mesh axes are still free and divide it; otherwise it stays whole (activations
    change shape with the batch, so an indivisible one is not an error)."""
    used: set[str] = set()
    spec: list[MeshAxes] = []
    for size, name in zip(shape, names, strict=False):
        chosen: MeshAxes = None
        for rule_name, target in rules:
            if rule_name != name or isinstance(target, PartitionSpec):
                continue
            axes = mesh_axes(target)
            if used.intersection(axes) or size % math.prod(mesh.shape[a] for a in axes):
                continue
            chosen = target
            used.update(axes)
            break
        spec.append(chosen)
    return PartitionSpec(*spec)


def constrain(x: X, names: AxisNames) -> X:
    """Constrain an activation's sharding by the logical names of its dimensions.

    Inside `axis_rules(mesh, rules)`, `jax.lax.with_sharding_constraint(x, spec)` with the
    spec the rule table gives `names` (a dimension whose rules do not divide it, or that
    nothing names, is not split; on a mesh of explicit axes, `jax.sharding.reshard`);
    outside, `x` itself, with nothing traced.

    Arguments:
        x: an array.
        names: one logical name (or `None`) per dimension, e.g. `("batch", "seq", "embed")`.

    Returns:
        `x`, constrained.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> x = jnp.ones((2, 3))
        >>> tm.constrain(x, ("batch", "embed")) is x  # no rules active
        True
    """
    active = _ACTIVE.get()
    if active is None:
        return x
    mesh, rules, explicit = active
    array: Any = x
    sharding = NamedSharding(mesh, activation_spec(tuple(jnp.shape(array)), names, mesh, rules))
    # A mesh of explicit axes (`jax.make_mesh`'s default) takes `reshard`, not a constraint.
    out: X = reshard(array, sharding) if explicit else with_sharding_constraint(array, sharding)
    return out


def constrain_hidden(carry: X) -> X:
    """Constrain the hidden state of a layer stack's carry: its first array leaf, when it is a
    float array of 2 or more dimensions, as `("batch", "seq", "embed")` (`("batch", "embed")`
    in 2-D; batch and channels beyond 3-D); other leaves (layer indices, caches) unchanged.

    Arguments:
        carry: the carry (an array, or a tuple whose first leaf is the hidden state).

    Returns:
        The carry, its hidden state constrained (unchanged outside `axis_rules`).
    """
    if _ACTIVE.get() is None:
        return carry
    leaves, treedef = jax.tree.flatten(carry)
    if not leaves:
        return carry
    first = leaves[0]
    ndim = jnp.ndim(first)
    if ndim < 2 or not jnp.issubdtype(jnp.result_type(first), jnp.inexact):
        return carry
    names: AxisNames = (
        ("batch", "embed")
        if ndim == 2
        else ("batch", "seq", "embed")
        if ndim == 3
        else ("batch",) + (None,) * (ndim - 1)
    )
    leaves[0] = constrain(first, names)
    out: X = jax.tree.unflatten(treedef, leaves)
    return out
