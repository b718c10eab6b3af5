"""Flax Linen: `@nn.compact` modules, `init`/`apply` with variable collections, a `TrainState`.

Written as the Flax Linen docs recommend: parameters in the `params` collection, BatchNorm
statistics in `batch_stats` (applied with `mutable=["batch_stats"]`), dropout keys passed as
`rngs={"dropout": ...}`, a `flax.training.train_state.TrainState` updated by `jax.jit` of
`jax.value_and_grad`, layout NHWC, and the deep stack lifted with `nn.scan`.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.training import train_state

from .case import Case
from .common import count_params, cross_entropy, optimiser, wait
from .spec import BN_EPS, BN_MOMENTUM, LN_EPS, Workload, block_strides


class MLP(nn.Module):
    w: Workload

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        for _ in range(self.w.depth):
            x = nn.relu(nn.Dense(self.w.width)(x))
        return nn.Dense(self.w.classes)(x)


def _bn(train: bool) -> nn.BatchNorm:
    return nn.BatchNorm(use_running_average=not train, momentum=1 - BN_MOMENTUM, epsilon=BN_EPS)


class BasicBlock(nn.Module):
    cin: int
    cout: int
    stride: int

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        s = (self.stride, self.stride)
        h = nn.Conv(self.cout, (3, 3), s, padding=1, use_bias=False)(x)
        h = nn.relu(_bn(train)(h))
        h = nn.Conv(self.cout, (3, 3), padding=1, use_bias=False)(h)
        h = _bn(train)(h)
        if self.stride != 1 or self.cin != self.cout:
            x = _bn(train)(nn.Conv(self.cout, (1, 1), s, padding=0, use_bias=False)(x))
        return nn.relu(h + x)


class ResNet(nn.Module):
    w: Workload

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        x = nn.Conv(self.w.widths[0], (3, 3), padding=1, use_bias=False)(x)
        x = nn.relu(_bn(train)(x))
        for cin, cout, stride in block_strides(self.w):
            x = BasicBlock(cin, cout, stride)(x, train)
        return nn.Dense(self.w.classes)(x.mean(axis=(1, 2)))


class Block(nn.Module):
    w: Workload

    @nn.compact
    def __call__(self, x: jax.Array, _: Any = None) -> Any:
        d = self.w.width
        h = nn.LayerNorm(epsilon=LN_EPS)(x)
        h = nn.MultiHeadDotProductAttention(num_heads=self.w.heads, qkv_features=d)(h, h)
        x = x + nn.Dropout(self.w.dropout, deterministic=False)(h)
        h = nn.LayerNorm(epsilon=LN_EPS)(x)
        h = nn.Dense(d)(nn.gelu(nn.Dense(self.w.mlp_ratio * d)(h)))
        x = x + nn.Dropout(self.w.dropout, deterministic=False)(h)
        return (x, None) if self.w.scan else x


class Transformer(nn.Module):
    w: Workload

    @nn.compact
    def __call__(self, tokens: jax.Array, train: bool = True) -> jax.Array:
        w = self.w
        x = nn.Embed(w.vocab, w.width)(tokens) + nn.Embed(w.seq, w.width)(jnp.arange(w.seq))
        if w.scan:
            stack = nn.scan(
                Block,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                length=w.depth,
            )
            x, _ = stack(w)(x, None)
        else:
            for _ in range(w.depth):
                x = Block(w)(x)
        return nn.Dense(w.classes)(nn.LayerNorm(epsilon=LN_EPS)(x).mean(axis=1))


class TrainState(train_state.TrainState):
    batch_stats: Any = None


_MODELS: dict[str, Any] = {"mlp": MLP, "resnet": ResNet, "transformer": Transformer}


def build(w: Workload) -> Case:
    """The Flax Linen version of workload `w`."""
    tx = optimiser()
    model = _MODELS[w.kind](w)
    has_stats = w.kind == "resnet"
    if w.kind == "mlp":
        sample = jnp.zeros((1, w.width))
    elif w.kind == "resnet":
        sample = jnp.zeros((1, w.image, w.image, 3))
    else:
        sample = jnp.zeros((1, w.seq), jnp.int32)

    def init(key: jax.Array) -> Any:
        return model.init({"params": key, "dropout": key}, sample)

    @jax.jit
    def train_step(state: TrainState, key: jax.Array, x: jax.Array, y: jax.Array):
        key, sub = jax.random.split(key) if w.random else (key, None)

        def loss_fn(params: Any) -> Any:
            variables = {"params": params}
            if has_stats:
                variables["batch_stats"] = state.batch_stats
                logits, updates = state.apply_fn(variables, x, mutable=["batch_stats"])
                return cross_entropy(logits, y), updates["batch_stats"]
            rngs = {"dropout": sub} if sub is not None else None
            logits = state.apply_fn(variables, x, rngs=rngs)
            return cross_entropy(logits, y), None

        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        state = state.apply_gradients(grads=grads)
        if has_stats:
            state = state.replace(batch_stats=stats)
        return state, key, loss

    def step(carry: Any, x: jax.Array, y: jax.Array) -> Any:
        *carry, loss = train_step(*carry, x, y)
        return carry, loss

    def make_carry(variables: Any) -> Any:
        state = TrainState.create(
            apply_fn=model.apply,
            params=variables["params"],
            tx=tx,
            batch_stats=variables.get("batch_stats"),
        )
        return (state, jax.random.PRNGKey(1))

    return Case(
        make_model=lambda seed: init(jax.random.PRNGKey(seed)),
        make_model_abstract=lambda seed: jax.eval_shape(init, jax.random.PRNGKey(seed)),
        make_model_jit=lambda seed: jax.jit(init)(jax.random.PRNGKey(seed)),
        make_carry=make_carry,
        step=step,
        count_params=lambda variables: count_params(variables["params"]),
        wait=wait,
        channels_last=True,
    )
