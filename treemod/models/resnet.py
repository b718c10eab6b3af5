# exports: ResNetModel, ResNetForImageClassification
"""ResNet as `transformers` builds it: `ResNetModel`, `ResNetForImageClassification`.

Implemented in `_resnet.py`.
"""

from treemod.models._resnet import (
    ResNetForImageClassification,
    ResNetModel,
)

__all__ = [
    "ResNetModel",
    "ResNetForImageClassification",
]
