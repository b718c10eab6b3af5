"""A small transformer-like model for the sharding tests, and the meshes they use."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

import treemod as tm
import treemod.nn as nn

VOCAB, EMBED, HIDDEN, HEADS, DEPTH = 64, 32, 128, 4, 2


def mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    """A mesh over the first `prod(shape)` devices, with automatic (not explicit) axes."""
    n = int(np.prod(shape))
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


class Block(tm.Module):
    norm: nn.LayerNorm
    attention: nn.MultiheadAttention
    mlp: nn.MLP
    # FSDP: activations stay split by batch, so XLA gathers weights rather than activations.
    batch: NamedSharding | None = tm.field(static=True)

    def __init__(self, key: jax.Array, batch: NamedSharding | None = None) -> None:
        k1, k2 = jax.random.split(key)
        self.norm = nn.LayerNorm(EMBED)
        self.attention = nn.MultiheadAttention(HEADS, EMBED, key=k1)
        self.mlp = nn.MLP(EMBED, EMBED, HIDDEN, 1, key=k2)
        self.batch = batch

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.batch is not None:
            x = tm.filter_shard(x, self.batch)
        h = self.norm(x)
        x = x + self.attention(h, h, h)
        return x + self.mlp(self.norm(x))


# The head is a plain Linear: the model names its weight, overriding Linear's default.
@tm.axis_names({"head.weight": ("vocab", "embed"), "head.bias": ("vocab",)})
class Tiny(tm.Module):
    embedding: nn.Embedding
    blocks: nn.Stack
    head: nn.Linear

    def __init__(self, key: jax.Array, batch: NamedSharding | None = None) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.embedding = nn.Embedding(VOCAB, EMBED, key=k1)
        self.blocks = nn.Stack(lambda k: Block(k, batch), DEPTH, key=k2)
        self.head = nn.Linear(EMBED, VOCAB, key=k3)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.head(self.blocks(self.embedding(tokens)))


def tokens(batch: int = 8, length: int = 8, seed: int = 0) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, VOCAB)


def loss_fn(model: Tiny, x: jax.Array) -> jax.Array:
    logits = model(x[:, :-1])
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), x[:, 1:, None], axis=-1))
