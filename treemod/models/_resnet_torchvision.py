"""torchvision's ResNets (`resnet18` ... `resnet152`, ResNeXt, Wide ResNet), with its names.

The attribute paths are torchvision's module names (`conv1`, `bn1`, `layer1.0.conv1`,
`layer1.0.downsample.0`, `fc`), so `tm.load_state_dict(model, tv_model.state_dict())` loads a
torchvision checkpoint as it is, BatchNorm's running statistics included, and
`tm.state_dict(model)` is a state dict torchvision's `load_state_dict` accepts. The
bottleneck strides its 3x3 convolution (torchvision's "ResNet V1.5"). Built in inference mode.
"""

# exports: TorchvisionResNet, resnet18, resnet34, resnet50, resnet101, resnet152, resnext50_32x4d, resnext101_32x8d, resnext101_64x4d, wide_resnet50_2, wide_resnet101_2  # noqa: E501

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module
from treemod.models._attention_parts import projection_keys, unwrapped

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


def _bn(n: int, dtype: Any) -> nn.BatchNorm:
    return nn.BatchNorm(n, inference=True, dtype=dtype)


def _conv(
    n_in: int, n_out: int, k: int, stride: int, dtype: Any, key: PRNGKeyArray, groups: int = 1
) -> nn.Conv2d:
    conv: nn.Conv2d = nn.Conv2d(
        n_in, n_out, k, stride, k // 2, groups=groups, use_bias=False, dtype=dtype, key=key
    )
    return conv


