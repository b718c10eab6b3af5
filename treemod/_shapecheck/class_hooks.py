"""Shape checks in a Module class body: the `shapecheck=` class option and checked methods.

`install_class_checks` is called by the Module metaclass (`treemod/_module/module.py`) before
each class is created: it reads the class option and wraps the methods whose annotations use
jaxtyping with `checker.wrap_checked`, so that their calls are checked; the metaclass records
the option and the resolved field annotations in the class's `ModuleInfo`. Field checks after
construction are `checker.check_fields`, which Module and `tree_at` import directly.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from treemod._shapecheck.annotations import (
    UnresolvedAnnotation,
    contains_jaxtyping,
    function_annotations,
)
from treemod._shapecheck.checker import checked_call_state, wrap_checked

# The only dunder method checked automatically. Not `__init__`: the fields it sets are checked
# after construction anyway, and a layer's own argument validation ("Linear needs a PRNG key")
# says more than a type error would. Decorate `__init__` with `treemod.shapecheck` to check it.
_CHECKED_DUNDERS = frozenset({"__call__"})


def _defining_namespaces() -> tuple[dict[str, Any], dict[str, Any]]:
    """The globals and locals of the code running the `class` statement (for string annotations).

    Frame 0 is `install_class_checks`, 1 the metaclass's `__new__`; metaclass chains are skipped.
    """
    frame = sys._getframe(2)
    while frame.f_code.co_name == "__new__" and frame.f_back is not None:
        frame = frame.f_back
    return frame.f_globals, frame.f_locals


def _method_annotations(
    name: str, fn: Any, globalns: dict[str, Any], localns: dict[str, Any]
) -> dict[str, Any] | None:
    """The resolved annotations of a method to wrap; `None`: do not wrap.

    An empty dict means "wrap, but resolve the annotations at the first call" (forward
    references to names defined later).
    """
    if not isinstance(fn, types.FunctionType) or not fn.__annotations__:
        return None
    if name.startswith("__") and name not in _CHECKED_DUNDERS:
        return None
    if getattr(fn, "__isabstractmethod__", False) or checked_call_state(fn) is not None:
        return None
    try:
        annotations = function_annotations(fn, globalns, localns)
    except UnresolvedAnnotation:
        return {}
    if any(a is None and isinstance(fn.__annotations__[k], str) for k, a in annotations.items()):
        return {}
    return annotations if any(contains_jaxtyping(a) for a in annotations.values()) else None


def install_class_checks(
    namespace: dict[str, Any], kwargs: dict[str, Any]
) -> tuple[dict[str, bool | None], dict[str, Any]]:
    """Prepare a Module class body: read the `shapecheck=` class option, wrap annotated methods.

    Called by the metaclass before the class is created; it edits `namespace` (methods) and
    `kwargs` (takes `shapecheck=` out) in place. String annotations (`from __future__ import
    annotations`) are resolved here, where the names of the defining scope are visible; those
    that cannot be (forward references) are resolved later with the module's globals.

    Arguments:
        namespace: the class body.
        kwargs: the class statement's keywords.

    Returns:
        The class option (`{"shapecheck": value}`, or `{}` when not given) and the field
        annotations resolved here, for the class's `ModuleInfo`.
    """
    options: dict[str, bool | None] = {}
    if "shapecheck" in kwargs:
        option = kwargs.pop("shapecheck")
        if option not in (True, False, None):
            name = namespace.get("__qualname__", "?")
            raise TypeError(
                f"class {name}: the class option `shapecheck=` takes True (always check this "
                f"class), False (never) or None (follow the global switch), not {option!r}."
            )
        options["shapecheck"] = option
    raw = namespace.get("__annotations__", {})
    strings = any(isinstance(a, str) for a in raw.values()) or any(
        isinstance(a, str)
        for v in namespace.values()
        if isinstance(v, types.FunctionType)
        for a in v.__annotations__.values()
    )
    globalns, localns = _defining_namespaces() if strings else ({}, {})
    localns = {**localns, **namespace} if strings else {}
    resolved = {}
    for name, ann in raw.items():
        if isinstance(ann, str):
            try:
                resolved[name] = eval(ann, globalns, localns)  # noqa: S307
            except Exception:
                continue  # a forward reference: resolved at the first check
    for name, value in list(namespace.items()):
        annotations = (
            _method_annotations(name, value, globalns or value.__globals__, localns)
            if isinstance(value, types.FunctionType)
            else None
        )
        if annotations is not None:
            namespace[name] = wrap_checked(value, annotations=annotations)
    return options, resolved
