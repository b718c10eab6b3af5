"""ONNX export of treemod models with jax2onnx, run by onnxruntime.

The digits CNN, GPT-2, BERT, ViT and ResNet and channels-first pooling layers are each converted
once with a symbolic batch (and, for the text models, a symbolic sequence length), written to a
`.onnx` file and run by onnxruntime at two shapes; the outputs must equal the jitted model's
within float32 rounding. onnxruntime computes the graph with its own kernels, so a lowering that
drops or reorders an operation shows. The models' numerics themselves are checked against
transformers and torchvision in tests/models/. The zoo's other text families: test_onnx_zoo.py;
the `onnx` fixture (jax2onnx and onnxruntime, imported at the first test): conftest.py."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import treemod.models as tmm
import treemod.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from digits_cnn import CNN  # noqa: E402

pytestmark = pytest.mark.slow


def _images(*shape: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=(b, *shape)).astype(np.float32) for b in (2, 5)]


def _ids(shapes: list[tuple[int, int]], vocab: int = 64) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.integers(0, vocab, s).astype(np.int32) for s in shapes]


# A symbolic batch and length; a learned position table (64 rows) needs the length bounded.
(B, S) = export.symbolic_shape("B, S", constraints=["S <= 64"])
TEXT_SPEC = jax.ShapeDtypeStruct((B, S), jnp.int32)
TEXT_INPUTS = _ids([(2, 5), (1, 9)])
ENCODER = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
}
GPT2 = {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 64, "n_positions": 64}
VIT = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 48,
    "image_size": 16,
    "patch_size": 8,
    "num_labels": 3,
}
RESNET = {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 2], "num_labels": 3}


def _model(name: str) -> tuple[Callable[[Any], Any], Any, list[Any]]:
    """The served call of model `name`, its input spec and two inputs of other batch sizes."""
    key = jax.random.key(0)
    if name == "digits CNN":
        cnn = nn.inference_mode(CNN(key=key, width=4))
        return (lambda x: cnn(x)), ("B", 1, 8, 8), _images(1, 8, 8)
    if name == "GPT-2":
        gpt2 = nn.inference_mode(tmm.GPT2LMHeadModel.from_config(GPT2, key=key))
        return (lambda ids: gpt2(input_ids=ids)), TEXT_SPEC, TEXT_INPUTS
    if name == "BERT":
        bert = nn.inference_mode(tmm.BertModel.from_config(ENCODER, key=key))
        return (lambda ids: bert(input_ids=ids)), TEXT_SPEC, TEXT_INPUTS
    if name == "ViT":
        vit = nn.inference_mode(tmm.ViTForImageClassification.from_config(VIT, key=key))
        return (lambda x: vit(pixel_values=x)), ("B", 3, 16, 16), _images(3, 16, 16)
    resnet = nn.inference_mode(tmm.ResNetForImageClassification.from_config(RESNET, key=key))
    return (lambda x: resnet(pixel_values=x)), ("B", 3, 32, 32), _images(3, 32, 32)


@pytest.mark.parametrize("name", ["digits CNN", "GPT-2", "BERT", "ViT", "ResNet"])
def test_model_exported_to_onnx_runs_in_onnxruntime_at_other_shapes(
    onnx: SimpleNamespace, tmp_path: Path, name: str
) -> None:
    fn, spec, xs = _model(name)
    shape, got = onnx.run_exported(tmp_path, fn, spec, xs)
    # The symbolic dimensions are named dimensions of the graph's input.
    assert shape == (["B", "S"] if spec is TEXT_SPEC else list(spec))
    onnx.assert_equals_jitted(fn, xs, got)


POOLS = {
    # ResNet's stem: padded 3x3 max pooling of stride 2, channels first.
    "MaxPool2d": lambda: nn.MaxPool2d(3, stride=2, padding=1),
    "AvgPool2d": lambda: nn.AvgPool2d(2, stride=2),
    "MaxPool1d": lambda: nn.MaxPool1d(3, stride=1),
    "AvgPool1d": lambda: nn.AvgPool1d(2, stride=2),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_pooling_over_channels_first_images_runs_in_onnxruntime(
    onnx: SimpleNamespace, tmp_path: Path, name: str
) -> None:
    pool = POOLS[name]()
    spatial = (6, 7) if name.endswith("2d") else (9,)
    fn = lambda x: pool(x)  # noqa: E731
    shape, got = onnx.run_exported(tmp_path, fn, ("B", 3, *spatial), _images(3, *spatial))
    assert shape == ["B", 3, *spatial]
    onnx.assert_equals_jitted(fn, _images(3, *spatial), got)
