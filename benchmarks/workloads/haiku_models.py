"""Haiku: functions under `hk.transform` / `hk.transform_with_state`, a `jax.jit` step.

Written as the Haiku docs recommend: modules created inside the transformed function, layout
NHWC, BatchNorm statistics in Haiku's `state` (`transform_with_state`, `is_training=True`),
dropout with `hk.dropout(hk.next_rng_key(), ...)`, and the deep stack with `hk.layer_stack`.
"""

from __future__ import annotations

from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import optax

from .case import Case
from .common import count_params, cross_entropy, optimiser, wait
from .spec import BN_EPS, BN_MOMENTUM, LN_EPS, Workload, block_strides


def _bn(x: jax.Array) -> jax.Array:
    bn = hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=1 - BN_MOMENTUM, eps=BN_EPS)
    return bn(x, is_training=True)


def _conv(x: jax.Array, cout: int, k: int, stride: int) -> jax.Array:
    pad = (k - 1) // 2
    return hk.Conv2D(cout, k, stride, padding=((pad, pad), (pad, pad)), with_bias=False)(x)


def _resnet(x: jax.Array, w: Workload) -> jax.Array:
    x = jax.nn.relu(_bn(_conv(x, w.widths[0], 3, 1)))
    for cin, cout, stride in block_strides(w):
        h = jax.nn.relu(_bn(_conv(x, cout, 3, stride)))
        h = _bn(_conv(h, cout, 3, 1))
        if stride != 1 or cin != cout:
            x = _bn(_conv(x, cout, 1, stride))
        x = jax.nn.relu(h + x)
    return hk.Linear(w.classes)(x.mean(axis=(1, 2)))


def _layer_norm(x: jax.Array) -> jax.Array:
    return hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, eps=LN_EPS)(x)


def _block(x: jax.Array, w: Workload) -> jax.Array:
    d = w.width
    h = _layer_norm(x)
    init = hk.initializers.VarianceScaling(1.0)
    h = hk.MultiHeadAttention(w.heads, d // w.heads, w_init=init, model_size=d)(h, h, h)
    x = x + hk.dropout(hk.next_rng_key(), w.dropout, h)
    h = hk.Linear(d)(jax.nn.gelu(hk.Linear(w.mlp_ratio * d)(_layer_norm(x))))
    return x + hk.dropout(hk.next_rng_key(), w.dropout, h)


def _transformer(tokens: jax.Array, w: Workload) -> jax.Array:
    x = hk.Embed(w.vocab, w.width)(tokens) + hk.Embed(w.seq, w.width)(jnp.arange(w.seq))
    if w.scan:
        x = hk.layer_stack(w.depth)(lambda x: _block(x, w))(x)
    else:
        for _ in range(w.depth):
            x = _block(x, w)
    return hk.Linear(w.classes)(_layer_norm(x).mean(axis=1))


def build(w: Workload) -> Case:
    """The Haiku version of workload `w`."""
    opt = optimiser()
    if w.kind == "mlp":
        net = hk.transform_with_state(lambda x: hk.nets.MLP([w.width] * w.depth + [w.classes])(x))
        sample = jnp.zeros((1, w.width))
    elif w.kind == "resnet":
        net = hk.transform_with_state(lambda x: _resnet(x, w))
        sample = jnp.zeros((1, w.image, w.image, 3))
    else:
        net = hk.transform_with_state(lambda x: _transformer(x, w))
        sample = jnp.zeros((1, w.seq), jnp.int32)

    def init(key: jax.Array) -> Any:
        return net.init(key, sample)

    def loss_fn(params: Any, state: Any, x: jax.Array, y: jax.Array, key: jax.Array) -> Any:
        logits, state = net.apply(params, state, key, x)
        return cross_entropy(logits, y), state

    @jax.jit
    def train_step(params: Any, state: Any, opt_state: Any, key: Any, x: Any, y: Any):
        key, sub = jax.random.split(key) if w.random else (key, None)
        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state, x, y, sub)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, state, opt_state, key, loss

    def step(carry: Any, x: jax.Array, y: jax.Array) -> Any:
        *carry, loss = train_step(*carry, x, y)
        return carry, loss

    def make_carry(model: Any) -> Any:
        params, state = model
        return (params, state, opt.init(params), jax.random.PRNGKey(1))

    return Case(
        make_model=lambda seed: init(jax.random.PRNGKey(seed)),
        make_model_abstract=lambda seed: jax.eval_shape(init, jax.random.PRNGKey(seed)),
        make_model_jit=lambda seed: jax.jit(init)(jax.random.PRNGKey(seed)),
        make_carry=make_carry,
        step=step,
        count_params=lambda model: count_params(model[0]),
        wait=wait,
        channels_last=True,
    )
