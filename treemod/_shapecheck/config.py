"""The shape-check switch: `shape_checks` (global, or for a `with` block), the environment
variables, and what checks are on for a class."""

from __future__ import annotations

import contextvars
import os
from types import TracebackType
from typing import Any

from treemod._shapecheck.backends import AUTO, CHECKERS, ensure_checker
from treemod._tree.module_info import INFO_ATTRIBUTE, ModuleInfo

__all__ = ["shape_checks", "shape_checks_enabled"]

ENV_ENABLED = "TREEMOD_SHAPE_CHECKS"
ENV_CHECKER = "TREEMOD_SHAPE_CHECKER"
_TRUE = {"1", "true", "on", "yes"}
_FALSE = {"0", "false", "off", "no"}


def _env_enabled() -> bool:
    # Unset: on, unless jaxtyping's own switch (JAXTYPING_DISABLE=1) turns jaxtyping checks off.
    default = "0" if os.environ.get("JAXTYPING_DISABLE", "0").strip().lower() in _TRUE else "1"
    raw = os.environ.get(ENV_ENABLED, default).strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(
        f"{ENV_ENABLED}={os.environ[ENV_ENABLED]!r} is not understood: set it to 1 (shape "
        "checks on) or 0 (off)."
    )


def _validate_checker(checker: str) -> str:
    if checker not in CHECKERS and checker != AUTO:
        raise ValueError(
            f"Unknown shape checker {checker!r}: choose 'typeguard' (typeguard 2.13.x), "
            "'beartype' or 'auto'."
        )
    return checker


def _env_checker() -> str:
    raw = os.environ.get(ENV_CHECKER, AUTO).strip().lower()
    if raw == AUTO:
        return AUTO
    if raw not in CHECKERS:
        raise ValueError(
            f"{ENV_CHECKER}={os.environ[ENV_CHECKER]!r} is not understood: set it to "
            "'typeguard', 'beartype' or 'auto'."
        )
    return raw


# The global setting, [enabled, checker] (checker: a name in CHECKERS, or AUTO); a `with
# shape_checks(...)` block or a `@shapecheck` function overrides it for the code it runs with
# `OVERRIDE` (set and reset by `shape_checks` and by the engine around forced calls).
_GLOBAL: list[Any] = [_env_enabled(), _env_checker()]
OVERRIDE: contextvars.ContextVar[tuple[bool, str] | None] = contextvars.ContextVar(
    "treemod_shape_checks", default=None
)


def current() -> tuple[bool, str]:
    """The setting in force here: `(enabled, checker)`."""
    override = OVERRIDE.get()
    return (_GLOBAL[0], _GLOBAL[1]) if override is None else override


def enabled_for(cls: type | None) -> bool:
    """Whether a class's fields and methods are checked: its `shapecheck=` option wins."""
    info: ModuleInfo | None = getattr(cls, INFO_ATTRIBUTE, None)  # `module_info`, inlined
    if info is not None and info.shapecheck is not None:
        return info.shapecheck
    override = OVERRIDE.get()
    return bool(_GLOBAL[0] if override is None else override[0])


def shape_checks_enabled() -> bool:
    """Whether shape checks are on here (globally, or as set by an enclosing `shape_checks`).

    Returns:
        `True` if annotated modules and functions are checked in the current context.

    Example:
        >>> import treemod as tm
        >>> with tm.shape_checks(False):
        ...     tm.shape_checks_enabled()
        False
    """
    return current()[0]


class shape_checks:  # noqa: N801 (used as a function and as a context manager, like `open`)
    """Turn shape checks on or off: from now on, or inside a `with` block.

    `treemod.shape_checks(False)` switches checks off everywhere from now on;
    `with treemod.shape_checks(False):` switches them off for the code that runs inside the
    block (including functions it calls and, under `jax.jit`, the tracing that happens there;
    other threads keep their setting), then restores what was in force. Checks are on by
    default: under `jax.jit` / `filter_jit` they run only while tracing, so a compiled step
    pays nothing. `TREEMOD_SHAPE_CHECKS=0` in the environment turns them off at import (as does
    jaxtyping's `JAXTYPING_DISABLE=1` when `TREEMOD_SHAPE_CHECKS` is unset). A class's
    `shapecheck=` option takes precedence over both.

    Arguments:
        enabled: `True` to check jaxtyping annotations of module fields and calls.
        checker: the runtime type checker for annotations that are not plain jaxtyping arrays
            (tuples, lists, dicts of arrays, `PyTree[...]`): `'typeguard'` (typeguard 2.13),
            `'beartype'`, or `'auto'` (typeguard 2.13 if installed, else beartype if
            installed, else none: such annotations then raise `ImportError` when checked).
            By default the one in force: at import, `TREEMOD_SHAPE_CHECKER`, else `'auto'`.
            A checker named here is verified when checks are turned on (it must catch a
            known-bad value): `ImportError`, saying what to install, if not.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> from jaxtyping import Array, Float
        >>> class Vec(tm.Module):
        ...     x: Float[Array, "3"]
        >>> with tm.shape_checks(False):
        ...     v = Vec(jnp.zeros(4))  # not checked
        >>> v.x.shape
        (4,)
        >>> tm.shape_checks(False)  # off from now on
        <treemod.shape_checks(False, checker='auto')>
        >>> Vec(jnp.zeros(4)).x.shape
        (4,)
        >>> _ = tm.shape_checks(True)
    """

    # The call sets the global setting at once (so that a plain call works); entering a `with`
    # block puts the global setting back and sets the block's own instead. Both happen in the
    # same statement, before any code of the caller runs in between.
    __slots__ = ("_previous", "_setting", "_token")

    def __init__(self, enabled: bool = True, checker: str | None = None) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"shape_checks(enabled=...) takes True or False, not {enabled!r}.")
        chosen = current()[1] if checker is None else _validate_checker(checker)
        if enabled:
            ensure_checker(chosen)
        self._setting = (enabled, chosen)
        self._previous = (_GLOBAL[0], _GLOBAL[1])
        self._token: contextvars.Token[tuple[bool, str] | None] | None = None
        _GLOBAL[:] = [enabled, chosen]

    def __enter__(self) -> None:
        if self._token is not None:
            raise RuntimeError("a shape_checks(...) object can be entered once; make a new one.")
        _GLOBAL[:] = list(self._previous)
        self._token = OVERRIDE.set(self._setting)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._token is not None:
            OVERRIDE.reset(self._token)

    def __repr__(self) -> str:
        return f"<treemod.shape_checks({self._setting[0]}, checker={self._setting[1]!r})>"
