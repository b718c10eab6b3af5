"""Equinox's error types and its `EQX_ON_ERROR` variable, for the compat namespace.

Equinox raises `EquinoxTracetimeError` when `error_if`'s predicate is known while tracing and
`EquinoxRuntimeError` from a compiled run; treemod raises its one `RuntimeCheckError` in both
cases, so both names are that class and `except eqx.EquinoxRuntimeError` catches it.

Where Equinox raises another built-in type than treemod for the same mistake, this namespace's
functions raise an error of both types (as `io.UnsupportedOperation` is both an `OSError` and a
`ValueError`), so code written for Equinox catches it: a `filter_spec` leaf that is not a bool
or predicate (`ValueError` in Equinox, `TypeError` in treemod), a `tree_at` `where` that
computes with a leaf (`AttributeError`) or returns something that is not a node (`TypeError`).

`EQX_ON_ERROR`, read once when this namespace is imported, sets what `error_if`'s
`on_error="default"` does (`raise`, `breakpoint`, `nan` or `off`), as in Equinox; treemod's own
`TREEMOD_ON_ERROR`, when set, takes precedence.
"""

from __future__ import annotations

import os

from treemod import RuntimeCheckError
from treemod._compat_api import (
    FilterSpecError,
    NotANodeError,
    WhereComputedError,
    set_default_on_error,
)

__all__ = [
    "EquinoxFilterSpecError",
    "EquinoxNotANodeError",
    "EquinoxRuntimeError",
    "EquinoxTracetimeError",
    "EquinoxWhereComputedError",
    "RuntimeCheckError",
]

EquinoxRuntimeError = RuntimeCheckError
EquinoxTracetimeError = RuntimeCheckError


class EquinoxFilterSpecError(FilterSpecError, ValueError):
    """A filter_spec leaf that is neither a bool nor a predicate: treemod's `TypeError`, and the
    `ValueError` Equinox raises there."""


class EquinoxWhereComputedError(WhereComputedError, AttributeError):
    """`tree_at`'s `where` computed with a leaf: treemod's `TypeError`, and the
    `AttributeError` Equinox raises there."""


class EquinoxNotANodeError(NotANodeError, TypeError):
    """`tree_at`'s `where` returned something that is not a node: treemod's `ValueError`, and
    the `TypeError` Equinox raises there."""


set_default_on_error(os.environ.get("EQX_ON_ERROR"), "EQX_ON_ERROR")
