"""Names for messages: a function's readable name, and key paths into a call's arguments."""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import jax.tree_util as jtu


def function_name(fn: Any) -> str:
    """A readable name for error messages and logs."""
    if isinstance(fn, types.MethodType):
        return getattr(fn, "__qualname__", None) or function_name(fn.__func__)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if isinstance(name, str):
        return name.rsplit("<locals>.", 1)[-1]
    return type(fn).__qualname__


def render_path(path: Sequence[Any], fn_label: str = "self") -> str:
    """Render a key path into `(fn_tree, args, kwargs)` as `args[0].layers[2].weight`."""
    if not path:
        return "(arguments)"
    top = path[0].idx if isinstance(path[0], jtu.SequenceKey) else None
    rest = list(path[1:])
    if top == 0:
        return fn_label + jtu.keystr(tuple(rest))
    if top == 1 and not rest:
        return "positional arguments"
    if top == 2 and not rest:
        return "keyword arguments"
    if top == 1 and rest and isinstance(rest[0], jtu.SequenceKey):
        return f"args[{rest[0].idx}]" + jtu.keystr(tuple(rest[1:]))
    if top == 2 and rest and isinstance(rest[0], jtu.DictKey):
        return f"kwargs[{rest[0].key!r}]" + jtu.keystr(tuple(rest[1:]))
    return jtu.keystr(tuple(path))


def leaf_paths(tree: Any, fn_label: str = "self") -> list[str]:
    """Rendered key paths of every leaf of `(fn_tree, args, kwargs)` (slow; error paths only)."""
    return [render_path(p, fn_label) for p, _ in jtu.tree_flatten_with_path(tree)[0]]
