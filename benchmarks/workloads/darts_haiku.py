"""The DARTS supernet in Haiku: one function under `hk.transform_with_state`, one `jax.jit`
bilevel step (see `darts_spec.py`).

Written as the Haiku docs recommend: modules created inside the transformed function, BatchNorm
statistics in Haiku's `state` (`is_training=True`), layout NHWC. The architecture weights are
parameters of a module of their own (`arch`), split from the weights with
`hk.data_structures.partition` so that each optimiser gets its part. Haiku's pools pad only
"SAME" (unevenly at stride 2) or "VALID", so the pools pad explicitly and pool "VALID"; the
average then counts the padding, as PyTorch's `count_include_pad=True`.
"""

from __future__ import annotations

from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import optax

from .common import cross_entropy
from .darts_spec import (
    A_B1,
    A_B2,
    A_LR,
    BN_EPS,
    BN_MOMENTUM,
    EDGES,
    NODES,
    OPS,
    STEM_MULTIPLIER,
    W_LR,
    W_MOMENTUM,
    DartsConfig,
    cell_plan,
    edge_strides,
)  # fmt: skip

ARCH = "arch"  # the module holding the architecture weights


def _bn(x: jax.Array, name: str, affine: bool = False) -> jax.Array:
    bn = hk.BatchNorm(affine, affine, decay_rate=1 - BN_MOMENTUM, eps=BN_EPS, name=name)
    return bn(x, is_training=True)


def _conv(x: jax.Array, cout: int, k: int, name: str, stride: int = 1, pad: int = 0) -> jax.Array:
    conv = hk.Conv2D(cout, k, stride, padding=[(pad, pad)] * 2, with_bias=False, name=name)
    return conv(x)


def _depthwise(x: jax.Array, k: int, stride: int, pad: int, dil: int, name: str) -> jax.Array:
    conv = hk.DepthwiseConv2D(
        1, k, stride, rate=dil, padding=[(pad, pad)] * 2, with_bias=False, name=name
    )
    return conv(x)


def _relu_conv_bn(x: jax.Array, cout: int, name: str) -> jax.Array:
    with hk.name_scope(name):
        return _bn(_conv(jax.nn.relu(x), cout, 1, "conv"), "bn")


