"""Shape checks: jaxtyping annotations on module fields and calls, checked where modules are built.

Fields are checked after every construction (generated or custom `__init__`, converters) and
after `tree_at` rebuilds a module; annotated methods (notably `__call__`) and functions
decorated with `shapecheck` have their arguments and return value checked, with dimension
names shared between the module's fields, the arguments and the return value. Under `jax.jit`
all of this is Python that runs while tracing, so compiled code pays nothing.

This file is what the rest of treemod imports; it does not import jaxtyping. The checks
themselves are in `engine.py`, loaded at the first class or call that has a jaxtyping
annotation, the first call of a `shapecheck`-decorated function, or the first lookup of
`ShapeCheckError` (README.md, "Loading jaxtyping when needed").
"""

from __future__ import annotations

import functools
import sys
import types
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from treemod._shapecheck.annotations import UnresolvedAnnotation, function_annotations
from treemod._shapecheck.config import enabled_for
from treemod._shapecheck.fields import field_spec
from treemod._tree.module_info import (
    INFO_ATTRIBUTE,
    ModuleInfo,
    is_module_class,
    module_info,
    update_module_info,
)

if TYPE_CHECKING:
    from treemod._shapecheck.engine import ShapeCheckError
    from treemod._shapecheck.spec import Entry

__all__ = ["ShapeCheckError", "checked_call_state", "check_fields", "shapecheck", "wrap_checked"]

_T = TypeVar("_T")


# ------------------------------------------------------------------------------ the engine
#
# `_run` and `_check_spec` start as loaders: the first call that has something to check
# imports `engine` and puts its functions in their place, so later calls pay nothing more
# than before the split (a global lookup).


def _load_engine() -> types.ModuleType:
    """Import `engine` (and so jaxtyping) and put its functions in place of the loaders."""
    global _run, _check_spec
    from treemod._shapecheck import engine

    _run, _check_spec = engine.run_checked_call, engine.check_spec
    return engine


def _nothing_to_check(fn: Callable[..., Any], annotations: dict[str, Any] | None) -> bool:
    """Whether a wrapped call (first call, not forced) surely checks nothing: jaxtyping is not
    imported, even after its string annotations are resolved, so none of them is jaxtyping's."""
    if "jaxtyping" in sys.modules:
        return False
    if annotations is None:
        try:
            function_annotations(fn)
        except UnresolvedAnnotation:
            return False  # the engine reports it
    return "jaxtyping" not in sys.modules


def _run_first(
    fn: Callable[..., Any], state: list[Any], args: tuple[Any, ...], kwargs: dict[Any, Any]
) -> Any:
    if state[0] is None and not state[1] and _nothing_to_check(fn, state[2]):
        state[0] = False
        return fn(*args, **kwargs)
    run = _load_engine().run_checked_call
    return run(fn, state, args, kwargs)


def _check_spec_first(module: Any, spec: tuple[Entry, ...], constructing: bool) -> None:
    _load_engine().check_spec(module, spec, constructing)


_run: Callable[[Callable[..., Any], list[Any], tuple[Any, ...], dict[Any, Any]], Any] = _run_first
_check_spec: Callable[[Any, tuple[Entry, ...], bool], None] = _check_spec_first


def __getattr__(name: str) -> Any:
    # `ShapeCheckError` subclasses jaxtyping's error, so it is made by `engine` (PEP 562).
    if name == "ShapeCheckError":
        error: type[Exception] = _load_engine().ShapeCheckError
        globals()[name] = error
        return error
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------------ entry points


def check_fields(module: Any, constructing: bool = True) -> None:
    """Check `module`'s annotated fields against each other, if checks are on for its class.

    `constructing` is `True` from the Module construction protocol (strict checks) and `False`
    from paths that rebuild a module, such as `tree_at` (non-array placeholders, as found in
    filter specs and partitioned trees, are let through).
    """
    cls = type(module)
    info: ModuleInfo = getattr(cls, INFO_ATTRIBUTE)  # `module_info` without a call: a hot path
    spec = info.field_spec
    if spec is None:
        spec = field_spec(cls)
    if not spec or not enabled_for(cls):
        return
    _check_spec(module, spec, constructing)


