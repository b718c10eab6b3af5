"""Module paths: where each module sits in a call's arguments, the named scope that carries its
path through a trace, and reading those scopes back from a name stack or a StableHLO location."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

import jax.tree_util as jtu

from treemod._format.paths import render_path
from treemod._tree.module_info import is_module

__all__ = ["ScopeReader", "argument_labels", "module_paths", "scope_name"]

# A transform's wrapper around a scope in a rendered name stack: `jvp(model.mlp)`,
# `transpose(jvp(model.mlp))`, and the program's own `jit(loss)`.
_WRAPPER = re.compile(r"^[A-Za-z_][\w.]*\((.*)\)$")


def scope_name(path: str) -> str:
    """The named scope of a module path: `/` separates scopes, so a `/` in a key is swapped."""
    return path.replace("/", "\u2215")


def argument_labels(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[list[str], dict[str, str]]:
    """The root of each argument's paths: its parameter's name where `fn`'s signature gives
    one (`model`), else its position (`args[2]`, as `render_path` writes it)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or an object without a signature
        params = []
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    labels = [
        positional[i] if i < len(positional) else render_path((_seq(1), _seq(i)))
        for i in range(len(args))
    ]
    return labels, {k: k for k in kwargs}


def _seq(i: int) -> jtu.SequenceKey:
    return jtu.SequenceKey(i)


def module_paths(tree: Any, label: str) -> Iterator[tuple[Any, str]]:
    """Every module in `tree` (itself included) with its path under `label`, parents first."""
    if is_module(tree):
        yield tree, label
    yield from _below(tree, label)


def _below(node: Any, prefix: str) -> Iterator[tuple[Any, str]]:
    def stop(x: Any) -> bool:
        return x is not node and is_module(x)

    for key_path, child in jtu.tree_flatten_with_path(node, is_leaf=stop)[0]:
        if child is not node and is_module(child):
            path = prefix + jtu.keystr(key_path)
            yield child, path
            yield from _below(child, path)


class ScopeReader:
    """Reads the module paths out of a rendered name stack (`jit(f)/model/model.mlp/dot_general`),
    outermost first, memoised per string: a program repeats few distinct name stacks."""

    def __init__(self, scopes: dict[str, str]) -> None:
        self.scopes = scopes
        self._memo: dict[str, tuple[str, ...]] = {}

    def __call__(self, name_stack: str) -> tuple[str, ...]:
        found = self._memo.get(name_stack)
        if found is None:
            paths = []
            for part in name_stack.split("/"):
                while (m := _WRAPPER.match(part)) is not None and part not in self.scopes:
                    part = m.group(1)
                path = self.scopes.get(part)
                if path is not None and path not in paths:
                    paths.append(path)
            found = self._memo[name_stack] = tuple(paths)
        return found
