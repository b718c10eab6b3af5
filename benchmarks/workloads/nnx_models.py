"""Flax NNX: stateful `nnx.Module`s, `nnx.Optimizer`, an `nnx.jit` step that updates in place.

Written as the Flax NNX docs recommend: layers hold their `nnx.Param`s and take `rngs` at
construction, layout NHWC, `nnx.value_and_grad` + `optimizer.update(model, grads)` inside
`nnx.jit`, BatchNorm statistics updated in place, dropout keys from an `nnx.Rngs` stream held
by the model, and the deep stack built with `nnx.vmap` (+ `nnx.split_rngs`) and applied with
`nnx.scan`.

The same code runs in NNX's tree mode (`nnx_tree_models.py`), where only the gradient is taken
differently (`value_and_param_grad`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from .case import Case
from .common import count_params, cross_entropy, optimiser
from .spec import BN_EPS, BN_MOMENTUM, LN_EPS, Workload, block_strides


class MLP(nnx.Module):
    def __init__(self, w: Workload, *, rngs: nnx.Rngs) -> None:
        sizes = [w.width] * (w.depth + 1) + [w.classes]
        self.layers = nnx.List(
            [nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers[:-1]:
            x = nnx.relu(layer(x))
        return self.layers[-1](x)


def _bn(c: int, rngs: nnx.Rngs) -> nnx.BatchNorm:
    return nnx.BatchNorm(c, momentum=1 - BN_MOMENTUM, epsilon=BN_EPS, rngs=rngs)


def _conv(cin: int, cout: int, k: int, stride: int, rngs: nnx.Rngs) -> nnx.Conv:
    pad = (k - 1) // 2
    return nnx.Conv(cin, cout, (k, k), strides=stride, padding=pad, use_bias=False, rngs=rngs)


class BasicBlock(nnx.Module):
    def __init__(self, cin: int, cout: int, stride: int, *, rngs: nnx.Rngs) -> None:
        self.conv1 = _conv(cin, cout, 3, stride, rngs)
        self.bn1 = _bn(cout, rngs)
        self.conv2 = _conv(cout, cout, 3, 1, rngs)
        self.bn2 = _bn(cout, rngs)
        if stride != 1 or cin != cout:
            self.proj: nnx.Conv | None = _conv(cin, cout, 1, stride, rngs)
            self.proj_bn: nnx.BatchNorm | None = _bn(cout, rngs)
        else:
            self.proj = self.proj_bn = None

    def __call__(self, x: jax.Array) -> jax.Array:
        h = nnx.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        if self.proj is not None and self.proj_bn is not None:
            x = self.proj_bn(self.proj(x))
        return nnx.relu(h + x)


class ResNet(nnx.Module):
    def __init__(self, w: Workload, *, rngs: nnx.Rngs) -> None:
        self.stem = _conv(3, w.widths[0], 3, 1, rngs)
        self.stem_bn = _bn(w.widths[0], rngs)
        self.blocks = nnx.List([BasicBlock(*s, rngs=rngs) for s in block_strides(w)])
        self.head = nnx.Linear(w.widths[-1], w.classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.stem_bn(self.stem(x)))
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(axis=(1, 2)))


class Block(nnx.Module):
    def __init__(self, w: Workload, *, rngs: nnx.Rngs) -> None:
        d = w.width
        self.norm1 = nnx.LayerNorm(d, epsilon=LN_EPS, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(w.heads, d, decode=False, rngs=rngs)
        self.norm2 = nnx.LayerNorm(d, epsilon=LN_EPS, rngs=rngs)
        self.fc1 = nnx.Linear(d, w.mlp_ratio * d, rngs=rngs)
        self.fc2 = nnx.Linear(w.mlp_ratio * d, d, rngs=rngs)
        self.dropout = nnx.Dropout(w.dropout, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.dropout(self.attention(self.norm1(x)))
        h = self.fc2(nnx.gelu(self.fc1(self.norm2(x))))
        return x + self.dropout(h)


class Transformer(nnx.Module):
    def __init__(self, w: Workload, *, rngs: nnx.Rngs) -> None:
        self.embedding = nnx.Embed(w.vocab, w.width, rngs=rngs)
        self.position = nnx.Embed(w.seq, w.width, rngs=rngs)
        self.scan = w.scan
        if w.scan:

            @nnx.split_rngs(splits=w.depth)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def create(rngs: nnx.Rngs) -> Block:
                return Block(w, rngs=rngs)

            self.blocks: Any = create(rngs)
        else:
            self.blocks = nnx.List([Block(w, rngs=rngs) for _ in range(w.depth)])
        self.norm = nnx.LayerNorm(w.width, epsilon=LN_EPS, rngs=rngs)
        self.head = nnx.Linear(w.width, w.classes, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embedding(tokens) + self.position(jnp.arange(tokens.shape[-1]))
        if self.scan:

            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def forward(x: jax.Array, block: Block) -> jax.Array:
                return block(x)

            x = forward(x, self.blocks)
        else:
            for block in self.blocks:
                x = block(x)
        return self.head(self.norm(x).mean(axis=1))


def value_and_param_grad(
    loss: Callable[..., jax.Array], model: Any, *args: Any
) -> tuple[jax.Array, Any]:
    """`loss(model, *args)` and its gradient with respect to `model`'s `nnx.Param`s.

    In graph mode (NNX's default) `nnx.value_and_grad` differentiates the Params of its first
    argument. In tree mode it differentiates every array of it, as `jax.grad` does, so FLIP 5310
    splits the model into its Params and the rest (dropout keys, BatchNorm statistics) and merges
    them inside the loss; updates of the rest still reach the model.
    """
    if nnx.set_graph_mode.current_value():
        return nnx.value_and_grad(loss, argnums=0)(model, *args)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def split_loss(params: Any, rest: Any, *args: Any) -> jax.Array:
        return loss(nnx.merge(graphdef, params, rest), *args)

    return nnx.value_and_grad(split_loss)(params, rest, *args)


_MODELS: dict[str, Any] = {"mlp": MLP, "resnet": ResNet, "transformer": Transformer}


def build(w: Workload) -> Case:
    """The Flax NNX version of workload `w`."""
    tx = optimiser()
    cls = _MODELS[w.kind]

    def make(seed: int) -> Any:
        return cls(w, rngs=nnx.Rngs(params=seed, dropout=seed + 1))

    @nnx.jit
    def train_step(model: Any, optimizer: nnx.Optimizer, x: jax.Array, y: jax.Array):
        def loss_fn(model: Any) -> jax.Array:
            return cross_entropy(model(x), y)

        loss, grads = value_and_param_grad(loss_fn, model)
        optimizer.update(model, grads)
        return loss

    def step(carry: Any, x: jax.Array, y: jax.Array) -> Any:
        return carry, train_step(carry[0], carry[1], x, y)

    def wait(tree: Any) -> None:
        models = tree if isinstance(tree, tuple) else (tree,)
        jax.block_until_ready([nnx.state(m) for m in models])

    return Case(
        make_model=make,
        make_model_abstract=lambda seed: nnx.eval_shape(lambda: make(seed)),
        make_model_jit=lambda seed: nnx.jit(lambda: make(seed))(),
        make_carry=lambda model: (model, nnx.Optimizer(model, tx, wrt=nnx.Param)),
        step=step,
        count_params=lambda model: count_params(nnx.state(model, nnx.Param)),
        wait=wait,
        channels_last=True,
    )
