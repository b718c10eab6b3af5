"""Leaf predicates and the filter / partition / combine trio.

This is the lowest layer of treemod: it imports only JAX and NumPy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np

__all__ = [
    "FilterSpecError",
    "is_array",
    "is_array_like",
    "is_inexact_array",
    "is_inexact_array_like",
    "filter",
    "partition",
    "combine",
]

# Tracers are `jax.Array` instances only through `__instancecheck__` (not subclasses), so the
# type cache below must name `Tracer` itself or every leaf inside `jit`/`vmap`/`grad` misses.
_ARRAY_TYPES = (jax.Array, jax.core.Tracer, np.ndarray, np.generic)
# What the public predicates accept: the arrays, and `jax.ShapeDtypeStruct`, the abstract leaf
# that `jax.eval_shape` puts where an array will be (so `filter(skeleton, is_param)` keeps them).
_ARRAY_OR_ABSTRACT_TYPES = (*_ARRAY_TYPES, jax.ShapeDtypeStruct)


class _TypeIsArray(dict[type, bool]):
    """Maps a type to whether its instances are arrays (of `kinds`); filled lazily.

    `map(IS_ARRAY_TYPE.__getitem__, map(type, leaves))` classifies a list of leaves at C speed,
    which is what keeps `filter_jit` close to `jax.jit` per call.
    """

    def __init__(self, kinds: tuple[type, ...]) -> None:
        super().__init__()
        self.kinds = kinds

    def __missing__(self, cls: type) -> bool:
        value = issubclass(cls, self.kinds)
        self[cls] = value
        return value


# Concrete arrays and tracers only: the transforms split leaves with it (what gets traced).
IS_ARRAY_TYPE = _TypeIsArray(_ARRAY_TYPES)
# The same, with abstract arrays too: the public predicates use it (one lookup either way).
_IS_ARRAY_OR_ABSTRACT_TYPE = _TypeIsArray(_ARRAY_OR_ABSTRACT_TYPES)


# What the transforms differentiate, trace and warn about: arrays with values (tracers
# included), never a `jax.ShapeDtypeStruct`, which they keep static as Equinox's do. Internal:
# the public predicates below also accept abstract leaves, for filtering skeletons.
def is_traceable_array(element: Any) -> bool:
    """Whether `element` is an array with values, which the transforms trace: a `jax.Array`
    (tracers included), `np.ndarray` or `np.generic`; never a `jax.ShapeDtypeStruct`.

    The transforms' one meaning of "array" (`IS_ARRAY_TYPE` per type, for their hot paths);
    `is_array` is the public predicates' (abstract leaves too).
    """
    return IS_ARRAY_TYPE[type(element)]


def is_inexact_traceable_array(element: Any) -> bool:
    """`is_traceable_array` of a floating-point or complex dtype: what transforms differentiate."""
    return IS_ARRAY_TYPE[type(element)] and bool(
        jax.numpy.issubdtype(element.dtype, jax.numpy.inexact)
    )


def is_inexact_traceable_array_like(element: Any) -> bool:
    """`is_inexact_traceable_array`, or a Python `float`/`complex` (or `__jax_array__` object)."""
    if IS_ARRAY_TYPE[type(element)]:
        return bool(jax.numpy.issubdtype(element.dtype, jax.numpy.inexact))
    if hasattr(element, "__jax_array__"):
        return is_inexact_traceable_array(element.__jax_array__())
    return isinstance(element, float | complex)


def is_array(element: Any) -> bool:
    """Whether `element` is a JAX or NumPy array (NumPy scalars such as `np.float32(1)` count).

    A `jax.ShapeDtypeStruct` (what `jax.eval_shape` returns in place of an array) counts as
    the array it stands for, so predicates and filters work the same on an abstract skeleton.
    This is the one meaning of the public predicates (`is_array`, `is_inexact_array`,
    `is_array_like`, `is_inexact_array_like`, and `is_param` built on them). The transforms
    split leaves by another one, arrays with values (`is_traceable_array`): they treat a
    `jax.ShapeDtypeStruct` as a static value, as Equinox's do (`filter_jit` does not trace it,
    the derivatives do not differentiate it); `treemod.compat.equinox.is_array` is Equinox's,
    which refuses it. The page "Filtered transforms and retracing" tabulates the three.

    Arguments:
        element: any Python object.

    Returns:
        `True` for `jax.Array` (tracers included), `np.ndarray`, `np.generic` and
        `jax.ShapeDtypeStruct`.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> tm.is_array(jnp.zeros(3)), tm.is_array(1.0)
        (True, False)
        >>> tm.is_array(jax.ShapeDtypeStruct((3,), jnp.float32))
        True
    """
    return _IS_ARRAY_OR_ABSTRACT_TYPE[type(element)]


def is_inexact_array(element: Any) -> bool:
    """Whether `element` is an array with a floating-point or complex dtype.

    These are the leaves that `filter_grad` differentiates. A `jax.ShapeDtypeStruct` counts
    by its dtype, as `is_array` says.

    Arguments:
        element: any Python object.

    Returns:
        `True` for arrays (or abstract arrays) of a floating-point or complex dtype.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> tm.is_inexact_array(jnp.zeros(3)), tm.is_inexact_array(jnp.arange(3))
        (True, False)
    """
    return _IS_ARRAY_OR_ABSTRACT_TYPE[type(element)] and bool(
        jax.numpy.issubdtype(element.dtype, jax.numpy.inexact)
    )


def is_inexact_array_like(element: Any) -> bool:
    """Whether `element` is an inexact array or a Python `float`/`complex`.

    An object with a `__jax_array__` method is judged by the array it converts to.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> tuple(tm.is_inexact_array_like(x) for x in (1.5, 1, jnp.ones(2), jnp.arange(2)))
        (True, False, True, False)
    """
    if _IS_ARRAY_OR_ABSTRACT_TYPE[type(element)]:
        return bool(jax.numpy.issubdtype(element.dtype, jax.numpy.inexact))
    if hasattr(element, "__jax_array__"):
        return is_inexact_array(element.__jax_array__())
    return isinstance(element, float | complex)


def is_array_like(element: Any) -> bool:
    """Whether `element` can become an array: arrays, Python `bool`/`int`/`float`/`complex`, and
    objects with a `__jax_array__` method (which JAX converts).

    Example:
        >>> import treemod as tm
        >>> tm.is_array_like(1.5), tm.is_array_like("a")
        (True, False)
    """
    return (
        _IS_ARRAY_OR_ABSTRACT_TYPE[type(element)]
        or isinstance(element, bool | int | float | complex)
        or hasattr(element, "__jax_array__")
    )


class FilterSpecError(TypeError):
    """A filter_spec leaf that is neither a bool nor a predicate (raised by `filter` and
    `partition`)."""


def _with_predicate_leaves(
    is_leaf: Callable[[Any], bool] | None, predicate: Callable[[Any], bool]
) -> Callable[[Any], bool] | None:
    """Combine `is_leaf` with the subtrees a predicate wants to judge whole.

    A predicate may carry an `is_leaf` attribute of its own (`is_param` does: it looks at
    `State` nodes as a whole), so `filter(model, is_param)` needs no extra argument.
    """
    own: Callable[[Any], bool] | None = getattr(predicate, "is_leaf", None)
    if own is None:
        return is_leaf
    if is_leaf is None:
        return own
    return lambda x: own(x) or is_leaf(x)


def _spec_mask(tree: Any, filter_spec: Any, is_leaf: Callable[[Any], bool] | None) -> Any:
    """A tree of booleans (one per leaf of `tree`) from a predicate or a prefix tree of them."""

    def expand(spec: Any, subtree: Any) -> Any:
        if isinstance(spec, bool):
            return jtu.tree_map(lambda _: spec, subtree, is_leaf=is_leaf)
        if callable(spec):
            stop = _with_predicate_leaves(is_leaf, spec)
            return jtu.tree_map(lambda x: bool(spec(x)), subtree, is_leaf=stop)
        if isinstance(spec, jax.core.Tracer):
            raise FilterSpecError(
                "filter_spec leaves must be bools or predicates; got a traced array. A filter "
                "decides the tree's structure, so it cannot depend on traced values: use Python "
                "bools (or compute the spec outside the transform)."
            )
        raise FilterSpecError(
            f"filter_spec leaves must be bools or predicates; got {type(spec).__name__}: {spec!r}"
        )

    try:
        return jtu.tree_map(expand, filter_spec, tree)
    except FilterSpecError:
        raise
    except ValueError as e:
        raise ValueError(f"filter_spec must be a prefix of the tree being filtered: {e}") from None


def filter(
    pytree: Any,
    filter_spec: Any,
    inverse: bool = False,
    replace: Any = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """Keep the leaves selected by `filter_spec`, replacing the others with `replace` (`None`).

    Arguments:
        pytree: any pytree.
        filter_spec: a predicate called on each leaf (such as `is_array`), a bool, or a pytree
            that is a prefix of `pytree` with predicates or bools at its leaves.
        inverse: keep the leaves that are *not* selected instead.
        replace: what unselected leaves become.
        is_leaf: as in `jax.tree_util`, to stop at chosen subtrees (they count as leaves).

    Returns:
        A pytree of the same structure as `pytree`.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> tm.filter([jnp.ones(2), "relu", 3], tm.is_array)
        [Array([1., 1.], dtype=float32), None, None]
    """
    mask = _spec_mask(pytree, filter_spec, is_leaf)
    keep = (lambda m, x: replace if m else x) if inverse else (lambda m, x: x if m else replace)
    return jtu.tree_map(keep, mask, pytree, is_leaf=is_leaf)


def partition(
    pytree: Any,
    filter_spec: Any,
    replace: Any = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> tuple[Any, Any]:
    """Split a pytree in two: the leaves selected by `filter_spec`, and all the others.

    Every leaf is in exactly one of the two halves; the other holds `replace` there.
    `combine` puts them back together.

    Arguments:
        pytree: any pytree.
        filter_spec: as in `filter`.
        replace: the placeholder left in each half.
        is_leaf: as in `jax.tree_util`.

    Returns:
        `(selected, rest)`.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> arrays, static = tm.partition([jnp.ones(2), "relu"], tm.is_array)
        >>> static
        [None, 'relu']
        >>> tm.combine(arrays, static)
        [Array([1., 1.], dtype=float32), 'relu']
    """
    mask = _spec_mask(pytree, filter_spec, is_leaf)
    left = jtu.tree_map(lambda m, x: x if m else replace, mask, pytree, is_leaf=is_leaf)
    right = jtu.tree_map(lambda m, x: replace if m else x, mask, pytree, is_leaf=is_leaf)
    return left, right


def _first_not_none(*xs: Any) -> Any:
    for x in xs:
        if x is not None:
            return x
    return None


def combine(*pytrees: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """Merge pytrees of the same structure, taking at each leaf the first value that is not `None`.

    The inverse of `partition`.

    Arguments:
        *pytrees: trees with the same structure, `None` marking holes.
        is_leaf: as in `jax.tree_util`.

    Returns:
        One pytree.

    Example:
        >>> import treemod as tm
        >>> tm.combine([1, None], [None, 2])
        [1, 2]
    """
    if not pytrees:
        raise TypeError("combine() needs at least one pytree")
    if is_leaf is None:
        leaf_or_none: Callable[[Any], bool] = lambda x: x is None
    else:
        leaf_or_none = lambda x: x is None or is_leaf(x)
    return jtu.tree_map(_first_not_none, *pytrees, is_leaf=leaf_or_none)
