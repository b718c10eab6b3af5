"""The shape-check switch (global, environment, context) and the runtime checker backends."""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from treemod._tree.module_info import INFO_ATTRIBUTE, ModuleInfo

__all__ = ["set_shape_checks", "shape_checks", "shape_checks_enabled"]

ENV_ENABLED = "TREEMOD_SHAPE_CHECKS"
ENV_CHECKER = "TREEMOD_SHAPE_CHECKER"
CHECKERS = ("typeguard", "beartype")
_TRUE = {"1", "true", "on", "yes"}
_FALSE = {"0", "false", "off", "no"}
_TYPEGUARD_PIN = "pip install 'typeguard>=2.13.3,<3'"


class ShapeCheckerError(RuntimeError):
    """The runtime type checker chosen for shape checks is missing or does not really check.

    Raised when checks are turned on (or at the first check) if, for example, typeguard 3 or 4
    is installed: they check nothing for jaxtyping annotations. The message says what to
    install.

    Example:
        >>> import treemod as tm
        >>> try:
        ...     tm.set_shape_checks(True, checker="beartype")
        ... except tm.ShapeCheckerError as e:  # only if beartype is missing or broken
        ...     print(e)
        >>> tm.set_shape_checks(True, checker="typeguard")
    """


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
    if checker not in CHECKERS:
        raise ValueError(
            f"Unknown shape checker {checker!r}: choose 'typeguard' (typeguard 2.13.x) or "
            "'beartype'."
        )
    return checker


def _env_checker() -> str:
    raw = os.environ.get(ENV_CHECKER, "typeguard").strip().lower()
    if raw not in CHECKERS:
        raise ValueError(
            f"{ENV_CHECKER}={os.environ[ENV_CHECKER]!r} is not understood: set it to "
            "'typeguard' or 'beartype'."
        )
    return raw


# The global setting, [enabled, checker]; a context (shape_checks, @shapecheck) overrides it
# with `OVERRIDE` (set and reset by `shape_checks` and by the engine around forced calls).
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


def set_shape_checks(enabled: bool, checker: str | None = None) -> None:
    """Turn shape checks on or off everywhere, and optionally choose the runtime checker.

    Checks are on by default: under `jax.jit` / `filter_jit` they run only while tracing, so a
    compiled step pays nothing. The environment variable `TREEMOD_SHAPE_CHECKS=0` turns them
    off at import (as does jaxtyping's `JAXTYPING_DISABLE=1` when `TREEMOD_SHAPE_CHECKS` is
    unset); `TREEMOD_SHAPE_CHECKER=beartype` picks beartype.

    Arguments:
        enabled: `True` to check jaxtyping annotations of module fields and calls.
        checker: `'typeguard'` (the default; typeguard 2.13.x) or `'beartype'`. It checks the
            annotations that are not plain jaxtyping arrays (containers, `PyTree[...]`).
            When checks are turned on, treemod verifies that the checker really catches a
            known-bad value, and raises `ShapeCheckerError` saying what to install if not.

    Returns:
        Nothing.

    Example:
        >>> import treemod as tm
        >>> tm.set_shape_checks(True, checker="beartype")
        >>> tm.shape_checks_enabled()
        True
        >>> tm.set_shape_checks(True, checker="typeguard")
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"set_shape_checks(enabled=...) takes True or False, not {enabled!r}.")
    chosen = _GLOBAL[1] if checker is None else _validate_checker(checker)
    if enabled:
        ensure_checker(chosen)
    _GLOBAL[:] = [enabled, chosen]


@contextlib.contextmanager
def shape_checks(enabled: bool = True, checker: str | None = None) -> Iterator[None]:
    """Turn shape checks on (or off) inside a `with` block, then restore the previous setting.

    The setting follows the code that runs inside the block, including functions it calls
    and, under `jax.jit`, the tracing that happens there. A class's `shapecheck=` option
    takes precedence.

    Arguments:
        enabled: whether to check inside the block.
        checker: `'typeguard'` or `'beartype'`; by default the one in force.

    Returns:
        A context manager.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> from jaxtyping import Array, Float
        >>> class Vec(tm.Module):
        ...     x: Float[Array, "3"]
        >>> with tm.shape_checks(False):
        ...     v = Vec(jnp.zeros(4))  # not checked
        >>> v.x.shape
        (4,)
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"shape_checks(enabled=...) takes True or False, not {enabled!r}.")
    chosen = current()[1] if checker is None else _validate_checker(checker)
    if enabled:
        ensure_checker(chosen)
    token = OVERRIDE.set((enabled, chosen))
    try:
        yield
    finally:
        OVERRIDE.reset(token)