def _factorized_reduce(x: jax.Array, cout: int, name: str) -> jax.Array:
    with hk.name_scope(name):
        x = jax.nn.relu(x)
        a = _conv(x, cout // 2, 1, "conv1", stride=2)
        b = _conv(x[:, 1:, 1:, :], cout // 2, 1, "conv2", stride=2)
        return _bn(jnp.concatenate([a, b], axis=-1), "bn")


def _sep_conv(x: jax.Array, k: int, stride: int, name: str) -> jax.Array:
    c = x.shape[-1]
    with hk.name_scope(name):
        h = _depthwise(jax.nn.relu(x), k, stride, k // 2, 1, "dw1")
        h = _bn(_conv(h, c, 1, "pw1"), "bn1")
        h = _depthwise(jax.nn.relu(h), k, 1, k // 2, 1, "dw2")
        return _bn(_conv(h, c, 1, "pw2"), "bn2")


def _dil_conv(x: jax.Array, k: int, stride: int, name: str) -> jax.Array:
    with hk.name_scope(name):
        h = _depthwise(jax.nn.relu(x), k, stride, k - 1, 2, "dw")
        return _bn(_conv(h, x.shape[-1], 1, "pw"), "bn")


def _pool(x: jax.Array, stride: int, kind: str) -> jax.Array:
    pads = ((0, 0), (1, 1), (1, 1), (0, 0))
    if kind == "max":
        x = jnp.pad(x, pads, constant_values=-jnp.inf)
        return hk.max_pool(x, (1, 3, 3, 1), (1, stride, stride, 1), "VALID")
    return hk.avg_pool(jnp.pad(x, pads), (1, 3, 3, 1), (1, stride, stride, 1), "VALID")


def _mixed_op(x: jax.Array, weights: jax.Array, stride: int, name: str) -> jax.Array:
    s = stride
    with hk.name_scope(name):
        outs = [
            jnp.zeros_like(x[:, ::s, ::s, :]),
            _bn(_pool(x, s, "max"), "max_bn"),
            _bn(_pool(x, s, "avg"), "avg_bn"),
            x if s == 1 else _factorized_reduce(x, x.shape[-1], "skip"),
            _sep_conv(x, 3, s, "sep3"),
            _sep_conv(x, 5, s, "sep5"),
            _dil_conv(x, 3, s, "dil3"),
            _dil_conv(x, 5, s, "dil5"),
        ]
    return sum(w * o for w, o in zip(weights, outs, strict=True))  # type: ignore[return-value]


def _cell(s0: jax.Array, s1: jax.Array, weights: jax.Array, plan: Any, name: str) -> jax.Array:
    _, _, c, reduction, reduction_prev = plan
    strides = edge_strides(reduction)
    with hk.name_scope(name):
        pre0 = _factorized_reduce if reduction_prev else _relu_conv_bn
        states, e = [pre0(s0, c, "pre0"), _relu_conv_bn(s1, c, "pre1")], 0
        for _ in range(NODES):
            total = 0.0
            for h in list(states):
                total = total + _mixed_op(h, weights[e], strides[e], f"edge{e}")
                e += 1
            states.append(total)  # type: ignore[arg-type]
    return jnp.concatenate(states[-NODES:], axis=-1)


def network(x: jax.Array, cfg: DartsConfig) -> jax.Array:
    """The supernet's logits (call inside `hk.transform_with_state`; training mode)."""
    init = hk.initializers.RandomNormal(1e-3)
    with hk.name_scope(ARCH):
        w_normal = jax.nn.softmax(hk.get_parameter("normal", (EDGES, len(OPS)), init=init), -1)
        w_reduce = jax.nn.softmax(hk.get_parameter("reduce", (EDGES, len(OPS)), init=init), -1)
    c_stem = STEM_MULTIPLIER * cfg.channels
    s0 = s1 = _bn(_conv(x, c_stem, 3, "stem", pad=1), "stem_bn", affine=True)
    for i, pl in enumerate(cell_plan(cfg)):
        s0, s1 = s1, _cell(s0, s1, w_reduce if pl[3] else w_normal, pl, f"cell{i}")
    return hk.Linear(cfg.classes, name="head")(s1.mean(axis=(1, 2)))


def split(params: Any) -> tuple[Any, Any]:
    """(architecture weights, weights) of the transformed function's parameters."""
    return hk.data_structures.partition(lambda module, name, value: module == ARCH, params)


def make_step(cfg: DartsConfig):
    """(init_fn, step): `step(carry, xt, yt, xv, yv) -> (carry, (train loss, val loss))`."""
    net = hk.without_apply_rng(hk.transform_with_state(lambda x: network(x, cfg)))
    w_opt = optax.sgd(W_LR, momentum=W_MOMENTUM)
    a_opt = optax.adam(A_LR, b1=A_B1, b2=A_B2)

    def init_carry(key: jax.Array) -> Any:
        params, state = net.init(key, jnp.zeros((1, cfg.image, cfg.image, 3)))
        alphas, weights = split(params)
        return weights, state, alphas, w_opt.init(weights), a_opt.init(alphas)

    def loss(weights: Any, alphas: Any, state: Any, x: jax.Array, y: jax.Array) -> Any:
        logits, state = net.apply(hk.data_structures.merge(weights, alphas), state, x)
        return cross_entropy(logits, y), state

    @jax.jit
    def step(carry: Any, xt: jax.Array, yt: jax.Array, xv: jax.Array, yv: jax.Array) -> Any:
        weights, state, alphas, w_state, a_state = carry
        val = jax.value_and_grad(lambda a, s: loss(weights, a, s, xv, yv), has_aux=True)
        (lv, state), ga = val(alphas, state)
        updates, a_state = a_opt.update(ga, a_state, alphas)
        alphas = optax.apply_updates(alphas, updates)
        train = jax.value_and_grad(lambda w, s: loss(w, alphas, s, xt, yt), has_aux=True)
        (lt, state), gw = train(weights, state)
        updates, w_state = w_opt.update(gw, w_state, weights)
        weights = optax.apply_updates(weights, updates)
        return (weights, state, alphas, w_state, a_state), (lt, lv)

    return init_carry, step
