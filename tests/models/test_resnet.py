"""ResNet as `transformers` builds it (`ResNetModel`, `ResNetForImageClassification`).

Reference: `transformers`' own classes, random-initialised from small configs (32x32 images,
depths like [1, 2]), with random BatchNorm statistics and affine parameters, compared in
`eval()` mode; weights and running statistics move with `tm.load_state_dict(model,
hf_model.state_dict())`. Float32 outputs agree within 1e-5 relative (max abs error over max
abs value). Hypothesis covers the config values; refused values raise a `CheckpointError`
naming the class and the key. Training mode is compared too (batch statistics, and the
running statistics PyTorch updates).
"""

from __future__ import annotations

import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm
from treemod.models import (
    ResNetForImageClassification,
    ResNetModel,
    from_pretrained,
    save_pretrained,
)

CLASSES = {
    "ResNetModel": (ResNetModel, transformers.ResNetModel),
    "ResNetForImageClassification": (
        ResNetForImageClassification,
        transformers.ResNetForImageClassification,
    ),
}
TINY = {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 2], "num_labels": 3}
ACTS = sorted(set(transformers.activations.ACT2CLS) - {"prelu", "xielu"})

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


def _hf(name: str, config: dict[str, Any], seed: int = 0) -> Any:
    """The `transformers` model, its BatchNorm layers given statistics far from the defaults."""
    torch.manual_seed(seed)
    model = CLASSES[name][1](transformers.ResNetConfig(**config))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
                module.num_batches_tracked.fill_(7)
    return model.eval()


def _ours(name: str, hf_model: Any) -> Any:
    config = json.loads(hf_model.config.to_json_string())
    # A shape-only skeleton, filled by load_state_dict: no random initialiser to compile
    # per new shape (seconds per hypothesis example).
    cls = CLASSES[name][0]
    model = tm.filter_eval_shape(lambda: cls.from_config(config, key=jax.random.key(1)))
    return tm.load_state_dict(model, hf_model.state_dict())


@tm.filter_jit
def _run(model: Any, pixels: Any) -> jax.Array:
    return model(pixel_values=pixels)


def _reference(hf_model: Any, pixels: np.ndarray) -> torch.Tensor:
    with torch.inference_mode():
        out = hf_model(pixel_values=torch.from_numpy(pixels))
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _pixels(seed: int, batch: int, channels: int = 3, size: int = 32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, channels, size, size)).astype(np.float32)


@pytest.mark.parametrize("name", sorted(CLASSES))
@pytest.mark.parametrize("layer_type", ["basic", "bottleneck"])
@pytest.mark.parametrize("downsample", [False, True])
def test_equals_transformers_in_eval_mode(name: str, layer_type: str, downsample: bool) -> None:
    config = {
        **TINY,
        "layer_type": layer_type,
        "downsample_in_first_stage": downsample,
        "downsample_in_bottleneck": downsample,
    }
    hf = _hf(name, config)
    model = _ours(name, hf)
    assert set(tm.state_dict(model)) == set(hf.state_dict())
    pixels = _pixels(0, 2)
    ref = _reference(hf, pixels)
    got = _run(model, pixels)
    assert got.shape == tuple(ref.shape)  # ResNetModel: the final feature map
    assert _relative_error(got, ref) < 1e-5


def test_running_statistics_load_and_export() -> None:
    hf = _hf("ResNetModel", TINY)
    model = _ours("ResNetModel", hf)
    norm = model.encoder.stages[1].layers[0].shortcut.normalization
    reference = hf.encoder.stages[1].layers[0].shortcut.normalization
    np.testing.assert_array_equal(norm.running_var.value, reference.running_var.numpy())
    exported = tm.state_dict(model)
    fresh = transformers.ResNetModel(transformers.ResNetConfig(**TINY)).eval()
    fresh.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in exported.items()})
    pixels = _pixels(1, 2)
    assert _relative_error(_reference(fresh, pixels), _reference(hf, pixels)) == 0


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_save_pretrained_directories_both_ways(name: str, tmp_path: Any) -> None:
    hf = _hf(name, {**TINY, "layer_type": "basic"})
    hf.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf")
    assert type(model) is CLASSES[name][0]
    pixels = _pixels(3, 2)
    assert _relative_error(_run(model, pixels), _reference(hf, pixels)) < 1e-5
    save_pretrained(model, tmp_path / "ours")
    again, info = CLASSES[name][1].from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    assert _relative_error(_run(model, pixels), _reference(again.eval(), pixels)) < 1e-5


