# exports: ViTModel, ViTForImageClassification
"""ViT: `ViTModel`, `ViTForImageClassification`, with `transformers` 5's module names.

Implemented in `_vit.py`.
"""

from treemod.models._vit import (
    ViTForImageClassification,
    ViTModel,
)

__all__ = [
    "ViTModel",
    "ViTForImageClassification",
]
