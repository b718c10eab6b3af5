"""The base of the filtered transforms' wrappers, and how a callable splits into tree and code."""

from __future__ import annotations

import functools
import importlib
import pickle
import sys
import types
from collections.abc import Callable
from typing import Any, ClassVar, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

import jax.tree_util as jtu

P = ParamSpec("P")
R = TypeVar("R", covariant=True)
_P = ParamSpec("_P")
_R = TypeVar("_R")
_S = TypeVar("_S")


class TransformedFunction(Generic[P, R]):
    """Base of the filtered transforms' wrappers (`filter_jit(f)`, `filter_grad(f)`, ...).

    A wrapper takes the name, docstring and `__wrapped__` of the function it wraps, so that
    `inspect` and the docs see that function, and binds like a function: set as a class
    attribute (a decorated method), it receives the instance as its first argument.

    It is generic in the wrapped function's parameters `P` and its result `R`, so that a type
    checker sees `filter_jit(f)(x)` as a call of `f`.
    """

    # For `filter_jit`: a subclass whose `__init__` takes `(fun, *options)` names the
    # attribute holding `fun` and those holding the options, in that order; then `filter_jit`
    # wrappers of equal wrappers of one function (say `filter_jit(filter_grad(f))` written
    # twice) share compiled versions (`share_spec`, `jit_sharing.py`).
    _tm_share_fields: ClassVar[tuple[str, tuple[str, ...]] | None] = None

    def __call__(self, /, *args: P.args, **kwargs: P.kwargs) -> R:
        raise NotImplementedError

    def share_spec(self) -> tuple[Any, tuple[Any, ...], Callable[[Any], Any]] | None:
        """`(wrapped, options, rewrap)`: what this wrapper wraps, its options (with its class),
        and `rewrap(g)`, the same wrapper around `g` (`type(self)(g, *options)`); `None` if
        not shareable. `rewrap` holds no reference to `wrapped` (filter_jit keeps it with its
        versions)."""
        fields = type(self)._tm_share_fields
        if fields is None:
            return None
        inner_attr, option_attrs = fields
        values = tuple(getattr(self, a) for a in option_attrs)
        rewrap = functools.partial(_rewrap, type(self), values)
        return getattr(self, inner_attr), (type(self), *values), rewrap

    def _wraps(self, fun: Any) -> None:
        # A wrapper of a named wrapper (`@filter_jit` over `@filter_grad`, or `filter_hessian`,
        # built of two) takes its names too, so the outermost one pickles under them.
        named = isinstance(fun, TransformedFunction) and "__qualname__" in vars(fun)
        if named or isinstance(fun, types.FunctionType | types.MethodType | functools.partial):
            functools.update_wrapper(self, fun, updated=())
        else:
            self.__wrapped__ = fun

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(
        self: TransformedFunction[Concatenate[_S, _P], _R], instance: _S, owner: type | None = None
    ) -> Callable[_P, _R]: ...

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return types.MethodType(self, instance)

    def __reduce__(self) -> str:
        """Pickle by reference, as Python pickles functions: by module and qualified name.

        A transformed function defined at the top level of an importable module (a `def`
        decorated with `@filter_jit` there, say, or a decorated method of a module-level class)
        is found again under its name when unpickled, in this process or another one
        (`multiprocessing`, job launchers). Anything else raises `pickle.PicklingError` saying why.
        """
        return reduce_by_name(self)


def reduce_by_name(obj: Any) -> str:
    """`__reduce__` of a transformed function: its qualified name, once checked to lead to it.

    Arguments:
        obj: a wrapper that took its wrapped function's `__module__` and `__qualname__`.

    Returns:
        The qualified name, which pickle looks up in the module as a global.
    """
    attrs = vars(obj)
    module, qualname = attrs.get("__module__"), attrs.get("__qualname__")
    if not isinstance(module, str) or not isinstance(qualname, str):
        wrapped = type(attrs.get("__wrapped__")).__name__
        raise _unpicklable(f"it wraps a {wrapped} object, which has no importable name")
    name = f"{module}.{qualname}"
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise _unpicklable(f"{name} is defined inside a function (or is a lambda)")
    try:
        found: Any = sys.modules.get(module) or importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as e:
        raise _unpicklable(f"{name} cannot be found by importing it ({e})") from None
    if found is not obj:
        raise _unpicklable(
            f"{name} is another object ({type(found).__name__}), not this transformed "
            "function: it was transformed again under another name, or the name was "
            f"rebound. Decorate the definition itself, or assign the result to that name "
            f"(`{qualname} = filter_jit({qualname})`)"
        )
    return qualname  # pickle's global lookup: `module.qualname`, checked to be `obj`


def _rewrap(cls: type, options: tuple[Any, ...], inner: Any) -> Any:
    return cls(inner, *options)


def _unpicklable(reason: str) -> pickle.PicklingError:
    return pickle.PicklingError(
        f"Cannot pickle this transformed function: {reason}. Transformed functions pickle by "
        "reference, like Python functions: define it at the top level of an importable module "
        "(`@treemod.filter_jit` on a module-level def), or pickle the plain function and apply "
        "the transform after unpickling."
    )


class PytreeBoundMethod:
    """Base class of a method bound to a module as a pytree whose child is the module (the
    compat namespace's `BoundMethod` is one). The transforms and `treemod.debug` treat an
    instance as they treat a Python bound method: `__self__` is traced as a pytree and
    `__func__` is what is called. Subclasses set both attributes."""

    __slots__ = ()
    __func__: Callable[..., Any]
    __self__: Any


def split_fn(fn: Any) -> tuple[Any, Callable[..., Any] | None]:
    """Normalise a callable into `(fn_tree, call)` once, at wrap time.

    `fn_tree` is the part of the callable that is a pytree (a Module, or the module of a bound
    method), whose arrays are traced like arguments; `None` for plain functions. `call` is the
    function to call as `call(fn_tree, *args, **kwargs)`, or `None` to call `fn_tree` itself.
    """
    if isinstance(fn, types.MethodType | PytreeBoundMethod):
        owner = fn.__self__
        if jtu.treedef_is_leaf(jtu.tree_structure(owner)):
            return None, None
        return owner, fn.__func__
    if jtu.treedef_is_leaf(jtu.tree_structure(fn)):
        return None, None
    return fn, None
