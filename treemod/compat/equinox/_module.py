"""The compat namespace's `Module`: treemod's, with shape checks off for user subclasses.

Equinox does not check the jaxtyping annotations of a module's fields and methods; treemod does
(`treemod.shape_checks`). So that Equinox programs run unchanged, classes defined against
`treemod.compat.equinox.Module` are not checked unless they ask for it:
`class Model(eqx.Module, shapecheck=True)` (or decorate with `treemod.shapecheck`).
`isinstance(x, eqx.Module)` is true of every treemod module, as every Equinox layer is an
`eqx.Module`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax.tree_util as jtu

from treemod import Module as _Module
from treemod import filter_custom_jvp
from treemod._compat_api import ModuleMeta, TransformedFunction, check_suspect_value, module_info

from ._bound_method import BoundMethod, bind_inherited_methods, bind_methods
from ._pretty import tree_pformat
from ._tree import tree_equal

__all__ = ["Module", "StrictConfig", "module_update_wrapper"]

_REFUSED_STRINGS = ("AbstractVar[", "AbstractClassVar[")


class _CompatMeta(ModuleMeta):
    # An attribute of the classes it makes.
    __eqx_is_abstract__: bool

    def __new__(
        mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any
    ) -> _CompatMeta:
        for key, annotation in namespace.get("__annotations__", {}).items():
            if isinstance(annotation, str) and annotation.startswith(_REFUSED_STRINGS):
                # Equinox refuses these; treemod.Module accepts them (and so does this class
                # for qualified ones, `"eqx.AbstractVar[int]"`, which Equinox takes as fields).
                raise NotImplementedError(
                    f"{name}.{key}: stringified abstract annotations ({annotation!r}, as under "
                    "`from __future__ import annotations`) are not supported by eqx.Module, as "
                    "in Equinox. Use an unquoted annotation, or subclass treemod.Module, which "
                    "supports them."
                )
        # Equinox's class options: `strict=` (ignored since Equinox 0.11; `None`, what
        # `StrictConfig(force_abstact=True)` gives, means `is_abstract=True`) and `is_abstract=`.
        strict = kwargs.pop("strict", False)
        is_abstract = bool(kwargs.pop("is_abstract", False)) or strict is None
        bind_methods(namespace)  # `model.method` is a pytree of `model`, as in Equinox
        cls: _CompatMeta = super().__new__(mcs, name, bases, namespace, **kwargs)
        cls.__eqx_is_abstract__ = is_abstract
        bind_inherited_methods(cls)  # a mixin's methods too, as Equinox's `__getattribute__`
        return cls

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls.__eqx_is_abstract__:
            raise TypeError(
                f"Cannot instantiate abstract `equinox.Module` {cls.__qualname__}: it is declared "
                "with `is_abstract=True` (or `strict=eqx.StrictConfig(force_abstact=True)`). "
                "Instantiate a subclass."
            )
        module = super().__call__(*args, **kwargs)
        for name, value in vars(module).items():  # `self.f = self.method`: a cycle
            if type(value) is BoundMethod and value.__self__ is module:
                check_suspect_value(cls, module, name, value)
        return module

    @property
    def __abstractvars__(cls) -> frozenset[str]:
        """Equinox's name: the `AbstractVar`s this class leaves unprovided."""
        info = module_info(cls)
        return frozenset(info.abstract_vars - info.abstract_class_vars)

    @property
    def __abstractclassvars__(cls) -> frozenset[str]:
        """Equinox's name: the `AbstractClassVar`s this class leaves unprovided."""
        info = module_info(cls)
        return frozenset(info.abstract_vars & info.abstract_class_vars)

    def __instancecheck__(cls, instance: Any) -> bool:
        if cls is Module:  # every treemod module, and what Equinox makes modules: bound
            kind = type(instance)  # methods and the filtered transforms' wrappers
            return (
                _Module in kind.__mro__
                or kind is BoundMethod
                or (issubclass(kind, TransformedFunction) and kind is not filter_custom_jvp)
            )
        return super().__instancecheck__(instance)

    def __subclasscheck__(cls, subclass: Any) -> bool:
        if cls is Module:
            return _Module in getattr(subclass, "__mro__", ())
        return super().__subclasscheck__(subclass)


