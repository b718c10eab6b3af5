"""A fast path for the common jaxtyping array check, with jaxtyping's own check as the fallback.

`Float[Array, "out in"]`-style annotations (a JAX array type, fixed, named, broadcastable named
and anonymous dimensions, no variadic or symbolic ones) are checked here against the current
memo, binding dimensions exactly as jaxtyping does. Anything else, and every failure (so that
the reason comes from jaxtyping), goes to jaxtyping's `isinstance` machinery. The tests compare
the two on random annotations and shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jaxtyping._storage import get_shape_memo

from treemod._shapecheck.annotations import is_array_annotation

# dims: (kind, value, broadcastable) with kind 0 = anonymous, 1 = fixed size, 2 = named.
_Spec = tuple[frozenset[str] | None, tuple[tuple[int, Any, bool], ...]]


def compile_array_check(annotation: Any) -> _Spec | None:
    """Precompute a fast check for `annotation`, or `None` when it needs the general path."""
    if not is_array_annotation(annotation):
        return None
    if getattr(annotation, "_skip_instancecheck", False):
        return None
    if getattr(annotation, "array_type", None) is not jax.Array:
        return None
    if getattr(annotation, "index_variadic", 0) is not None:
        return None
    dtypes = getattr(annotation, "dtypes", None)
    if isinstance(dtypes, list | tuple):
        if not all(type(d) is str for d in dtypes):
            return None
        allowed: frozenset[str] | None = frozenset(dtypes)
    elif type(dtypes).__name__ == "_AnyDtype":
        allowed = None
    else:
        return None
    dims = []
    for dim in getattr(annotation, "dims", ()):
        kind = type(dim).__name__
        if kind == "_AnonymousDim":
            dims.append((0, None, False))
        elif kind == "_FixedDim":
            dims.append((1, dim.size, dim.broadcastable))
        elif kind == "_NamedDim" and not dim.treepath:
            dims.append((2, dim.name, dim.broadcastable))
        else:
            return None
    return allowed, tuple(dims)


def fast_array_check(spec: _Spec, value: Any) -> bool:
    """`True` if `value` matches (its new dimensions are then bound in the current memo).

    `False` means "not decided here": the caller runs jaxtyping's check, which gives the reason.
    """
    if not isinstance(value, jax.Array):
        return False
    allowed, dims = spec
    if allowed is not None and value.dtype.type.__name__ not in allowed:
        return False
    shape = value.shape
    if len(shape) != len(dims):
        return False
    single = get_shape_memo()[0]
    new: dict[str, int] = {}
    for (kind, want, broadcastable), size in zip(dims, shape, strict=True):
        if kind == 0 or (broadcastable and size == 1):
            continue
        if kind == 1:
            if size != want:
                return False
            continue
        bound = single.get(want, new.get(want))
        if bound is None:
            new[want] = size
        elif bound != size:
            return False
    if new:
        single.update(new)
    return True


def array_checker(annotation: Any) -> Callable[[Any], bool] | None:
    """A one-argument fast check for `annotation`, or `None`."""
    spec = compile_array_check(annotation)
    if spec is None:
        return None
    return lambda value: fast_array_check(spec, value)