class BasicBlock(Module):
    """Two 3x3 convolutions with BatchNorm, and the residual (torchvision's `BasicBlock`)."""

    conv1: nn.Conv2d
    bn1: nn.BatchNorm
    conv2: nn.Conv2d
    bn2: nn.BatchNorm
    downsample: tuple[nn.Conv2d, nn.BatchNorm] | None

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The block's output (`key`: the convolutions', for LoRA dropout)."""
        k1, k2, k_down = projection_keys(key, 3)
        h = jax.nn.relu(self.bn1(self.conv1(x, key=k1)))
        h = self.bn2(self.conv2(h, key=k2))
        if self.downsample is not None:
            x = self.downsample[1](self.downsample[0](x, key=k_down))
        return jax.nn.relu(h + x)


class Bottleneck(Module):
    """1x1, 3x3 (strided, grouped), 1x1 convolutions with BatchNorm (torchvision's `Bottleneck`)."""

    conv1: nn.Conv2d
    bn1: nn.BatchNorm
    conv2: nn.Conv2d
    bn2: nn.BatchNorm
    conv3: nn.Conv2d
    bn3: nn.BatchNorm
    downsample: tuple[nn.Conv2d, nn.BatchNorm] | None

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The block's output (`key`: the convolutions', for LoRA dropout)."""
        k1, k2, k3, k_down = projection_keys(key, 4)
        h = jax.nn.relu(self.bn1(self.conv1(x, key=k1)))
        h = jax.nn.relu(self.bn2(self.conv2(h, key=k2)))
        h = self.bn3(self.conv3(h, key=k3))
        if self.downsample is not None:
            x = self.downsample[1](self.downsample[0](x, key=k_down))
        return jax.nn.relu(h + x)


class TorchvisionResNet(Module):
    """torchvision's `ResNet`: stem, four stages of blocks, average pooling, `fc`.

    Build it with `resnet18`, `resnet50`, ... (or directly, like torchvision's constructor);
    call it on `(batch, 3, height, width)` images to get `(batch, num_classes)` logits.

    Arguments:
        block: `"basic"` or `"bottleneck"`.
        layers: the number of blocks of each of the four stages.
        num_classes: the classifier's outputs.
        groups: the 3x3 convolutions' groups (ResNeXt).
        width_per_group: the bottleneck width per group (64 for ResNet, 128 for Wide ResNet).
        dtype: the parameters' dtype (default float32).
        key: the PRNG key.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models import resnet18
        >>> model = resnet18(num_classes=10, key=jax.random.key(0))
        >>> model(jnp.ones((1, 3, 32, 32))).shape
        (1, 10)
        >>> model.layer2[0].downsample[0].weight.shape
        (128, 64, 1, 1)
    """

    conv1: nn.Conv2d
    bn1: nn.BatchNorm
    layer1: tuple[Any, ...]
    layer2: tuple[Any, ...]
    layer3: tuple[Any, ...]
    layer4: tuple[Any, ...]
    fc: nn.Linear
    maxpool: nn.MaxPool2d

    def __init__(
        self,
        block: str,
        layers: tuple[int, int, int, int],
        num_classes: int = 1000,
        groups: int = 1,
        width_per_group: int = 64,
        dtype: Any = None,
        *,
        key: PRNGKeyArray,
    ) -> None:
        if block not in ("basic", "bottleneck"):
            raise ValueError(
                f"TorchvisionResNet: block must be 'basic' or 'bottleneck'; got {block!r}."
            )
        if len(layers) != 4 or not all(isinstance(n, int) and n >= 1 for n in layers):
            raise ValueError(
                f"TorchvisionResNet: layers must be four positive block counts; got {layers!r}."
            )
        if block == "basic" and (groups != 1 or width_per_group != 64):
            raise ValueError(
                "TorchvisionResNet: basic blocks only support groups=1 and width_per_group=64 "
                "(as in torchvision)."
            )
        expansion = 1 if block == "basic" else 4
        k_stem, k_fc, *k_stages = jax.random.split(key, 6)
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, use_bias=False, dtype=dtype, key=k_stem)
        self.bn1 = _bn(64, dtype)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        n_in = 64
        stages = []
        for i, (planes, depth) in enumerate(zip((64, 128, 256, 512), layers, strict=True)):
            stride = 1 if i == 0 else 2
            keys = jax.random.split(k_stages[i], depth)
            blocks: list[BasicBlock | Bottleneck] = []
            for j in range(depth):
                s = stride if j == 0 else 1
                if block == "basic":
                    blocks.append(_basic(n_in, planes, s, dtype, keys[j]))
                else:
                    width = int(planes * (width_per_group / 64.0)) * groups
                    blocks.append(_bottleneck(n_in, planes, width, groups, s, dtype, keys[j]))
                n_in = planes * expansion
            stages.append(tuple(blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(512 * expansion, num_classes, dtype=dtype, key=k_fc)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, 3, height, width)` images to `(batch, num_classes)` logits.

        Arguments:
            x: the images (cast to the parameters' dtype).
            key: the convolutions' and `fc`'s dropout keys are split from it (LoRA dropout in
                training mode; the network has no dropout of its own).

        Returns:
            The logits.
        """
        x = jnp.asarray(x).astype(unwrapped(self.conv1).weight.dtype)
        stages = (self.layer1, self.layer2, self.layer3, self.layer4)
        k_conv, k_fc, *k_blocks = projection_keys(key, 2 + sum(len(s) for s in stages))
        x = self.maxpool(jax.nn.relu(self.bn1(self.conv1(x, key=k_conv))))
        blocks = iter(k_blocks)
        for stage in stages:
            for block in stage:
                x = block(x, key=next(blocks))
        return self.fc(jnp.mean(x, axis=(-2, -1)), key=k_fc)


def _downsample(
    n_in: int, n_out: int, stride: int, dtype: Any, key: PRNGKeyArray
) -> tuple[nn.Conv2d, nn.BatchNorm] | None:
    if stride == 1 and n_in == n_out:
        return None
    return (_conv(n_in, n_out, 1, stride, dtype, key), _bn(n_out, dtype))


def _basic(n_in: int, planes: int, stride: int, dtype: Any, key: PRNGKeyArray) -> BasicBlock:
    k1, k2, k3 = jax.random.split(key, 3)
    return BasicBlock(
        _conv(n_in, planes, 3, stride, dtype, k1),
        _bn(planes, dtype),
        _conv(planes, planes, 3, 1, dtype, k2),
        _bn(planes, dtype),
        _downsample(n_in, planes, stride, dtype, k3),
    )


def _bottleneck(
    n_in: int, planes: int, width: int, groups: int, stride: int, dtype: Any, key: PRNGKeyArray
) -> Bottleneck:
    k1, k2, k3, k4 = jax.random.split(key, 4)
    n_out = planes * 4
    return Bottleneck(
        _conv(n_in, width, 1, 1, dtype, k1),
        _bn(width, dtype),
        _conv(width, width, 3, stride, dtype, k2, groups=groups),
        _bn(width, dtype),
        _conv(width, n_out, 1, 1, dtype, k3),
        _bn(n_out, dtype),
        _downsample(n_in, n_out, stride, dtype, k4),
    )


def resnet18(*, num_classes: int = 1000, dtype: Any = None, key: PRNGKeyArray) -> TorchvisionResNet:
    """torchvision's `resnet18` (ResNet-18), random weights; loads torchvision's.

    Arguments:
        num_classes: the classifier's outputs (torchvision's default, 1000).
        dtype: the parameters' dtype (default float32).
        key: the PRNG key.

    Returns:
        A `TorchvisionResNet` in inference mode.

    Example:
        >>> import jax, treemod as tm
        >>> from treemod.models import resnet18
        >>> shapes = tm.filter_eval_shape(lambda: resnet18(key=jax.random.key(0)))
        >>> shapes.fc.weight.shape[0]
        1000
    """
    return TorchvisionResNet("basic", (2, 2, 2, 2), num_classes, 1, 64, dtype, key=key)


def resnet34(*, num_classes: int = 1000, dtype: Any = None, key: PRNGKeyArray) -> TorchvisionResNet:
    """torchvision's `resnet34` (ResNet-34), random weights; loads torchvision's.

    Arguments:
        num_classes: the classifier's outputs (torchvision's default, 1000).
        dtype: the parameters' dtype (default float32).
        key: the PRNG key.

    Returns:
        A `TorchvisionResNet` in inference mode.

    Example:
        >>> import jax, treemod as tm
        >>> from treemod.models import resnet34
        >>> shapes = tm.filter_eval_shape(lambda: resnet34(key=jax.random.key(0)))
        >>> shapes.fc.weight.shape[0]
        1000
    """
    return TorchvisionResNet("basic", (3, 4, 6, 3), num_classes, 1, 64, dtype, key=key)


def resnet50(*, num_classes: int = 1000, dtype: Any = None, key: PRNGKeyArray) -> TorchvisionResNet:
    """torchvision's `resnet50` (ResNet-50), random weights; loads torchvision's.

    Arguments:
        num_classes: the classifier's outputs (torchvision's default, 1000).
        dtype: the parameters' dtype (default float32).
        key: the PRNG key.

    Returns:
        A `TorchvisionResNet` in inference mode.

    Example:
        >>> import jax, treemod as tm
        >>> from treemod.models import resnet50
        >>> shapes = tm.filter_eval_shape(lambda: resnet50(key=jax.random.key(0)))
        >>> shapes.fc.weight.shape[0]
        1000
    """
    return TorchvisionResNet("bottleneck", (3, 4, 6, 3), num_classes, 1, 64, dtype, key=key)


def resnet101(
    *, num_classes: int = 1000, dtype: Any = None, key: PRNGKeyArray
) -> TorchvisionResNet:
    """torchvision's `resnet101` (ResNet-101), random weights; loads torchvision's.

    Arguments:
        num_classes: the classifier's outputs (torchvision's default, 1000).
        dtype: the parameters' dtype (default float32).
        key: the PRNG key.

    Returns:
        A `TorchvisionResNet` in inference mode.

    Example:
        >>> import jax, treemod as tm
        >>> from treemod.models import resnet101
        >>> shapes = tm.filter_eval_shape(lambda: resnet101(key=jax.random.key(0)))
        >>> shapes.fc.weight.shape[0]
        1000
    """
    return TorchvisionResNet("bottleneck", (3, 4, 23, 3), num_classes, 1, 64, dtype, key=key)


def resnet152(
    *, num_classes: int = 1000, dtype: Any = None, key: PRNGKeyArray
) -> TorchvisionResNet:
    """torchvision's `resnet152` (ResNet-152), random weights; loads torchvision's.

    Arguments:
        num_classes: the classifier's outputs (torchvision's default, 1000).
        dtype: the parameters' dtype (default float32).
        key: the PRNG key.

    Returns:
        A `TorchvisionResNet` in inference mode.

    Example:
        >>> import jax, treemod as tm
        >>> from treemod.models import resnet152
        >>> shapes = tm.filter_eval_shape(lambda: resnet152(key=jax.random.key(0)))
        >>> shapes.fc.weight.shape[0]
        1000
    """
    return TorchvisionResNet("bottleneck", (3, 8, 36, 3), num_classes, 1, 64, dtype, key=key)


def resnext50_32x4d(
    *, num_classes: int = 1000, dtype: Any = None, key: PRNGKeyArray
) -> TorchvisionResNet:
    """torchvision's `resnext50_32x4d` (ResNeXt-50 32x4d), random weights; loads torchvision's.

    Arguments:
        num_classes: the classifier's outputs (torchvision's default, 1000).
        dtype: the parameters' dtype (default float32).
        key: the PRNG key.

    Returns:
        A `TorchvisionResNet` in inference mode.

    Example:
        >>> import jax, treemod as tm
        >>> from treemod.models import resnext50_32x4d
        >>> shapes = tm.filter_eval_shape(lambda: resnext50_32x4d(key=jax.random.key(0)))
        >>> shapes.fc.weight.shape[0]
        1000
    """
    return TorchvisionResNet("bottleneck", (3, 4, 6, 3), num_classes, 32, 4, dtype, key=key)


def resnext101_32x8d(
    *, num_classes: int = 1000, dtype: Any = None, key: PRNGKeyArray
) -> TorchvisionResNet:
    """torchvision's `resnext101_32x8d` (ResNeXt-101 32x8d), random weights; loads torchvision's.

    Arguments:
        num_classes: the classifier's outputs (torchvision's default, 1000).
        dtype: the parameters' dtype (default float32).
        key: the PRNG key.

    Returns:
        A `TorchvisionResNet` in inference mode.

    Example:
        >>> import jax, treemod as tm
        >>> from treemod.models import resnext101_32x8d
        >>> shapes = tm.filter_eval_shape(lambda: resnext101_32x8d(key=jax.random.key(0)))
        >>> shapes.fc.weight.shape[0]
        1000
    """
    return TorchvisionResNet("bottleneck", (3, 4, 23, 3), num_classes, 32, 8, dtype, key=key)


def resnext101_64x4d(
    *, num_classes: int = 1000, dtype: Any = None, key: PRNGKeyArray
) -> TorchvisionResNet:
    """torchvision's `resnext101_64x4d` (ResNeXt-101 64x4d), random weights; loads torchvision's.

    Arguments:
        num_classes: the classifier's outputs (torchvision's default, 1000).
        dtype: the parameters' dtype (default float32).
        key: the PRNG key.

    Returns:
        A `TorchvisionResNet` in inference mode.

    Example:
        >>> import jax, treemod as tm
        >>> from treemod.models import resnext101_64x4d
        >>> shapes = tm.filter_eval_shape(lambda: resnext101_64x4d(key=jax.random.key(0)))
        >>> shapes.fc.weight.shape[0]
        1000
    """
    return TorchvisionResNet("bottleneck", (3, 4, 23, 3), num_classes, 64, 4, dtype, key=key)


def wide_resnet50_2(
    *, num_classes: int = 1000, dtype: Any = None, key: PRNGKeyArray
) -> TorchvisionResNet:
    """torchvision's `wide_resnet50_2` (Wide ResNet-50-2), random weights; loads torchvision's.

    Arguments:
        num_classes: the classifier's outputs (torchvision's default, 1000).
        dtype: the parameters' dtype (default float32).
        key: the PRNG key.

    Returns:
        A `TorchvisionResNet` in inference mode.

    Example:
        >>> import jax, treemod as tm
        >>> from treemod.models import wide_resnet50_2
        >>> shapes = tm.filter_eval_shape(lambda: wide_resnet50_2(key=jax.random.key(0)))
        >>> shapes.fc.weight.shape[0]
        1000
    """
    return TorchvisionResNet("bottleneck", (3, 4, 6, 3), num_classes, 1, 128, dtype, key=key)


def wide_resnet101_2(
    *, num_classes: int = 1000, dtype: Any = None, key: PRNGKeyArray
) -> TorchvisionResNet:
    """torchvision's `wide_resnet101_2` (Wide ResNet-101-2), random weights; loads torchvision's.

    Arguments:
        num_classes: the classifier's outputs (torchvision's default, 1000).
        dtype: the parameters' dtype (default float32).
        key: the PRNG key.

    Returns:
        A `TorchvisionResNet` in inference mode.

    Example:
        >>> import jax, treemod as tm
        >>> from treemod.models import wide_resnet101_2
        >>> shapes = tm.filter_eval_shape(lambda: wide_resnet101_2(key=jax.random.key(0)))
        >>> shapes.fc.weight.shape[0]
        1000
    """
    return TorchvisionResNet("bottleneck", (3, 4, 23, 3), num_classes, 1, 128, dtype, key=key)
