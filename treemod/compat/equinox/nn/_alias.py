"""One layer type across the two namespaces: compat layers and the treemod layers they adapt.

Equinox code tests layer types (`isinstance(x, eqx.nn.Linear)` in a custom initialiser, say).
The compat classes that only adapt a treemod layer's signature or call declare that layer as
`_treemod_layer`, so layers built by treemod itself (the projections inside
`MultiheadAttention`, the layers of `WeightNorm`, ...) pass that test too. The check reads the
class's MRO, once per `isinstance` call.

A compat class that adapts only the constructor (`_builds_treemod_layer = True`, e.g.
`eqx.nn.Linear`) returns an instance of the treemod layer itself, so a layer the user builds
and one treemod builds inside another layer have the same pytree type: `tree_equal`, `tree_at`
and `nn.Shared` see them as the same kind of node. Subclasses the user defines keep their class.
"""

from __future__ import annotations

from typing import Any

from treemod._compat_api import ModuleMeta

__all__ = ["CompatLayerMeta"]


class CompatLayerMeta(ModuleMeta):
    """Metaclass of compat layers: instances of `_treemod_layer` count as instances."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        layer = super().__call__(*args, **kwargs)
        if cls.__dict__.get("_builds_treemod_layer", False):
            # Same fields and methods (the compat class adds only `__init__`): the instance
            # becomes the treemod layer's, so both namespaces' layers flatten alike.
            object.__setattr__(layer, "__class__", cls.__dict__["_treemod_layer"])
        return layer

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
