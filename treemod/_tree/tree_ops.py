"""Tree utilities: `tree_at`, `tree_equal`, `apply_updates`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from treemod._shapecheck.class_hooks import check_module_fields
from treemod._tree.filters import is_array

__all__ = ["tree_at", "tree_equal", "apply_updates"]

_SENTINEL = object()


class _Marker:
    """A unique stand-in for one node of the tree, so `where` can point at it by identity."""

    __slots__ = ()


def _one_level(node: Any) -> tuple[list[Any], Any]:
    """Flatten `node` by one level: its immediate children and its treedef."""
    return jtu.tree_flatten(node, is_leaf=lambda x: x is not node)


def _one_level_keys(node: Any) -> tuple[list[str], list[Any], Any]:
    """Like `_one_level`, with each child's key as a string (`.weight`, `[0]`, `['a']`)."""
    pairs, treedef = jtu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    return [jtu.keystr(p) for p, _ in pairs], [c for _, c in pairs], treedef


def _static_owner(node: Any) -> dict[int, str]:
    """Map ids of static-field values of a module to 'Class.field', for error messages."""
    names = getattr(type(node), "__tm_static_fields__", ())
    return {id(getattr(node, n)): f"{type(node).__qualname__}.{n}" for n in names}


def tree_at(
    where: Callable[[Any], Any],
    pytree: Any,
    replace: Any = _SENTINEL,
    replace_fn: Any = _SENTINEL,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """Return a copy of `pytree` with the node(s) that `where` selects replaced.

    Modules are immutable; this is how to "change" one. Untouched leaves keep their identity.

    Arguments:
        where: a function from the tree to one of its nodes (a leaf, a subtree, or `None`), or to
            a tuple/list of nodes, e.g. `lambda m: m.layers[0].weight`.
        pytree: the tree to copy.
        replace: the new value (a sequence of values, one per node, if `where` returns several).
        replace_fn: instead of `replace`, a function from the old node to the new one.
        is_leaf: as in `jax.tree_util`: subtrees it accepts are not looked into.

    Returns:
        The changed copy.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> tree = {"w": jnp.zeros(2), "b": None}
        >>> tm.tree_at(lambda t: t["b"], tree, jnp.ones(2))["b"]
        Array([1., 1.], dtype=float32)
        >>> tm.tree_at(lambda t: (t["w"], t["b"]), tree, replace_fn=lambda x: 7)
        {'b': 7, 'w': 7}
    """
    if (replace is _SENTINEL) == (replace_fn is _SENTINEL):
        raise ValueError("tree_at: pass exactly one of `replace` and `replace_fn`.")

    positions: dict[int, tuple[int, ...]] = {}
    paths: dict[tuple[int, ...], str] = {}
    statics: dict[int, str] = {}

    def mark(node: Any, pos: tuple[int, ...], path: str) -> Any:
        paths[pos] = path
        if is_leaf is not None and is_leaf(node):
            marked: Any = _Marker()
        else:
            keys, children, treedef = _one_level_keys(node)
            if (
                node is None
                or (treedef.num_nodes == 1 and treedef.num_leaves == 1)
                or (type(node) is tuple and not node)  # `()` is a singleton: no unique id
            ):
                marked = _Marker()
            else:
                statics.update(_static_owner(node))
                pairs = enumerate(zip(keys, children, strict=True))
                marked = treedef.unflatten([mark(c, pos + (i,), path + k) for i, (k, c) in pairs])
        positions[id(marked)] = pos
        return marked

    marked_tree = mark(pytree, (), "")
    selected = where(marked_tree)
    if id(selected) in positions:
        nodes, single = [selected], True
    elif isinstance(selected, tuple | list):
        nodes, single = list(selected), False
    else:
        nodes, single = [selected], True
    targets: list[tuple[int, ...]] = []
    for node in nodes:
        if id(node) not in positions:
            owner = statics.get(id(node))
            if owner is not None:
                raise ValueError(
                    f"tree_at: `where` selected {owner}, a static field. Static fields are part "
                    "of the tree structure, not nodes; build a new module instead."
                )
            raise ValueError(
                "tree_at: `where` returned something that is not a node of the tree "
                f"({type(node).__name__}). Return nodes reached by attribute or index access "
                "from the argument, e.g. `lambda m: m.layer.weight`."
            )
        targets.append(positions[id(node)])

    if single:
        new_values: Sequence[Any] | None = None if replace is _SENTINEL else [replace]
    elif replace is _SENTINEL:
        new_values = None
    else:
        if not isinstance(replace, Sequence) or len(replace) != len(targets):
            raise ValueError(
                f"tree_at: `where` selected {len(targets)} nodes, so `replace` must be a "
                f"sequence of {len(targets)} values."
            )
        new_values = list(replace)

    chosen: dict[tuple[int, ...], int] = {}
    for i, t in enumerate(targets):
        for other in chosen:
            if t != other and (t[: len(other)] == other or other[: len(t)] == t):
                outer, inner = (other, t) if len(other) < len(t) else (t, other)
                raise ValueError(
                    f"tree_at: `where` selected two nodes, one inside the other: "
                    f"{paths[outer] or 'the whole tree'} contains {paths[inner]}. Select only "
                    "one of them."
                )
        chosen[t] = i
    prefixes = {t[:k] for t in targets for k in range(len(t))}

    def rebuild(node: Any, pos: tuple[int, ...], check: bool) -> Any:
        if pos in chosen:
            i = chosen[pos]
            return replace_fn(node) if new_values is None else new_values[i]
        if pos not in prefixes:
            return node
        children, treedef = _one_level(node)
        # Below a module whose arrays carry an extra leading axis (`nn.Stack`), field
        # annotations describe one slice, so rebuilt descendants are not checked.
        inner_check = check and not getattr(type(node), "__tm_stacked_children__", False)
        new = treedef.unflatten(
            [rebuild(c, pos + (i,), inner_check) for i, c in enumerate(children)]
        )
        if check and hasattr(type(new), "__tm_static_fields__"):  # a Module: shape checks
            check_module_fields(new)
        return new

    return rebuild(pytree, (), True)


def _leaves_equal(x: Any, y: Any, rtol: float, atol: float, typematch: bool) -> Any:
    if typematch and type(x) is not type(y):
        return False
    if is_array(x) != is_array(y):
        return False
    if not is_array(x):
        return x == y
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # keys: equal bits, no tolerance
        x, y, rtol, atol = jax.random.key_data(x), jax.random.key_data(y), 0.0, 0.0
    if isinstance(x, jax.core.Tracer) or isinstance(y, jax.core.Tracer):
        if rtol == 0 and atol == 0:
            return jnp.all(x == y)
        return jnp.allclose(x, y, rtol=rtol, atol=atol)
    x, y = np.asarray(x), np.asarray(y)
    if rtol == 0 and atol == 0:
        return bool(np.array_equal(x, y))
    return bool(np.allclose(x, y, rtol=rtol, atol=atol))


def tree_equal(*pytrees: Any, typematch: bool = False, rtol: float = 0.0, atol: float = 0.0) -> Any:
    """Whether all `pytrees` have the same structure and equal leaves.

    Arrays must match in shape, dtype and values (within `rtol`/`atol` if given; typed PRNG
    keys by their bits, exactly); other leaves are compared with `==`.

    Arguments:
        *pytrees: the trees to compare.
        typematch: also require leaves to have the same type (`np.ndarray` and `jax.Array`
            leaves with equal values then differ).
        rtol: relative tolerance for array values.
        atol: absolute tolerance for array values.

    Returns:
        A Python `bool`, or a traced boolean scalar when called on tracers inside a transform.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> tm.tree_equal([jnp.ones(2), "a"], [jnp.ones(2), "a"])
        True
        >>> tm.tree_equal(jnp.ones(2), jnp.ones(2) + 1e-7, atol=1e-6)
        True
    """
    if not pytrees:
        raise TypeError("tree_equal() needs at least one pytree to compare.")
    first, *rest = pytrees
    leaves0, treedef0 = jtu.tree_flatten(first)
    result: Any = True
    for other in rest:
        leaves, treedef = jtu.tree_flatten(other)
        if treedef != treedef0:  # type: ignore[operator]
            return False
        for x, y in zip(leaves0, leaves, strict=True):
            eq = _leaves_equal(x, y, rtol, atol, typematch)
            if eq is False:
                return False
            if eq is not True:
                result = eq if result is True else result & eq
    return result


def apply_updates(model: Any, updates: Any) -> Any:
    """Add `updates` (e.g. from an optax optimiser) to the arrays of `model`.

    Leaves whose update is `None` (non-differentiated parts, state, static values) are kept.
    Each sum is taken in the wider of the two dtypes and returned in the parameter's dtype, as
    `optax.apply_updates` does: a bfloat16 model stays bfloat16 under float32 updates.

    Arguments:
        model: the model (any pytree).
        updates: a tree with the structure of `model`, `None` where there is nothing to add.

    Returns:
        The updated model.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> tm.apply_updates({"w": jnp.ones(2), "act": "relu"}, {"w": jnp.ones(2), "act": None})
        {'act': 'relu', 'w': Array([2., 2.], dtype=float32)}
    """
    return jtu.tree_map(_add, updates, model, is_leaf=lambda x: x is None)


def _add(update: Any, param: Any) -> Any:
    if update is None:
        return param
    if not hasattr(param, "dtype") or jnp.result_type(update) == param.dtype:
        return param + update
    with jax.numpy_dtype_promotion("standard"):  # mixing dtypes here is the point
        wide = jnp.promote_types(param.dtype, jnp.result_type(update))
    return (param.astype(wide) + jnp.asarray(update).astype(wide)).astype(param.dtype)
