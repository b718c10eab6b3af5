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

from treemod._module.bound_method import BoundMethod, bind_methods
from treemod._module.module import Module as _Module

__all__ = ["Module"]

_Meta: Any = type(_Module)
_REFUSED_STRINGS = ("AbstractVar[", "AbstractClassVar[")


class _CompatMeta(_Meta):
    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any):
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
        bind_methods(namespace)  # `model.method` is a pytree of `model`, as in Equinox
        cls = super().__new__(mcs, name, bases, namespace, **kwargs)
        # As in Equinox, an annotation without a value (`x: ClassVar[bool]`) provides a base's
        # AbstractClassVar; treemod.Module waits for a value.
        declared = cls.__tm_abstract_class_vars__.intersection(
            namespace.get("__annotations__", {})  # the abstract ones were removed
        )
        if cls.__tm_abstract_vars__ & declared:
            cls.__tm_abstract_vars__ = cls.__tm_abstract_vars__ - declared
        return cls

    @property
    def __abstractvars__(cls) -> frozenset[str]:
        """Equinox's name: the `AbstractVar`s this class leaves unprovided."""
        return frozenset(cls.__tm_abstract_vars__ - cls.__tm_abstract_class_vars__)

    @property
    def __abstractclassvars__(cls) -> frozenset[str]:
        """Equinox's name: the `AbstractClassVar`s this class leaves unprovided."""
        return frozenset(cls.__tm_abstract_vars__ & cls.__tm_abstract_class_vars__)

    def __instancecheck__(cls, instance: Any) -> bool:
        if cls is Module:  # every treemod module, and bound methods (modules in Equinox)
            kind = type(instance)
            return _Module in kind.__mro__ or kind is BoundMethod
        return super().__instancecheck__(instance)

    def __subclasscheck__(cls, subclass: Any) -> bool:
        if cls is Module:
            return _Module in getattr(subclass, "__mro__", ())
        return super().__subclasscheck__(subclass)


class Module(_Module, metaclass=_CompatMeta, shapecheck=False):
    """`treemod.Module` for Equinox code: subclasses skip shape checks unless they opt in.

    As in Equinox, a field may provide a base's `AbstractClassVar`, and stringified abstract
    annotations raise `NotImplementedError`; `isinstance(model.method, eqx.Module)` is true.

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

    __tm_strict_class_vars__: ClassVar[bool] = False
