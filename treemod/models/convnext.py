# exports: ConvNextModel, ConvNextForImageClassification
"""ConvNeXt: `ConvNextModel`, `ConvNextForImageClassification`, with `transformers`' names.

Implemented in `_convnext.py`.
"""

from treemod.models._convnext import (
    ConvNextForImageClassification,
    ConvNextModel,
)

__all__ = [
    "ConvNextModel",
    "ConvNextForImageClassification",
]