# ----------------------------------------------------------------------------------------
# Backends. Each is `check(name, value, annotation) -> ""` (passes) or a reason string.


def _typeguard_check(name: str, value: Any, annotation: Any) -> str:
    import typeguard

    try:
        typeguard.check_type(name, value, annotation)
    except TypeError as e:
        return str(e)
    return ""


def _beartype_check(name: str, value: Any, annotation: Any) -> str:
    from beartype.door import die_if_unbearable
    from beartype.roar import BeartypeException

    try:
        die_if_unbearable(value, annotation)
    except BeartypeException as e:
        return str(e).split("\n")[0]
    return ""


def _typeguard_version() -> str:
    return importlib.metadata.version("typeguard")


def _beartype_version() -> str:
    return importlib.metadata.version("beartype")


BACKENDS: dict[str, Callable[[str, Any, Any], str]] = {
    "typeguard": _typeguard_check,
    "beartype": _beartype_check,
}
_VERSIONS: dict[str, Callable[[], str]] = {
    "typeguard": _typeguard_version,
    "beartype": _beartype_version,
}
_VERIFIED: set[str] = set()


def _probe(check: Callable[[str, Any, Any], str]) -> bool:
    """A known-good value passes and a known-bad one (mismatched dims in a tuple) is caught."""
    # Imported here, not at import treemod (see README.md, "Loading jaxtyping when needed").
    from jaxtyping import Float

    from treemod._private_apis import pop_shape_memo, push_shape_memo

    annotation = tuple[Float[np.ndarray, "n"], Float[np.ndarray, "n"]]  # noqa: F821
    good = (np.zeros(2, np.float32), np.zeros(2, np.float32))
    bad = (np.zeros(2, np.float32), np.zeros(3, np.float32))
    results = []
    for value in (good, bad):
        push_shape_memo({})
        try:
            results.append(check("probe", value, annotation))
        except Exception as e:  # a checker with another API raises on both
            results.append(f"{type(e).__name__}: {e}")
        finally:
            pop_shape_memo()
    return results[0] == "" and results[1] != ""


def ensure_checker(checker: str) -> None:
    """Verify (once) that `checker` is installed and really checks jaxtyping annotations."""
    if checker in _VERIFIED:
        return
    try:
        version = _VERSIONS[checker]()
    except importlib.metadata.PackageNotFoundError:
        what = _TYPEGUARD_PIN if checker == "typeguard" else "pip install beartype"
        raise ShapeCheckerError(
            f"Shape checks use {checker}, which is not installed: {what}, or turn checks off "
            f"with treemod.set_shape_checks(False) or {ENV_ENABLED}=0."
        ) from None
    if checker == "typeguard" and not version.startswith("2."):
        raise ShapeCheckerError(
            f"typeguard {version} is installed, but typeguard 3 and 4 check nothing for "
            f"jaxtyping annotations, so shape checks would silently pass. Install typeguard "
            f"2.13: {_TYPEGUARD_PIN}; or use beartype: "
            "treemod.set_shape_checks(True, checker='beartype') (or "
            f"{ENV_CHECKER}=beartype)."
        )
    if not _probe(BACKENDS[checker]):
        raise ShapeCheckerError(
            f"The installed {checker} {version} does not catch a known-bad jaxtyping value "
            f"(a tuple of f32[2] and f32[3] annotated tuple[Float[ndarray, 'n'], "
            f"Float[ndarray, 'n']]), so shape checks would silently pass. Install "
            f"typeguard 2.13 ({_TYPEGUARD_PIN}) or a recent beartype (pip install -U "
            "beartype) and choose it with treemod.set_shape_checks(True, checker=...)."
        )
    _VERIFIED.add(checker)
