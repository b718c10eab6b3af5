"""torchvision's ResNets (`treemod.models.resnet18`, ...) against torchvision itself.

Reference: torchvision's models with random weights, run twice in training mode so that every
BatchNorm's running statistics (and `num_batches_tracked`) differ from their defaults, then
compared in `eval()` mode; torchvision's `state_dict()` loads with `tm.load_state_dict` as it
is, and `tm.state_dict` loads back into torchvision. Float32 logits agree within 1e-5 relative.
The larger depths are checked by name and shape against torchvision models built on the meta
device (no memory, no compile).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
import torch
import torchvision

import treemod as tm
from treemod.models import resnet_torchvision as zoo

# Inside a trace every convolution runs through one nested `filter_jit` of `Conv._flat`, shared
# by all Conv layers of the session; the many ResNet shapes of these tests pass its 64-version
# warning, which reports that cache (treemod/nn/_batching.py), not a retrace of these models.
#
# Agreement with the reference library's own implementation: `slow`, run on the newest end only
# (DEVELOPERS.md, "What the oldest end runs"); the layers, transforms and loading code it goes
# through are tested on both ends by their own files.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings(
        r"ignore:filter_jit\(\w+\._flat\) has now compiled"
        ":treemod._transforms.jit_cache.RecompileWarning"
    ),
]


def _relative_error(got: Any, ref: torch.Tensor) -> float:
    ref_np = ref.detach().numpy()
    return float(np.abs(np.asarray(got) - ref_np).max() / np.abs(ref_np).max())


def _trained_torchvision(name: str, num_classes: int) -> Any:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(4, 3, 32, 32) * 2 + 0.5)
    return model.eval()


@tm.filter_jit
def _run(model: Any, x: Any) -> jax.Array:
    return model(x)


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_loads_torchvision_state_dict_and_equals_it(name: str) -> None:
    tv = _trained_torchvision(name, 10)
    model = getattr(zoo, name)(num_classes=10, key=jax.random.key(0))
    model = tm.load_state_dict(model, tv.state_dict())
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with torch.inference_mode():
        ref = tv(torch.from_numpy(x))
    got = _run(model, x)
    assert got.shape == (2, 10)
    assert _relative_error(got, ref) < 1e-5


def test_exports_a_state_dict_torchvision_loads() -> None:
    model = zoo.resnet18(num_classes=7, key=jax.random.key(1))
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in tm.state_dict(model).items()}
    tv = torchvision.models.resnet18(weights=None, num_classes=7)
    tv.load_state_dict(tensors, strict=True)
    tv.eval()
    x = np.random.default_rng(1).standard_normal((1, 3, 40, 40)).astype(np.float32)
    with torch.inference_mode():
        ref = tv(torch.from_numpy(x))
    assert _relative_error(_run(model, x), ref) < 1e-5


@pytest.mark.parametrize(
    "name",
    [
        "resnet34",
        "resnet101",
        "resnet152",
        "resnext50_32x4d",
        "resnext101_32x8d",
        "resnext101_64x4d",
        "wide_resnet50_2",
        "wide_resnet101_2",
    ],
)
def test_every_depth_has_torchvision_names_and_shapes(name: str) -> None:
    with torch.device("meta"):
        tv = getattr(torchvision.models, name)(weights=None)
    expected = {k: tuple(v.shape) for k, v in tv.state_dict().items()}
    shapes = tm.filter_eval_shape(lambda: getattr(zoo, name)(key=jax.random.key(0)))
    # Zeros in place of the abstract arrays (NumPy allocates them lazily): names need values.
    model = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
    assert {k: v.shape for k, v in tm.state_dict(model).items()} == expected


def test_bad_construction_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="TorchvisionResNet: block must be"):
        zoo.TorchvisionResNet("plain", (2, 2, 2, 2), key=jax.random.key(0))
    with pytest.raises(ValueError, match="basic blocks only support groups=1"):
        zoo.TorchvisionResNet("basic", (2, 2, 2, 2), groups=32, key=jax.random.key(0))
    with pytest.raises(ValueError, match="four positive block counts"):
        zoo.TorchvisionResNet("basic", (2, 2, 2), key=jax.random.key(0))  # type: ignore[arg-type]
