"""Equinox: `eqx.Module`s on single examples, `jax.vmap` over the batch, `eqx.filter_jit` step.

Written as Equinox's docs recommend: layers act on one example (channels first) and the loss
vmaps the model; BatchNorm keeps its statistics in a separate `eqx.nn.State` built with
`eqx.nn.make_with_state` and vmapped with an `axis_name`; the deep stack uses Equinox's
scan-over-layers pattern (`eqx.filter_vmap` to build, `lax.scan` over the array part with
`eqx.partition`/`eqx.combine`).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .case import Case
from .common import count_params, cross_entropy, optimiser, wait
from .spec import BN_EPS, BN_MOMENTUM, LN_EPS, Workload, block_strides


def _bn(c: int) -> eqx.nn.BatchNorm:
    return eqx.nn.BatchNorm(c, "batch", eps=BN_EPS, momentum=1 - BN_MOMENTUM, mode="batch")


class BasicBlock(eqx.Module):
    conv1: eqx.nn.Conv2d
    bn1: eqx.nn.BatchNorm
    conv2: eqx.nn.Conv2d
    bn2: eqx.nn.BatchNorm
    proj: eqx.nn.Conv2d | None
    proj_bn: eqx.nn.BatchNorm | None

    def __init__(self, cin: int, cout: int, stride: int, *, key: jax.Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv1 = eqx.nn.Conv2d(cin, cout, 3, stride, padding=1, use_bias=False, key=k1)
        self.bn1 = _bn(cout)
        self.conv2 = eqx.nn.Conv2d(cout, cout, 3, 1, padding=1, use_bias=False, key=k2)
        self.bn2 = _bn(cout)
        if stride != 1 or cin != cout:
            self.proj = eqx.nn.Conv2d(cin, cout, 1, stride, use_bias=False, key=k3)
            self.proj_bn = _bn(cout)
        else:
            self.proj = self.proj_bn = None

    def __call__(self, x: jax.Array, state: eqx.nn.State) -> tuple[jax.Array, eqx.nn.State]:
        h, state = self.bn1(self.conv1(x), state)
        h, state = self.bn2(self.conv2(jax.nn.relu(h)), state)
        if self.proj is not None and self.proj_bn is not None:
            x, state = self.proj_bn(self.proj(x), state)
        return jax.nn.relu(h + x), state


class ResNet(eqx.Module):
    stem: eqx.nn.Conv2d
    stem_bn: eqx.nn.BatchNorm
    blocks: list[BasicBlock]
    head: eqx.nn.Linear

    def __init__(self, w: Workload, *, key: jax.Array) -> None:
        specs = block_strides(w)
        keys = jax.random.split(key, len(specs) + 2)
        self.stem = eqx.nn.Conv2d(3, w.widths[0], 3, padding=1, use_bias=False, key=keys[0])
        self.stem_bn = _bn(w.widths[0])
        self.blocks = [BasicBlock(*s, key=k) for s, k in zip(specs, keys[1:-1], strict=True)]
        self.head = eqx.nn.Linear(w.widths[-1], w.classes, key=keys[-1])

    def __call__(self, x: jax.Array, state: eqx.nn.State) -> tuple[jax.Array, eqx.nn.State]:
        x, state = self.stem_bn(self.stem(x), state)
        x = jax.nn.relu(x)
        for block in self.blocks:
            x, state = block(x, state)
        return self.head(x.mean(axis=(1, 2))), state


class Block(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attention: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear
    dropout: eqx.nn.Dropout

    def __init__(self, w: Workload, *, key: jax.Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        d = w.width
        self.norm1 = eqx.nn.LayerNorm(d, eps=LN_EPS)
        self.attention = eqx.nn.MultiheadAttention(
            w.heads, d, use_query_bias=True, use_key_bias=True, use_value_bias=True,
            use_output_bias=True, key=k1,
        )  # fmt: skip
        self.norm2 = eqx.nn.LayerNorm(d, eps=LN_EPS)
        self.fc1 = eqx.nn.Linear(d, w.mlp_ratio * d, key=k2)
        self.fc2 = eqx.nn.Linear(w.mlp_ratio * d, d, key=k3)
        self.dropout = eqx.nn.Dropout(w.dropout)

    def __call__(self, x: jax.Array, *, key: jax.Array) -> jax.Array:
        """x: (seq, width), one example."""
        k1, k2 = jax.random.split(key)
        h = jax.vmap(self.norm1)(x)
        x = x + self.dropout(self.attention(h, h, h), key=k1)
        h = jax.vmap(self.fc2)(jax.nn.gelu(jax.vmap(self.fc1)(jax.vmap(self.norm2)(x))))
        return x + self.dropout(h, key=k2)


class Transformer(eqx.Module):
    embedding: eqx.nn.Embedding
    position: eqx.nn.Embedding
    blocks: Block | list[Block]  # stacked (scan) or a list (unrolled)
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear
    scan: bool = eqx.field(static=True)

    def __init__(self, w: Workload, *, key: jax.Array) -> None:
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.embedding = eqx.nn.Embedding(w.vocab, w.width, key=k1)
        self.position = eqx.nn.Embedding(w.seq, w.width, key=k2)
        keys = jax.random.split(k3, w.depth)
        self.scan = w.scan
        if w.scan:
            self.blocks = eqx.filter_vmap(lambda k: Block(w, key=k))(keys)
        else:
            self.blocks = [Block(w, key=k) for k in keys]
        self.norm = eqx.nn.LayerNorm(w.width, eps=LN_EPS)
        self.head = eqx.nn.Linear(w.width, w.classes, key=k4)

    def __call__(self, tokens: jax.Array, *, key: jax.Array) -> jax.Array:
        """tokens: (seq,), one example."""
        x = jax.vmap(self.embedding)(tokens) + jax.vmap(self.position)(jnp.arange(tokens.shape[0]))
        if self.scan:
            dynamic, static = eqx.partition(self.blocks, eqx.is_array)
            keys = jax.random.split(key, jax.tree_util.tree_leaves(dynamic)[0].shape[0])

            def f(x: jax.Array, xs: Any) -> tuple[jax.Array, None]:
                block = eqx.combine(xs[0], static)
                return block(x, key=xs[1]), None

            x, _ = jax.lax.scan(f, x, (dynamic, keys))
        else:
            assert isinstance(self.blocks, list)
            for block, k in zip(self.blocks, jax.random.split(key, len(self.blocks)), strict=True):
                x = block(x, key=k)
        return self.head(jax.vmap(self.norm)(x).mean(axis=0))


def build(w: Workload) -> Case:
    """The Equinox version of workload `w`."""
    opt = optimiser()
    has_state = w.kind == "resnet"

    def make(key: jax.Array) -> Any:
        if w.kind == "mlp":
            return eqx.nn.MLP(w.width, w.classes, w.width, w.depth, key=key), None
        if w.kind == "resnet":
            return eqx.nn.make_with_state(ResNet)(w, key=key)
        return Transformer(w, key=key), None

    def loss_fn(model: Any, state: Any, x: jax.Array, y: jax.Array, key: jax.Array):
        if w.kind == "mlp":
            return cross_entropy(jax.vmap(model)(x), y), state
        if has_state:
            batched = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
            logits, state = batched(x, state)
            return cross_entropy(logits, y), state
        keys = jax.random.split(key, x.shape[0])
        return cross_entropy(jax.vmap(lambda t, k: model(t, key=k))(x, keys), y), state

    @eqx.filter_jit
    def train_step(model: Any, state: Any, opt_state: Any, key: jax.Array, x: Any, y: Any):
        key, sub = jax.random.split(key) if w.random else (key, None)
        grad_fn = eqx.filter_value_and_grad(loss_fn, has_aux=True)
        (loss, state), grads = grad_fn(model, state, x, y, sub)
        updates, opt_state = opt.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        model = eqx.apply_updates(model, updates)
        return model, state, opt_state, key, loss

    def step(carry: Any, x: jax.Array, y: jax.Array) -> Any:
        *carry, loss = train_step(*carry, x, y)
        return carry, loss

    def make_carry(built: Any) -> Any:
        model, state = built
        params = eqx.filter(model, eqx.is_inexact_array)
        return (model, state, opt.init(params), jax.random.PRNGKey(1))

    return Case(
        make_model=lambda seed: make(jax.random.PRNGKey(seed)),
        make_model_abstract=lambda seed: eqx.filter_eval_shape(make, jax.random.PRNGKey(seed)),
        make_model_jit=lambda seed: eqx.filter_jit(make)(jax.random.PRNGKey(seed)),
        make_carry=make_carry,
        step=step,
        count_params=lambda built: count_params(eqx.filter(built[0], eqx.is_inexact_array)),
        wait=wait,
        channels_last=False,
    )
