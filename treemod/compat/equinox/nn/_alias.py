"""One layer type across the two namespaces: compat layers and the treemod layers they adapt.

Equinox code tests layer types (`isinstance(x, eqx.nn.Linear)` in a custom initialiser, say).
The compat classes that only adapt a treemod layer's signature or call declare that layer as
`_treemod_layer`, so layers built by treemod itself (the projections inside
`MultiheadAttention`, the layers of `WeightNorm`, ...) pass that test too. The check reads the
class's MRO, once per `isinstance` call.

Layers built through the namespace are the compat classes' (a user's `eqx.nn.Linear` and the
projections inside `eqx.nn.MultiheadAttention` or `eqx.nn.MLP`, which build theirs with the
compat `Linear`), so they have one pytree type: `tree_equal`, `tree_at` and `nn.Shared` see
them as the same kind of node. The compat classes are not shape-checked, nor are their
subclasses (the class option `shapecheck=False`, inherited), as nothing is in Equinox.
"""

from __future__ import annotations

from typing import Any

from treemod._compat_api import ModuleMeta

__all__ = ["CompatLayerMeta"]


class CompatLayerMeta(ModuleMeta):
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