def test_training_mode_equals_transformers_train() -> None:
    """Batch statistics, and the running statistics updated with PyTorch's momentum."""
    hf = _hf("ResNetForImageClassification", TINY)
    model = tm.nn.inference_mode(_ours("ResNetForImageClassification", hf), False)
    pixels = _pixels(2, 4)
    hf.train()
    with torch.no_grad():
        ref = hf(pixel_values=torch.from_numpy(pixels)).logits
    out, updated = tm.stateful(model)(pixel_values=pixels)
    assert _relative_error(out, ref) < 1e-5
    norm = updated.resnet.embedder.embedder.normalization
    reference = hf.resnet.embedder.embedder.normalization
    np.testing.assert_allclose(norm.running_mean.value, reference.running_mean.numpy(), atol=1e-6)
    np.testing.assert_allclose(norm.running_var.value, reference.running_var.numpy(), rtol=1e-5)


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_config_space_equals_transformers(data: st.DataObject) -> None:
    stages = data.draw(st.integers(1, 3), "stages")
    config = {
        "num_channels": data.draw(st.integers(1, 3), "channels"),
        "embedding_size": data.draw(st.sampled_from([4, 8]), "embedding"),
        "hidden_sizes": data.draw(
            st.lists(st.sampled_from([4, 8, 12]), min_size=stages, max_size=stages)
        ),
        "depths": data.draw(st.lists(st.integers(1, 2), min_size=stages, max_size=stages)),
        "layer_type": data.draw(st.sampled_from(["basic", "bottleneck"]), "layer_type"),
        "hidden_act": data.draw(st.sampled_from(ACTS), "act"),
        "downsample_in_first_stage": data.draw(st.booleans(), "first"),
        "downsample_in_bottleneck": data.draw(st.booleans(), "bottleneck"),
        "num_labels": data.draw(st.integers(0, 3), "labels"),
    }
    name = data.draw(st.sampled_from(sorted(CLASSES)), "class")
    hf = _hf(name, config)
    model = _ours(name, hf)
    size = data.draw(st.sampled_from([16, 23, 32]), "size")
    pixels = _pixels(data.draw(st.integers(0, 99), "seed"), 2, config["num_channels"], size)
    # A squaring activation doubles the relative rounding error it is given, once per layer:
    # through a deep relu2 network float32's rounding alone reaches 1e-5 (seen: 1.02e-5 with
    # outputs near 3e15).
    tolerance = 1e-4 if config["hidden_act"] == "relu2" else 1e-5
    assert _relative_error(_run(model, pixels), _reference(hf, pixels)) < tolerance


@pytest.mark.parametrize(
    ("cls", "key", "value"),
    [
        (ResNetModel, "layer_type", "preactivation"),
        (ResNetForImageClassification, "hidden_act", "prelu"),
        (ResNetModel, "depths", [1, 0]),
        (ResNetModel, "depths", [1, 1, 1]),  # hidden_sizes has two stages
        (ResNetModel, "hidden_sizes", [2, 8]),  # bottleneck: too narrow to reduce 4 times
        (ResNetModel, "embedding_size", 0),
        (ResNetForImageClassification, "downsample_in_bottleneck", "no"),
        (ResNetForImageClassification, "num_labels", -2),
    ],
)
def test_refused_config_values_name_class_and_key(cls: Any, key: str, value: Any) -> None:
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config({**TINY, key: value}, key=jax.random.key(0))
    message = str(info.value)
    assert cls.__name__ in message and key in message


def test_pixel_channels_are_checked_and_bfloat16_runs() -> None:
    model = ResNetModel.from_config(TINY, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"ResNetModel: pixel_values has shape \(1, 4, 32, 32\)"):
        model(pixel_values=np.zeros((1, 4, 32, 32), np.float32))
    half = ResNetForImageClassification.from_config(TINY, key=jax.random.key(0), dtype=jnp.bfloat16)
    out = _run(half, _pixels(0, 1))
    assert out.dtype == jnp.bfloat16 and out.shape == (1, 3)
