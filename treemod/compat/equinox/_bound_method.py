"""Bound methods that are pytrees, as Equinox makes them: `model.method` with `model` as its
one child.

In Equinox `jax.tree_util.tree_leaves(model.method)` gives the model's arrays and
`jax.jit(run)(model.method)` traces them. `bind_methods` gives a class's plain functions that
behaviour (this namespace's `Module` uses it); special methods (`__call__`, ...) stay
ordinary, so calling a module costs nothing extra. `BoundMethod` is a
`PytreeBoundMethod`, which treemod's transforms and `treemod.debug` treat as they treat a
Python bound method (see `treemod/_compat_api.py`).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from treemod.compat.equinox._bound_method import BoundMethod
    >>> import treemod as tm
    >>> class Scale(tm.Module):
    ...     w: jax.Array
    ...     def apply(self, x):
    ...         return self.w * x
    >>> bound = BoundMethod(Scale.apply, Scale(jnp.array(2.0)))
    >>> jax.tree_util.tree_leaves(bound), bound(3.0)
    ([Array(2., dtype=float32, weak_type=True)], Array(6., dtype=float32, weak_type=True))
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu

from treemod import Module
from treemod._compat_api import PytreeBoundMethod

__all__ = ["BoundMethod", "bind_inherited_methods", "bind_methods"]


class BoundMethod(PytreeBoundMethod):
    # A method bound to a module, as a pytree whose child is the module (`__self__`); its
    # `__doc__`, `__name__` and `__qualname__` are the function's.
    __slots__ = ("__func__", "__self__")
    __doc__ = property(lambda self: getattr(self.__func__, "__doc__", None))

    def __init__(self, func: Callable[..., Any], obj: Any) -> None:
        self.__func__ = func
        self.__self__ = obj

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__(self.__self__, *args, **kwargs)

    @property
    def __wrapped__(self) -> Any:
        return types.MethodType(self.__func__, self.__self__)

    def __getattr__(self, name: str) -> Any:  # `__name__`, `__qualname__`, ... of the function
        if name in ("__func__", "__self__"):  # not set yet (while unpickling)
            raise AttributeError(name)
        return getattr(self.__func__, name)

    def __eq__(self, other: object) -> Any:
        if not isinstance(other, BoundMethod) or other.__func__ is not self.__func__:
            return False
        return self.__self__ == other.__self__

    def __hash__(self) -> int:
        return hash((self.__func__, self.__self__))

    def __repr__(self) -> str:  # as Equinox writes its `BoundMethod` module
        name = getattr(self.__func__, "__qualname__", repr(self.__func__))
        return f"BoundMethod(__func__=<function {name}>, __self__={self.__self__!r})"


jtu.register_pytree_with_keys(
    BoundMethod,
    lambda b: (((jtu.GetAttrKey("__self__"), b.__self__),), b.__func__),
    lambda func, children: BoundMethod(func, next(iter(children))),
    flatten_func=lambda b: ((b.__self__,), b.__func__),
)


class _Method:
    """A class-body function whose instance lookups give a `BoundMethod`."""

    __slots__ = ("fn", "__dict__")

    def __init__(self, fn: types.FunctionType) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)  # name, doc, `__isabstractmethod__`, ...

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self.fn
        return BoundMethod(self.fn, instance)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # `Cls.__dict__[name](obj, ...)`
        return self.fn(*args, **kwargs)


def bind_methods(namespace: dict[str, Any]) -> None:
    """Make the plain functions of a class body (not special methods) give `BoundMethod`s."""
    for name, value in list(namespace.items()):
        if isinstance(value, types.FunctionType) and not (
            name.startswith("__") and name.endswith("__")
        ):
            namespace[name] = _Method(value)


def bind_inherited_methods(cls: type) -> None:
    """Give `cls` the plain functions it inherits from bases that are not modules (mixins) as
    `BoundMethod`-giving methods too; modules' own bodies were bound by `bind_methods`."""
    for base in cls.__mro__[1:-1]:
        if Module in base.__mro__:  # a module: its own body is bound, or is treemod's
            continue
        for name, value in vars(base).items():
            if (
                isinstance(value, types.FunctionType)
                and not (name.startswith("__") and name.endswith("__"))
                and inspect.getattr_static(cls, name) is value  # not overridden nearer `cls`
            ):
                setattr(cls, name, _Method(value))
