"""Reading jaxtyping annotations: which ones to check, their dimension names, how to print them.

This file imports only the standard library and NumPy, so the bottom-layer hook can use it while
classes are being created. It never imports jaxtyping: it reads jaxtyping's types from
`sys.modules` once jaxtyping has been imported by someone else. Until then no annotation can
be a jaxtyping one, so `contains_jaxtyping` answers `False` without looking further.
"""

from __future__ import annotations

import re
import sys
import types
import typing
from collections.abc import Callable
from typing import Any

import numpy as np

_UNION_TYPES = (typing.Union, types.UnionType)
# A string annotation that fails to resolve is reported (not skipped) when it looks like a
# jaxtyping array annotation: a subscript holding a quoted dimension string.
_LOOKS_JAXTYPED = re.compile(r"\[[^\]]*['\"]")


class UnresolvedAnnotation(Exception):
    """A string annotation whose names could not be found."""


# jaxtyping's (module, AbstractArray, the metaclass of PyTree[...]), once jaxtyping is imported.
_JAXTYPING: tuple[Any, Any, Any] | None = None


def _jaxtyping() -> tuple[Any, Any, Any] | None:
    """jaxtyping's types if it has been imported (by anyone), else `None`; never imports it."""
    global _JAXTYPING
    if _JAXTYPING is None:
        module = sys.modules.get("jaxtyping")
        if module is None or not hasattr(module, "PyTree"):  # absent, or still importing
            return None
        _JAXTYPING = (module, module.AbstractArray, type(module.PyTree[int]))
    return _JAXTYPING


def is_array_annotation(ann: Any) -> bool:
    """Whether `ann` is a jaxtyping array type such as `Float[Array, "n"]`."""
    found = _JAXTYPING or _jaxtyping()
    if found is None:
        return False
    abstract = found[1]
    return isinstance(ann, type) and issubclass(ann, abstract) and ann is not abstract


def contains_jaxtyping(ann: Any, _depth: int = 0) -> bool:
    """Whether `ann` is, or contains, a jaxtyping array or `PyTree[...]` annotation.

    `False` while jaxtyping has not been imported: no annotation can then be one of its types.
    """
    found = _JAXTYPING or _jaxtyping()
    if found is None or _depth > 20 or isinstance(ann, str | typing.ForwardRef):
        return False
    if is_array_annotation(ann):
        return True
    if isinstance(ann, found[2]) and ann is not found[0].PyTree:
        return True
    return any(contains_jaxtyping(a, _depth + 1) for a in typing.get_args(ann))


def dim_names(ann: Any, _depth: int = 0) -> tuple[str, ...]:
    """The named dimensions an annotation mentions, in order (variadic ones with a `*`)."""
    if _depth > 20:
        return ()
    if is_array_annotation(ann):
        names = []
        for dim in getattr(ann, "dims", ()):
            name = getattr(dim, "name", None)
            if isinstance(name, str):
                variadic = type(dim).__name__ == "_NamedVariadicDim"
                name = "*" + name if variadic else name
                if name not in names:
                    names.append(name)
        return tuple(names)
    out: list[str] = []
    for a in typing.get_args(ann):
        out.extend(n for n in dim_names(a, _depth + 1) if n not in out)
    return tuple(out)


def _array_type_name(array_type: Any) -> str:
    if array_type is Any:
        return "Any"
    if array_type is np.ndarray:
        return "np.ndarray"
    found = _JAXTYPING or _jaxtyping()
    if found is not None and array_type is found[0].Array:
        return "Array"
    name = str(getattr(array_type, "__name__", repr(array_type)))
    return name.rsplit(".", 1)[-1]


def format_annotation(ann: Any, _depth: int = 0) -> str:
    """Print an annotation the way it is written: `Float[Array, 'out in'] | None`."""
    if _depth > 20:
        return "..."
    if ann is None or ann is type(None):
        return "None"
    if is_array_annotation(ann):
        dtype = getattr(getattr(ann, "dtype", None), "__name__", "Shaped")
        array_type = _array_type_name(getattr(ann, "array_type", Any))
        dims = " ".join(str(getattr(ann, "dim_str", "")).split())
        return f"{dtype}[{array_type}, {dims!r}]"
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin in _UNION_TYPES:
        return " | ".join(format_annotation(a, _depth + 1) for a in args)
    if origin is typing.Annotated:
        return format_annotation(args[0], _depth + 1)
    found = _JAXTYPING or _jaxtyping()
    if found is not None and isinstance(ann, found[2]):
        leaf = format_annotation(getattr(ann, "leaftype", Any), _depth + 1)
        structure = getattr(ann, "structure", None)
        return f"PyTree[{leaf}{'' if structure is None else f', {structure!r}'}]"
    if origin is not None and args:
        name = getattr(origin, "__name__", repr(origin))
        inner = ", ".join(
            "..." if a is Ellipsis else format_annotation(a, _depth + 1) for a in args
        )
        return f"{name}[{inner}]"
    if isinstance(ann, type):
        return ann.__qualname__
    return repr(ann)


def resolve_annotation(ann: Any, globalns: dict[str, Any], localns: dict[str, Any]) -> Any:
    """Evaluate a string annotation; raise `UnresolvedAnnotation` if it looks jaxtyped and fails.

    Returns `None` for an unresolvable annotation that does not look like a jaxtyping one (it is
    then not checked).
    """
    if not isinstance(ann, str):
        return ann
    try:
        return eval(ann, globalns, localns)  # noqa: S307 - annotations are code
    except Exception as e:
        if _LOOKS_JAXTYPED.search(ann):
            raise UnresolvedAnnotation(f"{type(e).__name__}: {e}") from e
        return None


def function_annotations(
    fn: Callable[..., Any],
    globalns: dict[str, Any] | None = None,
    localns: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Resolve `fn`'s annotations (string ones with its module's globals, by default)."""
    raw = getattr(fn, "__annotations__", None) or {}
    if not any(isinstance(a, str) for a in raw.values()):
        return dict(raw)
    if globalns is None:
        globalns = getattr(fn, "__globals__", {})
    return {k: resolve_annotation(a, globalns, localns or {}) for k, a in raw.items()}


def display_name(obj: Any) -> str:
    """A class's or function's qualified name without the `f.<locals>.` prefix (for messages)."""
    return str(getattr(obj, "__qualname__", obj)).rsplit("<locals>.", 1)[-1]


def unresolved_error(what: str, annotation: Any, error: Exception) -> NameError:
    """The error for an annotation of `what` (a field, a function) that names something unknown."""
    return NameError(
        f"treemod could not resolve the annotation {annotation!r} of {what} for shape checking "
        f"({error}). String annotations (`from __future__ import annotations`) are evaluated "
        "in the module's global namespace: import the names they use at module level."
    )
