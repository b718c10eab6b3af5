"""A tiny zoo model of the pretrained-file tests' own, its tensors, and a NumPy reference.

`TinyTiedModel` (registered as `TreemodTestTinyTied`): an Embedding, an `nn.Stack` of Linear
layers with tanh, a LayerNorm, and logits through the tied embedding. The tensors are written
with the `safetensors` library's NumPy API and the output computed with NumPy from them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Self

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

import treemod.nn as nn
from treemod.models import PretrainedConfig, PretrainedModel, register_architecture

VOCAB, DIM, LAYERS = 12, 8, 3


@register_architecture
class TinyTiedModel(PretrainedModel):
    """Embedding, a Stack of Linear layers with tanh, logits through the tied embedding."""

    architecture = "TreemodTestTinyTied"
    model_type = "treemod-test-tiny"

    embed: nn.Embedding
    blocks: nn.Stack
    norm: nn.LayerNorm

    @classmethod
    def from_config(cls, config: Any, *, key: Any, dtype: Any = None) -> Self:
        config = PretrainedConfig(config)
        dtype = jnp.float32 if dtype is None else dtype
        vocab, dim, layers = config["vocab_size"], config["hidden_size"], config["num_layers"]
        k1, k2 = jax.random.split(key)
        return cls(
            config=config,
            embed=nn.Embedding(vocab, dim, key=k1, dtype=dtype),
            blocks=nn.Stack(lambda k: nn.Linear(dim, dim, key=k, dtype=dtype), layers, key=k2),
            norm=nn.LayerNorm(dim, dtype=dtype),
        )

    def tied_weights(self) -> dict[str, str]:
        return {"head.weight": "embed.weight"}

    def __call__(self, *, input_ids: Any) -> jax.Array:
        h = self.embed(jnp.asarray(input_ids))
        for i in range(len(self.blocks)):
            h = jnp.tanh(self.blocks[i](h))
        return self.norm(h) @ self.embed.weight.T


CONFIG = {
    "architectures": ["TreemodTestTinyTied"],
    "model_type": "treemod-test-tiny",
    "vocab_size": VOCAB,
    "hidden_size": DIM,
    "num_layers": LAYERS,
}


def make_tensors(seed: int = 0, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {"embed.weight": rng.normal(size=(VOCAB, DIM))}
    for i in range(LAYERS):
        out[f"blocks.{i}.weight"] = rng.normal(size=(DIM, DIM)) / np.sqrt(DIM)
        out[f"blocks.{i}.bias"] = rng.normal(size=(DIM,))
    out["norm.weight"] = 1 + 0.1 * rng.normal(size=(DIM,))
    out["norm.bias"] = 0.1 * rng.normal(size=(DIM,))
    return {k: v.astype(dtype) for k, v in out.items()}


def reference(t: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    t = {k: v.astype(np.float64) for k, v in t.items()}
    h = t["embed.weight"][ids]
    for i in range(LAYERS):
        h = np.tanh(h @ t[f"blocks.{i}.weight"].T + t[f"blocks.{i}.bias"])
    mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    h = (h - mean) / np.sqrt(var + 1e-5) * t["norm.weight"] + t["norm.bias"]
    return h @ t["embed.weight"].T


def write(directory: Path, tensors: dict[str, np.ndarray], config: Any = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(CONFIG if config is None else config))
    save_file(tensors, str(directory / "model.safetensors"), {"format": "pt"})
    return directory


def write_sharded(directory: Path, tensors: dict[str, np.ndarray]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(CONFIG))
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for file, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(directory / file), {"format": "pt"})
    weight_map = {n: f for f, part in shards.items() for n in part}
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


IDS = np.array([[1, 5, 7, 2], [0, 11, 3, 3]])


def assert_close(model: Any, tensors: dict[str, np.ndarray], rtol: float = 1e-5) -> None:
    got = np.asarray(model(input_ids=IDS), np.float64)
    want = reference(tensors, IDS)
    assert np.max(np.abs(got - want)) <= rtol * np.max(np.abs(want))
