"""The compat namespace's `Module`: treemod's, with shape checks off for user subclasses.

Equinox does not check the jaxtyping annotations of a module's fields and methods; treemod does
(`treemod.shape_checks`). So that Equinox programs run unchanged, classes defined against
`treemod.compat.equinox.Module` are not checked unless they ask for it:
`class Model(eqx.Module, shapecheck=True)` (or decorate with `treemod.shapecheck`).
`isinstance(x, eqx.Module)` is true of every treemod module, as every Equinox layer is an
`eqx.Module`.
"""

from __future__ import annotations

from typing import Any

from treemod._module.bound_method import bind_methods
from treemod._module.module import Module as _Module

__all__ = ["Module"]

_Meta: Any = type(_Module)


class _CompatMeta(_Meta):
    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any):
        bind_methods(namespace)  # `model.method` is a pytree of `model`, as in Equinox
        return super().__new__(mcs, name, bases, namespace, **kwargs)

    @property
    def __abstractvars__(cls) -> frozenset[str]:
        """Equinox's name: the `AbstractVar`s this class leaves unprovided."""
        return frozenset(cls.__tm_abstract_vars__ - cls.__tm_abstract_class_vars__)

    @property
    def __abstractclassvars__(cls) -> frozenset[str]:
        """Equinox's name: the `AbstractClassVar`s this class leaves unprovided."""
        return frozenset(cls.__tm_abstract_vars__ & cls.__tm_abstract_class_vars__)

    def __instancecheck__(cls, instance: Any) -> bool:
        if cls is Module:
            return _Module in type(instance).__mro__
        return super().__instancecheck__(instance)

    def __subclasscheck__(cls, subclass: Any) -> bool:
        if cls is Module:
            return _Module in getattr(subclass, "__mro__", ())
        return super().__subclasscheck__(subclass)


class Module(_Module, metaclass=_CompatMeta, shapecheck=False):
    """`treemod.Module` for Equinox code: subclasses skip shape checks unless they opt in.

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
