"""`isinstance` across the two namespaces: a treemod layer is an instance of its compat class.

Equinox code tests layer types (`isinstance(x, eqx.nn.Linear)` in a custom initialiser, say).
The compat classes that only adapt a treemod layer's signature or call declare that layer as
`_treemod_layer`, so layers built by treemod itself (the projections inside
`MultiheadAttention`, the layers of `WeightNorm`, ...) pass that test too. The check reads the
class's MRO, once per `isinstance` call.
"""

from __future__ import annotations

from typing import Any

from treemod._module.module import Module

__all__ = ["CompatLayerMeta"]

_Meta: Any = type(Module)


class CompatLayerMeta(_Meta):
    """Metaclass of compat layers: instances of `_treemod_layer` count as instances."""

    def __instancecheck__(cls, instance: Any) -> bool:
        base = cls.__dict__.get("_treemod_layer")
        if base is not None:
            return base in type(instance).__mro__
        return super().__instancecheck__(instance)

    def __subclasscheck__(cls, subclass: Any) -> bool:
        base = cls.__dict__.get("_treemod_layer")
        if base is not None:
            return base in getattr(subclass, "__mro__", ())
        return super().__subclasscheck__(subclass)