# `strict_abstract_class_vars=False`: Equinox's rule, a field or an annotation without a value
# (`x: ClassVar[bool]`) provides a base's AbstractClassVar.
class Module(_Module, metaclass=_CompatMeta, shapecheck=False, strict_abstract_class_vars=False):
    """`treemod.Module` for Equinox code: subclasses skip shape checks unless they opt in.

    As in Equinox, a field may provide a base's `AbstractClassVar`, and stringified abstract
    annotations raise `NotImplementedError`; `model.method` (a mixin's methods too) is a pytree
    of `model` and an `eqx.Module`, and so is a filtered transform's wrapper
    (`eqx.filter_jit(f)`). The class options `is_abstract=True` (the class cannot be
    instantiated, its subclasses can) and `strict=` (ignored, as by Equinox since 0.11) are
    accepted. `repr(model)` is Equinox's `tree_pformat(model)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxtyping import Array, Float
        >>> import treemod as tm
        >>> import treemod.compat.equinox as eqx
        >>> class Scale(eqx.Module):
        ...     factor: Float[Array, "n"]
        ...     def __call__(self, x: Float[Array, "n"]) -> Float[Array, "n"]:
        ...         return self.factor * x
        >>> Scale(jnp.arange(3))(jnp.arange(3))   # integers: not enforced, as in Equinox
        Array([0, 1, 4], dtype=int32)
        >>> isinstance(tm.nn.Linear(2, 2, key=jax.random.key(0)), eqx.Module)
        True
    """

    __eqx_is_abstract__: ClassVar[bool] = False

    def __eq__(self, other: object) -> Any:  # Equinox's result types (a JAX scalar for arrays)
        return tree_equal(self, other)

    __hash__ = _Module.__hash__

    def __repr__(self) -> str:  # Equinox's `tree_pformat`: 80 columns, custom_jvp unwrapped
        return tree_pformat(self)


def StrictConfig(force_abstact: bool = False, **kwargs: Any) -> bool | None:  # noqa: N802
    """Equinox's legacy `strict=` value: `class A(eqx.Module, strict=StrictConfig(...))`.

    Arguments:
        force_abstact: make the class abstract (Equinox's spelling), as `is_abstract=True` does.
        **kwargs: Equinox's other legacy options, ignored as Equinox ignores them.

    Returns:
        `None` (abstract) when `force_abstact`, else `False`.

    Example:
        >>> import treemod.compat.equinox as eqx
        >>> class Base(eqx.Module, strict=eqx.StrictConfig(force_abstact=True)):
        ...     x: int
        >>> class Concrete(Base):
        ...     pass
        >>> Concrete(1)
        Concrete(x=1)
    """
    del kwargs
    return None if force_abstact else False


_WRAPPER_NAMES = ("__module__", "__name__", "__qualname__", "__doc__", "__annotations__")


def module_update_wrapper(wrapper: Any, wrapped: Any = None) -> Any:
    """`functools.update_wrapper` for a module: a copy of `wrapper` with `wrapped`'s names.

    Arguments:
        wrapper: a module whose class defines `__wrapped__` as a property.
        wrapped: the callable it wraps; `wrapper.__wrapped__` when omitted.

    Returns:
        A copy of `wrapper` (the input is not changed) with `__module__`, `__name__`,
        `__qualname__`, `__doc__` and `__annotations__` taken from `wrapped`. Copies made by
        flattening (JAX transforms) keep the fields only, not these names.

    Example:
        >>> import treemod.compat.equinox as eqx
        >>> class Wrapper(eqx.Module):
        ...     fn: object
        ...     def __call__(self, *args):
        ...         return self.fn(*args)
        ...     @property
        ...     def __wrapped__(self):
        ...         return self.fn
        >>> def double(x):
        ...     "Twice x."
        ...     return 2 * x
        >>> w = eqx.module_update_wrapper(Wrapper(double))
        >>> w.__name__, w.__doc__, w(3)
        ('double', 'Twice x.', 6)
    """
    cls = type(wrapper)
    if not isinstance(getattr(cls, "__wrapped__", None), property):
        raise ValueError(
            f"module_update_wrapper: {cls.__qualname__} must define `__wrapped__` as a property "
            "(returning the wrapped callable), as in Equinox."
        )
    if wrapped is None:
        wrapped = wrapper.__wrapped__
    leaves, treedef = jtu.tree_flatten(wrapper)
    copy = jtu.tree_unflatten(treedef, leaves)
    for name in _WRAPPER_NAMES:
        try:
            value = getattr(wrapped, name)
        except AttributeError:
            continue
        object.__setattr__(copy, name, value)
    return copy
