"""Equinox's names for the error `error_if` raises.

Equinox raises `EquinoxTracetimeError` when the predicate is known while tracing and
`EquinoxRuntimeError` from a compiled run; treemod raises its one `RuntimeCheckError` in both
cases, so both names are that class and `except eqx.EquinoxRuntimeError` catches it.
"""

from treemod._transforms.error_if import RuntimeCheckError

__all__ = ["EquinoxRuntimeError", "EquinoxTracetimeError", "RuntimeCheckError"]

EquinoxRuntimeError = RuntimeCheckError
EquinoxTracetimeError = RuntimeCheckError
