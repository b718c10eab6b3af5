"""treemod: modules from `treemod.nn`, a `treemod.filter_jit` step, BatchNorm via `stateful`.

Written as treemod's docs and examples recommend: models are `tm.Module`s built from a key,
layers take batched input directly, the CNN is channels-last (as the "Image layouts" page
recommends for new convolutional networks), the training step is `filter_jit` of
`filter_value_and_grad`, the optimiser sees `tm.filter(model, tm.is_param)`, BatchNorm's running
statistics come back from `tm.stateful(model)(x)`, and the deep stack is `nn.Stack`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

import treemod as tm
import treemod.nn as nn

from .case import Case
from .common import count_params, cross_entropy, optimiser, wait
from .spec import BN_EPS, BN_MOMENTUM, LN_EPS, Workload, block_strides


class BasicBlock(tm.Module):
    conv1: nn.Conv
    bn1: nn.BatchNorm
    conv2: nn.Conv
    bn2: nn.BatchNorm
    proj: nn.Conv | None
    proj_bn: nn.BatchNorm | None

    def __init__(self, cin: int, cout: int, stride: int, *, key: jax.Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv1 = nn.Conv(
            2, cin, cout, 3, stride, padding=1, use_bias=False, channels_last=True, key=k1
        )
        self.bn1 = nn.BatchNorm(cout, eps=BN_EPS, momentum=BN_MOMENTUM, channels_last=True)
        self.conv2 = nn.Conv(
            2, cout, cout, 3, 1, padding=1, use_bias=False, channels_last=True, key=k2
        )
        self.bn2 = nn.BatchNorm(cout, eps=BN_EPS, momentum=BN_MOMENTUM, channels_last=True)
        if stride != 1 or cin != cout:
            self.proj = nn.Conv(2, cin, cout, 1, stride, use_bias=False, channels_last=True, key=k3)
            self.proj_bn = nn.BatchNorm(cout, eps=BN_EPS, momentum=BN_MOMENTUM, channels_last=True)
        else:
            self.proj = self.proj_bn = None

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.nn.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        if self.proj is not None and self.proj_bn is not None:
            x = self.proj_bn(self.proj(x))
        return jax.nn.relu(h + x)


class ResNet(tm.Module):
    stem: nn.Conv
    stem_bn: nn.BatchNorm
    blocks: list[BasicBlock]
    head: nn.Linear

    def __init__(self, w: Workload, *, key: jax.Array) -> None:
        specs = block_strides(w)
        keys = jax.random.split(key, len(specs) + 2)
        self.stem = nn.Conv(
            2, 3, w.widths[0], 3, padding=1, use_bias=False, channels_last=True, key=keys[0]
        )
        self.stem_bn = nn.BatchNorm(
            w.widths[0], eps=BN_EPS, momentum=BN_MOMENTUM, channels_last=True
        )
        self.blocks = [BasicBlock(*s, key=k) for s, k in zip(specs, keys[1:-1], strict=True)]
        self.head = nn.Linear(w.widths[-1], w.classes, key=keys[-1])

    def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        x = jax.nn.relu(self.stem_bn(self.stem(x)))
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(axis=(-3, -2)))


class Block(tm.Module):
    norm1: nn.LayerNorm
    attention: nn.MultiheadAttention
    norm2: nn.LayerNorm
    fc1: nn.Linear
    fc2: nn.Linear
    dropout: nn.Dropout

    def __init__(self, w: Workload, *, key: jax.Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        d = w.width
        self.norm1 = nn.LayerNorm(d, eps=LN_EPS)
        self.attention = nn.MultiheadAttention(
            w.heads, d, use_query_bias=True, use_key_bias=True, use_value_bias=True,
            use_output_bias=True, key=k1,
        )  # fmt: skip
        self.norm2 = nn.LayerNorm(d, eps=LN_EPS)
        self.fc1 = nn.Linear(d, w.mlp_ratio * d, key=k2)
        self.fc2 = nn.Linear(w.mlp_ratio * d, d, key=k3)
        self.dropout = nn.Dropout(w.dropout)

    def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        k1, k2 = (None, None) if key is None else jax.random.split(key)
        h = self.norm1(x)
        x = x + self.dropout(self.attention(h, h, h), key=k1)
        h = self.fc2(jax.nn.gelu(self.fc1(self.norm2(x))))
        return x + self.dropout(h, key=k2)


class Transformer(tm.Module):
    embedding: nn.Embedding
    position: nn.Embedding
    blocks: nn.Stack | list[Block]
    norm: nn.LayerNorm
    head: nn.Linear

    def __init__(self, w: Workload, *, key: jax.Array) -> None:
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.embedding = nn.Embedding(w.vocab, w.width, key=k1)
        self.position = nn.Embedding(w.seq, w.width, key=k2)
        if w.scan:
            self.blocks = nn.Stack(lambda k: Block(w, key=k), w.depth, key=k3)
        else:
            self.blocks = [Block(w, key=k) for k in jax.random.split(k3, w.depth)]
        self.norm = nn.LayerNorm(w.width, eps=LN_EPS)
        self.head = nn.Linear(w.width, w.classes, key=k4)

    def __call__(self, tokens: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        x = self.embedding(tokens) + self.position(jnp.arange(tokens.shape[-1]))
        if isinstance(self.blocks, nn.Stack):
            x = self.blocks(x, key=key)
        else:
            keys = (
                [None] * len(self.blocks)
                if key is None
                else jax.random.split(key, len(self.blocks))
            )
            for block, k in zip(self.blocks, keys, strict=True):
                x = block(x, key=k)
        return self.head(self.norm(x).mean(axis=-2))


def _mlp(w: Workload, *, key: jax.Array) -> nn.MLP:
    return nn.MLP(w.width, w.classes, w.width, w.depth, key=key)


_MODELS: dict[str, Any] = {"mlp": _mlp, "resnet": ResNet, "transformer": Transformer}


def build(w: Workload) -> Case:
    """The treemod version of workload `w`."""
    opt = optimiser()
    cls = _MODELS[w.kind]
    stateful = w.kind == "resnet"

    def make(key: jax.Array) -> Any:
        return cls(w, key=key)

    def loss_fn(model: Any, x: jax.Array, y: jax.Array, key: jax.Array) -> Any:
        logits = model(x) if w.kind == "mlp" else model(x, key=key)
        return cross_entropy(logits, y)

    def stateful_loss_fn(model: Any, x: jax.Array, y: jax.Array, key: jax.Array) -> Any:
        logits, model = tm.stateful(model)(x, key=key)  # also the new BatchNorm statistics
        return cross_entropy(logits, y), model

    @tm.filter_jit
    def train_step(model: Any, opt_state: Any, key: jax.Array, x: jax.Array, y: jax.Array):
        key, sub = jax.random.split(key) if w.random else (key, None)
        if stateful:
            grad_fn = tm.filter_value_and_grad(stateful_loss_fn, has_aux=True)
            (loss, new_model), grads = grad_fn(model, x, y, sub)
        else:
            loss, grads = tm.filter_value_and_grad(loss_fn)(model, x, y, sub)
            new_model = model
        updates, opt_state = opt.update(grads, opt_state, tm.filter(model, tm.is_param))
        return tm.apply_updates(new_model, updates), opt_state, key, loss

    def step(carry: Any, x: jax.Array, y: jax.Array) -> Any:
        *carry, loss = train_step(*carry, x, y)
        return carry, loss

    return Case(
        make_model=lambda seed: make(jax.random.key(seed)),
        make_model_abstract=lambda seed: tm.filter_eval_shape(make, jax.random.key(seed)),
        make_model_jit=lambda seed: tm.filter_jit(make)(jax.random.key(seed)),
        make_carry=lambda model: (
            model,
            opt.init(tm.filter(model, tm.is_param)),
            jax.random.key(1),
        ),
        step=step,
        count_params=lambda model: count_params(tm.filter(model, tm.is_param)),
        wait=wait,
        channels_last=w.kind == "resnet",
    )
