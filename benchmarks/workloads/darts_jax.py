"""The DARTS supernet in plain JAX: dicts of arrays, functions, one `jax.jit` bilevel step.

Weights, BatchNorm running statistics and architecture weights are three separate trees; the
step takes the first-order architecture step (Adam on the validation loss) and then the
weight step (SGD with momentum on the training loss, with the updated architecture), both
forward passes in training mode updating the running statistics.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax

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

Tree = Any
_DN = ("NHWC", "HWIO", "NHWC")


def _conv_w(key: jax.Array, k: int, cin: int, cout: int) -> jax.Array:
    bound = 1 / math.sqrt(cin * k * k)  # PyTorch's default (kaiming uniform, a=sqrt(5))
    return jax.random.uniform(key, (k, k, cin, cout), minval=-bound, maxval=bound)


def _conv(w: jax.Array, x: jax.Array, stride: int = 1, pad: int = 0, dil: int = 1, groups: int = 1):
    return lax.conv_general_dilated(
        x, w, (stride, stride), [(pad, pad)] * 2, rhs_dilation=(dil, dil),
        dimension_numbers=_DN, feature_group_count=groups,
    )  # fmt: skip


def _bn(x: jax.Array, state: dict[str, jax.Array], p: dict[str, jax.Array] | None):
    mean = x.mean(axis=(0, 1, 2))
    var = x.var(axis=(0, 1, 2))
    n = x.size // x.shape[-1]
    new = {
        "mean": (1 - BN_MOMENTUM) * state["mean"] + BN_MOMENTUM * mean,
        "var": (1 - BN_MOMENTUM) * state["var"] + BN_MOMENTUM * var * n / (n - 1),
    }
    y = (x - mean) * lax.rsqrt(var + BN_EPS)
    if p is not None:
        y = y * p["scale"] + p["bias"]
    return y, new


def _bn_state(c: int) -> dict[str, jax.Array]:
    return {"mean": jnp.zeros(c), "var": jnp.ones(c)}


# --- building blocks: (init -> (params, state), apply(params, state, x) -> (y, state)) -------


def _init_relu_conv_bn(key: jax.Array, cin: int, cout: int) -> tuple[Tree, Tree]:
    return {"w": _conv_w(key, 1, cin, cout)}, _bn_state(cout)


def _relu_conv_bn(p: Tree, s: Tree, x: jax.Array):
    return _bn(_conv(p["w"], jax.nn.relu(x)), s, None)


def _init_fact_reduce(key: jax.Array, cin: int, cout: int) -> tuple[Tree, Tree]:
    k1, k2 = jax.random.split(key)
    return {"w1": _conv_w(k1, 1, cin, cout // 2), "w2": _conv_w(k2, 1, cin, cout // 2)}, (
        _bn_state(cout)
    )


def _fact_reduce(p: Tree, s: Tree, x: jax.Array):
    x = jax.nn.relu(x)
    y = jnp.concatenate([_conv(p["w1"], x, 2), _conv(p["w2"], x[:, 1:, 1:, :], 2)], axis=-1)
    return _bn(y, s, None)


def _init_sep(key: jax.Array, c: int, k: int) -> tuple[Tree, Tree]:
    ks = jax.random.split(key, 4)
    p = {
        "dw1": _conv_w(ks[0], k, 1, c), "pw1": _conv_w(ks[1], 1, c, c),
        "dw2": _conv_w(ks[2], k, 1, c), "pw2": _conv_w(ks[3], 1, c, c),
    }  # fmt: skip
    return p, {"bn1": _bn_state(c), "bn2": _bn_state(c)}


def _sep(p: Tree, s: Tree, x: jax.Array, k: int, stride: int):
    c = x.shape[-1]
    h = _conv(p["pw1"], _conv(p["dw1"], jax.nn.relu(x), stride, k // 2, groups=c))
    h, s1 = _bn(h, s["bn1"], None)
    h = _conv(p["pw2"], _conv(p["dw2"], jax.nn.relu(h), 1, k // 2, groups=c))
    h, s2 = _bn(h, s["bn2"], None)
    return h, {"bn1": s1, "bn2": s2}


def _init_dil(key: jax.Array, c: int, k: int) -> tuple[Tree, Tree]:
    k1, k2 = jax.random.split(key)
    return {"dw": _conv_w(k1, k, 1, c), "pw": _conv_w(k2, 1, c, c)}, _bn_state(c)


def _dil(p: Tree, s: Tree, x: jax.Array, k: int, stride: int):
    c = x.shape[-1]
    h = _conv(p["pw"], _conv(p["dw"], jax.nn.relu(x), stride, k - 1, dil=2, groups=c))
    return _bn(h, s, None)


def _pool(x: jax.Array, stride: int, kind: str) -> jax.Array:
    window, strides, pads = (1, 3, 3, 1), (1, stride, stride, 1), ((0, 0), (1, 1), (1, 1), (0, 0))
    if kind == "max":
        return lax.reduce_window(x, -jnp.inf, lax.max, window, strides, pads)
    return lax.reduce_window(x, 0.0, lax.add, window, strides, pads) / 9.0


def _init_mixed(key: jax.Array, c: int, stride: int) -> tuple[Tree, Tree]:
    ks = jax.random.split(key, 5)
    params: dict[str, Tree] = {}
    state: dict[str, Tree] = {"max_pool_3x3": _bn_state(c), "avg_pool_3x3": _bn_state(c)}
    if stride != 1:
        params["skip_connect"], state["skip_connect"] = _init_fact_reduce(ks[0], c, c)
    for name, init, k, kk in [
        ("sep_conv_3x3", _init_sep, 3, ks[1]), ("sep_conv_5x5", _init_sep, 5, ks[2]),
        ("dil_conv_3x3", _init_dil, 3, ks[3]), ("dil_conv_5x5", _init_dil, 5, ks[4]),
    ]:  # fmt: skip
        params[name], state[name] = init(kk, c, k)
    return params, state


def _mixed(p: Tree, s: Tree, x: jax.Array, weights: jax.Array, stride: int):
    outs, new = {}, {}
    outs["none"] = jnp.zeros_like(x[:, ::stride, ::stride, :])
    for kind in ("max", "avg"):
        name = f"{kind}_pool_3x3"
        outs[name], new[name] = _bn(_pool(x, stride, kind), s[name], None)
    if stride == 1:
        outs["skip_connect"] = x
    else:
        outs["skip_connect"], new["skip_connect"] = _fact_reduce(
            p["skip_connect"], s["skip_connect"], x
        )
    for name, fn, k in [
        ("sep_conv_3x3", _sep, 3), ("sep_conv_5x5", _sep, 5),
        ("dil_conv_3x3", _dil, 3), ("dil_conv_5x5", _dil, 5),
    ]:  # fmt: skip
        outs[name], new[name] = fn(p[name], s[name], x, k, stride)
    return sum(weights[i] * outs[name] for i, name in enumerate(OPS)), new


def _init_cell(key: jax.Array, plan: tuple[int, int, int, bool, bool]) -> tuple[Tree, Tree]:
    c_pp, c_p, c, reduction, reduction_prev = plan
    ks = jax.random.split(key, 2 + EDGES)
    init0 = _init_fact_reduce if reduction_prev else _init_relu_conv_bn
    p0, s0 = init0(ks[0], c_pp, c)
    p1, s1 = _init_relu_conv_bn(ks[1], c_p, c)
    edges = [
        _init_mixed(k, c, stride) for k, stride in zip(ks[2:], edge_strides(reduction), strict=True)
    ]
    return (
        {"pre0": p0, "pre1": p1, "edges": [e[0] for e in edges]},
        {"pre0": s0, "pre1": s1, "edges": [e[1] for e in edges]},
    )


def _cell(p: Tree, s: Tree, s0: jax.Array, s1: jax.Array, weights: jax.Array, plan: Any):
    reduction, reduction_prev = plan[3], plan[4]
    s0, n0 = (_fact_reduce if reduction_prev else _relu_conv_bn)(p["pre0"], s["pre0"], s0)
    s1, n1 = _relu_conv_bn(p["pre1"], s["pre1"], s1)
    states, new_edges, e = [s0, s1], [], 0
    strides = edge_strides(reduction)
    for _ in range(NODES):
        total = 0.0
        for h in list(states):
            y, ns = _mixed(p["edges"][e], s["edges"][e], h, weights[e], strides[e])
            new_edges.append(ns)
            total = total + y
            e += 1
        states.append(total)
    out = jnp.concatenate(states[-NODES:], axis=-1)
    return out, {"pre0": n0, "pre1": n1, "edges": new_edges}


def init(key: jax.Array, cfg: DartsConfig) -> tuple[Tree, Tree, Tree]:
    """(weights, BatchNorm state, architecture weights) of the supernet."""
    plan = cell_plan(cfg)
    ks = jax.random.split(key, len(plan) + 3)
    c_stem = STEM_MULTIPLIER * cfg.channels
    cells = [_init_cell(k, pl) for k, pl in zip(ks[1 : len(plan) + 1], plan, strict=True)]
    c_last = NODES * plan[-1][2]
    bound = 1 / math.sqrt(c_last)
    kw, kb = jax.random.split(ks[-2])
    params = {
        "stem": {
            "w": _conv_w(ks[0], 3, 3, c_stem), "scale": jnp.ones(c_stem),
            "bias": jnp.zeros(c_stem),
        },
        "cells": [c[0] for c in cells],
        "head": {
            "w": jax.random.uniform(kw, (c_last, cfg.classes), minval=-bound, maxval=bound),
            "b": jax.random.uniform(kb, (cfg.classes,), minval=-bound, maxval=bound),
        },
    }  # fmt: skip
    state = {"stem": _bn_state(c_stem), "cells": [c[1] for c in cells]}
    ka, kr = jax.random.split(ks[-1])
    alphas = {
        "normal": 1e-3 * jax.random.normal(ka, (EDGES, len(OPS))),
        "reduce": 1e-3 * jax.random.normal(kr, (EDGES, len(OPS))),
    }
    return params, state, alphas


def forward(params: Tree, state: Tree, alphas: Tree, x: jax.Array, cfg: DartsConfig):
    """Logits and the new BatchNorm state (training mode)."""
    plan = cell_plan(cfg)
    stem = params["stem"]
    h, stem_state = _bn(_conv(stem["w"], x, 1, 1), state["stem"], stem)
    w_normal = jax.nn.softmax(alphas["normal"], axis=-1)
    w_reduce = jax.nn.softmax(alphas["reduce"], axis=-1)
    s0 = s1 = h
    cells = []
    for p, s, pl in zip(params["cells"], state["cells"], plan, strict=True):
        out, ns = _cell(p, s, s0, s1, w_reduce if pl[3] else w_normal, pl)
        s0, s1 = s1, out
        cells.append(ns)
    logits = s1.mean(axis=(1, 2)) @ params["head"]["w"] + params["head"]["b"]
    return logits, {"stem": stem_state, "cells": cells}


def make_step(cfg: DartsConfig):
    """(init_fn, step): `step(carry, xt, yt, xv, yv) -> (carry, (train loss, val loss))`."""
    w_opt = optax.sgd(W_LR, momentum=W_MOMENTUM)
    a_opt = optax.adam(A_LR, b1=A_B1, b2=A_B2)

    def init_carry(key: jax.Array) -> Tree:
        params, state, alphas = init(key, cfg)
        return params, state, alphas, w_opt.init(params), a_opt.init(alphas)

    @jax.jit
    def step(carry: Tree, xt: jax.Array, yt: jax.Array, xv: jax.Array, yv: jax.Array):
        params, state, alphas, w_state, a_state = carry

        def val_loss(alphas: Tree, state: Tree):
            logits, state = forward(params, state, alphas, xv, cfg)
            return cross_entropy(logits, yv), state

        (lv, state), ga = jax.value_and_grad(val_loss, has_aux=True)(alphas, state)
        updates, a_state = a_opt.update(ga, a_state, alphas)
        alphas = optax.apply_updates(alphas, updates)

        def train_loss(params: Tree, state: Tree):
            logits, state = forward(params, state, alphas, xt, cfg)
            return cross_entropy(logits, yt), state

        (lt, state), gw = jax.value_and_grad(train_loss, has_aux=True)(params, state)
        updates, w_state = w_opt.update(gw, w_state, params)
        params = optax.apply_updates(params, updates)
        return (params, state, alphas, w_state, a_state), (lt, lv)

    return init_carry, step
