# exports: TorchvisionResNet, resnet18, resnet34, resnet50, resnet101, resnet152, resnext50_32x4d, resnext101_32x8d, resnext101_64x4d, wide_resnet50_2, wide_resnet101_2  # noqa: E501
"""torchvision's ResNets (ResNet, ResNeXt, Wide ResNet) with torchvision's parameter names.

Implemented in `_resnet_torchvision.py`.
"""

from treemod.models._resnet_torchvision import (
    TorchvisionResNet,
    resnet18,
    resnet34,
    resnet50,
    resnet101,
    resnet152,
    resnext50_32x4d,
    resnext101_32x8d,
    resnext101_64x4d,
    wide_resnet50_2,
    wide_resnet101_2,
)

__all__ = [
    "TorchvisionResNet",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "resnext50_32x4d",
    "resnext101_32x8d",
    "resnext101_64x4d",
    "wide_resnet50_2",
    "wide_resnet101_2",
]
