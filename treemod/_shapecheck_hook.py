"""The hook through which construction paths (Module init, `tree_at`) ask for field checks.

It lives at the bottom of the import graph so that both the Module core and the tree utilities
can call it; the shape-checking module installs the real checker. It also wraps the annotated
methods of each new Module class (`install_class_checks`, called by the metaclass) so that
their calls can be checked; the wrappers ask the installed call checker at call time.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable
from typing import Any

from ._shapecheck_annotations import UnresolvedAnnotation, contains_jaxtyping, function_annotations

_field_checker: list[Callable[[Any, bool], None]] = []
# call_checker(fn, state, args, kwargs) -> fn's result, after checking the call.
_call_checker: list[Callable[[Callable[..., Any], list[Any], tuple, dict], Any]] = []

# Methods whose calls are never checked (construction hooks, pickling, printing, ...).
_CHECKED_DUNDERS = frozenset({"__call__", "__init__"})


def install_field_checker(checker: Callable[[Any, bool], None]) -> None:
    """Install the function that checks a freshly built module's fields.

    It receives the module and whether the module was just constructed (`True`: strict) or
    rebuilt by another path such as `tree_at` (`False`: non-array placeholders, as found in
    filter specs and partitioned trees, are let through).
    """
    _field_checker[:] = [checker]


def install_call_checker(checker: Callable[[Callable[..., Any], list[Any], tuple, dict], Any]) -> None:
    """Install the function that runs (and checks) calls of wrapped methods."""
    _call_checker[:] = [checker]


def check_module_fields(module: Any) -> None:
    """Check `module`'s fields with the installed checker, if any."""
    if _field_checker:
        # The metaclass's `__call__` constructs; every other caller (tree_at) rebuilds.
        constructing = sys._getframe(1).f_code.co_name == "__call__"
        _field_checker[0](module, constructing)


def _needs_wrapping(name: str, fn: Any) -> bool:
    if not isinstance(fn, types.FunctionType) or not fn.__annotations__:
        return False
    if name.startswith("__") and name not in _CHECKED_DUNDERS:
        return False
    if getattr(fn, "__isabstractmethod__", False) or hasattr(fn, "__tm_shapecheck_state__"):
        return False
    try:
        annotations = function_annotations(fn)
    except UnresolvedAnnotation:
        return True  # reported (or resolved) at the first call
    if any(a is None and isinstance(fn.__annotations__[k], str) for k, a in annotations.items()):
        return True  # a forward reference: decide at the first call
    return any(contains_jaxtyping(a) for a in annotations.values())


def wrap_checked(fn: Callable[..., Any], force: bool = False) -> Callable[..., Any]:
    """Wrap `fn` so that its calls go through the installed call checker.

    The wrapper's `__tm_shapecheck_state__` is `[spec, force]`: `spec` is `None` until the
    first call analyses the annotations, then the analysis (or `False`: nothing to check).
    """
    state: list[Any] = [None, force]

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if state[0] is False or not _call_checker:
            return fn(*args, **kwargs)
        return _call_checker[0](fn, state, args, kwargs)

    checked.__tm_shapecheck_state__ = state  # type: ignore[attr-defined]
    return checked


def install_class_checks(namespace: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """Prepare a Module class body: read the `shapecheck=` class option, wrap annotated methods.

    Called by the metaclass before the class is created; it edits `namespace` and `kwargs`
    in place.
    """
    if "shapecheck" in kwargs:
        option = kwargs.pop("shapecheck")
        if option not in (True, False, None):
            name = namespace.get("__qualname__", "?")
            raise TypeError(
                f"class {name}: the class option `shapecheck=` takes True (always check this "
                f"class), False (never) or None (follow the global switch), not {option!r}."
            )
        namespace["__tm_shapecheck__"] = option
    for name, value in list(namespace.items()):
        if _needs_wrapping(name, value):
            namespace[name] = wrap_checked(value)