# The wrappers `wrap_checked` made, with their state. Not an attribute of the wrapper:
# `functools.wraps` would copy it to a decorator wrapped around it.
_CHECKED: weakref.WeakKeyDictionary[Callable[..., Any], list[Any]] = weakref.WeakKeyDictionary()


def checked_call_state(fn: Any) -> list[Any] | None:
    """The state of a wrapper made by `wrap_checked` (`None` for any other object).

    It is `[spec, force, annotations]`: `spec` is `None` until the first call analyses the
    annotations (resolved ones if given), then the analysis (`spec.CallSpec`, or `False`:
    nothing to check); `force` checks whatever the switch says.
    """
    try:
        return _CHECKED.get(fn)
    except TypeError:  # not weak-referenceable or not hashable: not a wrapper
        return None


def wrap_checked(
    fn: Callable[..., Any], force: bool = False, annotations: dict[str, Any] | None = None
) -> Callable[..., Any]:
    """Wrap `fn` so that its calls are checked by `engine.run_checked_call`.

    Arguments:
        fn: the function.
        force: check whatever the switch says (`shapecheck`).
        annotations: `fn`'s annotations resolved already (`None`: at the first call).

    Returns:
        The wrapper (its state: `checked_call_state`).
    """
    state: list[Any] = [None, force, annotations or None]

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if state[0] is False and not force:
            return fn(*args, **kwargs)
        return _run(fn, state, args, kwargs)

    _CHECKED[checked] = state
    return checked


def shapecheck(obj: _T) -> _T:
    """Always check a function's (or a Module class's) jaxtyping annotations, and turn checks on
    for the code it runs.

    On a function: its annotated arguments and return value are checked on every call (while
    tracing, under `jax.jit`), sharing dimension names, whatever the global switch says; code it
    calls (modules built, layers applied) runs with shape checks on. On a `treemod.Module`
    subclass: the same as the class option `shapecheck=True`, its fields and methods are
    always checked.

    Arguments:
        obj: a function, method or `treemod.Module` subclass.

    Returns:
        The checked function, or the class itself.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> from jaxtyping import Array, Float
        >>> @tm.shapecheck
        ... def outer(x: Float[Array, "m"], y: Float[Array, "n"]) -> Float[Array, "m n"]:
        ...     return x[:, None] * y[None, :]
        >>> outer(jnp.ones(2), jnp.ones(3)).shape
        (2, 3)
        >>> outer(jnp.ones((2, 2)), jnp.ones(3))
        Traceback (most recent call last):
        ...
        treemod._shapecheck.engine.ShapeCheckError: outer argument x: expected ...
          reason: this array has 2 dimensions, not the 1 expected by the type hint
        Shape checks can be switched off: ...
    """
    if isinstance(obj, type):
        if not is_module_class(obj):
            raise TypeError(
                f"shapecheck decorates functions and treemod.Module subclasses, not the class "
                f"{obj.__qualname__}. For a plain dataclass use "
                "jaxtyping.jaxtyped(typechecker=...)."
            )
        given = module_info(obj).options_given | {"shapecheck"}
        update_module_info(obj, shapecheck=True, options_given=given)
        return obj
    if not callable(obj):
        raise TypeError(f"shapecheck decorates functions and Module classes, not {obj!r}.")
    state = checked_call_state(obj)
    if state is not None:
        fn = obj.__wrapped__  # type: ignore[attr-defined]
        return wrap_checked(fn, force=True, annotations=state[2])  # type: ignore[return-value]
    return wrap_checked(obj, force=True)  # type: ignore[return-value]
