# exports: Dinov2Model, Dinov2ForImageClassification
"""DINOv2: `Dinov2Model`, `Dinov2ForImageClassification`, with `transformers` 5's module names.

Implemented in `_dinov2.py`.
"""

from treemod.models._dinov2 import (
    Dinov2ForImageClassification,
    Dinov2Model,
)

__all__ = [
    "Dinov2Model",
    "Dinov2ForImageClassification",
]
