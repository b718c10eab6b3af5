"""A fast path for the common jaxtyping array check, with jaxtyping's own check as the fallback.

`Float[Array, "out in"]`-style annotations (a JAX array type, fixed, named, broadcastable named
and anonymous dimensions, no variadic or symbolic ones) are checked here against the current
memo, binding dimensions exactly as jaxtyping does. Anything else, and every failure (so that
the reason comes from jaxtyping), goes to jaxtyping's `isinstance` machinery. The tests compare
the two on random annotations and shapes.
"""

from __future__ import annotations

import inspect
import types
import typing
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax

from treemod._private_apis import get_shape_memo
from treemod._shapecheck.annotations import is_array_annotation
from treemod._tree.filters import IS_ARRAY_TYPE

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


# ------------------------------------------------------------------ per-signature call cache
#
# A checked call whose annotations are all plain array annotations (or unions of them with
# None) passes or fails according to the type, shape and dtype of each checked value alone.
# `call_key` gives that signature; a signature whose checks passed once is remembered (with the
# dimensions it bound), so later calls with it skip the checks. Failures are never remembered:
# every check that fires on a new signature still fires, with jaxtyping's reason.

_UNCACHEABLE = object()
_ABSENT = object()  # an optional argument that was not passed (its default is not checked)
_DIM_KINDS = frozenset({"_AnonymousDim", "_FixedDim", "_AnonymousVariadicDim"})
_NAMED_KINDS = frozenset({"_NamedDim", "_NamedVariadicDim"})
_UNIONS = (typing.Union, types.UnionType)
# At most this many remembered signatures per checked function (then it starts afresh).
MAX_SIGNATURES = 256


def cacheable(annotation: Any) -> bool:
    """Whether `annotation`'s check depends only on the type, shape and dtype of the value."""
    if annotation is None or annotation is type(None):
        return True
    if typing.get_origin(annotation) in _UNIONS:
        return all(cacheable(a) for a in typing.get_args(annotation))
    if not is_array_annotation(annotation) or getattr(annotation, "_skip_instancecheck", False):
        return False
    for dim in getattr(annotation, "dims", ()):
        kind = type(dim).__name__
        if kind in _DIM_KINDS or (kind in _NAMED_KINDS and not dim.treepath):
            continue
        return False  # symbolic dimensions, tree paths: they read more than the shape
    return True


def call_plan(
    signature: inspect.Signature, params: Sequence[Any], ret: Any
) -> tuple[tuple[str, int | None], ...] | None:
    """Where each checked parameter is found in a call (`(name, position)`), or `None` when the
    call cannot be cached (`*args`/`**kwargs` entries, annotations that read more than shapes)."""
    if ret is not None and not cacheable(ret.annotation):
        return None
    positions = {
        name: i
        for i, (name, p) in enumerate(signature.parameters.items())
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    }
    plan = []
    for entry in params:
        if entry.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            return None
        if not cacheable(entry.annotation):
            return None
        plan.append((entry.name, positions.get(entry.name)))
    return tuple(plan)


def value_sig(value: Any) -> Any:
    """What a cacheable check reads of `value`: `None`, or `(type, shape, dtype)` of an array."""
    if value is None:
        return None
    t = type(value)
    if IS_ARRAY_TYPE[t]:
        return (t, value.shape, value.dtype)
    return _UNCACHEABLE


_FIELD_NAMES: weakref.WeakKeyDictionary[type, tuple[str, ...] | None] = weakref.WeakKeyDictionary()


def cacheable_fields(owner: type, spec: Sequence[Any]) -> tuple[str, ...] | None:
    """The names of `owner`'s checked fields, or `None` if one of them cannot be cached."""
    try:
        return _FIELD_NAMES[owner]
    except KeyError:
        pass
    names = tuple(e.name for e in spec) if all(cacheable(e.annotation) for e in spec) else None
    _FIELD_NAMES[owner] = names
    return names


def call_key(
    plan: tuple[tuple[str, int | None], ...],
    owner: type | None,
    fields: tuple[str, ...],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[Any, ...] | None:
    """The signature of a call for the check cache, or `None` when it cannot be cached."""
    sigs: list[Any] = []
    if fields:
        values = args[0].__dict__
        for name in fields:
            sig = value_sig(values.get(name))
            if sig is _UNCACHEABLE:
                return None
            sigs.append(sig)
    n = len(args)
    for name, index in plan:
        if index is not None and index < n:
            sig = value_sig(args[index])
        elif name in kwargs:
            sig = value_sig(kwargs[name])
        else:
            sig = _ABSENT
        if sig is _UNCACHEABLE:
            return None
        sigs.append(sig)
    return (owner, tuple(sigs))


def return_key(key: Any, out: Any) -> Any:
    """The key of a return value's check under the call signature `key`, or `None`."""
    sig = value_sig(out)
    return None if sig is _UNCACHEABLE else (key, sig)


def remember(passed: dict[Any, Any], key: Any, value: Any) -> None:
    """Record a signature that passed, starting afresh past `MAX_SIGNATURES`."""
    if len(passed) >= MAX_SIGNATURES:
        passed.clear()
    passed[key] = value
