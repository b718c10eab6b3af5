"""The DARTS supernet in treemod: `tm.Module`s from `treemod.nn`, channels-last, one
`tm.filter_jit` bilevel step.

The network is a module (BatchNorm running statistics inside it, updated through
`tm.stateful`); the architecture weights are a separate dict of arrays, as they have their own
optimiser. Written the natural way: one module class per DARTS building block.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

import treemod as tm
import treemod.nn as nn

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


def _bn(c: int, affine: bool = False) -> nn.BatchNorm:
    return nn.BatchNorm(
        c, eps=BN_EPS, momentum=BN_MOMENTUM, channelwise_affine=affine, channels_last=True
    )


def _conv(cin: int, cout: int, k: int, key: jax.Array, **kw: Any) -> nn.Conv:
    return nn.Conv(2, cin, cout, k, use_bias=False, channels_last=True, key=key, **kw)


class ReLUConvBN(tm.Module):
    conv: nn.Conv
    bn: nn.BatchNorm

    def __init__(self, cin: int, cout: int, *, key: jax.Array) -> None:
        self.conv = _conv(cin, cout, 1, key)
        self.bn = _bn(cout)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.bn(self.conv(jax.nn.relu(x)))


class FactorizedReduce(tm.Module):
    conv1: nn.Conv
    conv2: nn.Conv
    bn: nn.BatchNorm

    def __init__(self, cin: int, cout: int, *, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.conv1 = _conv(cin, cout // 2, 1, k1, stride=2)
        self.conv2 = _conv(cin, cout // 2, 1, k2, stride=2)
        self.bn = _bn(cout)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jax.nn.relu(x)
        y = jnp.concatenate([self.conv1(x), self.conv2(x[:, 1:, 1:, :])], axis=-1)
        return self.bn(y)


class SepConv(tm.Module):
    dw1: nn.Conv
    pw1: nn.Conv
    bn1: nn.BatchNorm
    dw2: nn.Conv
    pw2: nn.Conv
    bn2: nn.BatchNorm

    def __init__(self, c: int, k: int, stride: int, *, key: jax.Array) -> None:
        ks = jax.random.split(key, 4)
        self.dw1 = _conv(c, c, k, ks[0], stride=stride, padding=k // 2, groups=c)
        self.pw1 = _conv(c, c, 1, ks[1])
        self.bn1 = _bn(c)
        self.dw2 = _conv(c, c, k, ks[2], padding=k // 2, groups=c)
        self.pw2 = _conv(c, c, 1, ks[3])
        self.bn2 = _bn(c)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.bn1(self.pw1(self.dw1(jax.nn.relu(x))))
        return self.bn2(self.pw2(self.dw2(jax.nn.relu(h))))


class DilConv(tm.Module):
    dw: nn.Conv
    pw: nn.Conv
    bn: nn.BatchNorm

    def __init__(self, c: int, k: int, stride: int, *, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.dw = _conv(c, c, k, k1, stride=stride, padding=k - 1, dilation=2, groups=c)
        self.pw = _conv(c, c, 1, k2)
        self.bn = _bn(c)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.bn(self.pw(self.dw(jax.nn.relu(x))))


class MixedOp(tm.Module):
    stride: int = tm.field(static=True)
    max_pool: nn.MaxPool
    max_bn: nn.BatchNorm
    avg_pool: nn.AvgPool
    avg_bn: nn.BatchNorm
    skip: FactorizedReduce | None
    convs: list[tm.Module]

    def __init__(self, c: int, stride: int, *, key: jax.Array) -> None:
        ks = jax.random.split(key, 5)
        self.stride = stride
        self.max_pool = nn.MaxPool(2, 3, stride, padding=1, channels_last=True)
        self.avg_pool = nn.AvgPool(2, 3, stride, padding=1, channels_last=True)
        self.max_bn, self.avg_bn = _bn(c), _bn(c)
        self.skip = FactorizedReduce(c, c, key=ks[0]) if stride != 1 else None
        self.convs = [
            SepConv(c, 3, stride, key=ks[1]), SepConv(c, 5, stride, key=ks[2]),
            DilConv(c, 3, stride, key=ks[3]), DilConv(c, 5, stride, key=ks[4]),
        ]  # fmt: skip

    # The one switch: the 14 edges of a cell share a configuration, so XLA compiles one edge
    # per configuration and group of independent edges instead of every copy.
    @tm.compile_once
    def __call__(self, x: jax.Array, weights: jax.Array) -> jax.Array:
        s = self.stride
        outs = [
            jnp.zeros_like(x[:, ::s, ::s, :]),
            self.max_bn(self.max_pool(x)),
            self.avg_bn(self.avg_pool(x)),
            x if self.skip is None else self.skip(x),
            *(conv(x) for conv in self.convs),
        ]
        return sum(w * o for w, o in zip(weights, outs, strict=True))  # type: ignore[return-value]


class Cell(tm.Module):
    reduction: bool = tm.field(static=True)
    pre0: ReLUConvBN | FactorizedReduce
    pre1: ReLUConvBN
    edges: list[MixedOp]

    def __init__(self, plan: tuple[int, int, int, bool, bool], *, key: jax.Array) -> None:
        c_pp, c_p, c, reduction, reduction_prev = plan
        ks = jax.random.split(key, 2 + EDGES)
        self.reduction = reduction
        self.pre0 = (FactorizedReduce if reduction_prev else ReLUConvBN)(c_pp, c, key=ks[0])
        self.pre1 = ReLUConvBN(c_p, c, key=ks[1])
        self.edges = [
            MixedOp(c, s, key=k) for k, s in zip(ks[2:], edge_strides(reduction), strict=True)
        ]

    def __call__(self, s0: jax.Array, s1: jax.Array, weights: jax.Array) -> jax.Array:
        states = [self.pre0(s0), self.pre1(s1)]
        e = 0
        for _ in range(NODES):
            total = 0.0
            for h in list(states):
                total = total + self.edges[e](h, weights[e])
                e += 1
            states.append(total)  # type: ignore[arg-type]
        return jnp.concatenate(states[-NODES:], axis=-1)


class Network(tm.Module):
    stem: nn.Conv
    stem_bn: nn.BatchNorm
    cells: list[Cell]
    head: nn.Linear

    def __init__(self, cfg: DartsConfig, *, key: jax.Array) -> None:
        plan = cell_plan(cfg)
        ks = jax.random.split(key, len(plan) + 2)
        c_stem = STEM_MULTIPLIER * cfg.channels
        self.stem = _conv(3, c_stem, 3, ks[0], padding=1)
        self.stem_bn = _bn(c_stem, affine=True)
        self.cells = [Cell(pl, key=k) for pl, k in zip(plan, ks[1:-1], strict=True)]
        self.head = nn.Linear(NODES * plan[-1][2], cfg.classes, key=ks[-1])

    def __call__(self, x: jax.Array, alphas: dict[str, jax.Array]) -> jax.Array:
        w_normal = jax.nn.softmax(alphas["normal"], axis=-1)
        w_reduce = jax.nn.softmax(alphas["reduce"], axis=-1)
        s0 = s1 = self.stem_bn(self.stem(x))
        for cell in self.cells:
            s0, s1 = s1, cell(s0, s1, w_reduce if cell.reduction else w_normal)
        return self.head(s1.mean(axis=(1, 2)))


def init_alphas(key: jax.Array) -> dict[str, jax.Array]:
    ka, kr = jax.random.split(key)
    return {
        "normal": 1e-3 * jax.random.normal(ka, (EDGES, len(OPS))),
        "reduce": 1e-3 * jax.random.normal(kr, (EDGES, len(OPS))),
    }


def make_step(cfg: DartsConfig):
    """(init_fn, step): `step(carry, xt, yt, xv, yv) -> (carry, (train loss, val loss))`."""
    w_opt = optax.sgd(W_LR, momentum=W_MOMENTUM)
    a_opt = optax.adam(A_LR, b1=A_B1, b2=A_B2)

    def init_carry(key: jax.Array) -> Any:
        kn, ka = jax.random.split(key)
        model = Network(cfg, key=kn)
        alphas = init_alphas(ka)
        return model, alphas, w_opt.init(tm.filter(model, tm.is_param)), a_opt.init(alphas)

    @tm.filter_jit
    def step(carry: Any, xt: jax.Array, yt: jax.Array, xv: jax.Array, yv: jax.Array) -> Any:
        model, alphas, w_state, a_state = carry

        def val_loss(alphas: Any, model: Network) -> Any:
            logits, model = tm.stateful(model)(xv, alphas)
            return cross_entropy(logits, yv), model

        (lv, model), ga = tm.filter_value_and_grad(val_loss, has_aux=True)(alphas, model)
        updates, a_state = a_opt.update(ga, a_state, alphas)
        alphas = optax.apply_updates(alphas, updates)

        def train_loss(model: Network) -> Any:
            logits, model = tm.stateful(model)(xt, alphas)
            return cross_entropy(logits, yt), model

        (lt, new_model), gw = tm.filter_value_and_grad(train_loss, has_aux=True)(model)
        updates, w_state = w_opt.update(gw, w_state, tm.filter(model, tm.is_param))
        return (tm.apply_updates(new_model, updates), alphas, w_state, a_state), (lt, lv)

    return init_carry, step
