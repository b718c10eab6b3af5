"""The DARTS supernet in Equinox: `eqx.Module`s on one example (channels first), `jax.vmap`
over the batch with `axis_name="batch"`, BatchNorm statistics in an `eqx.nn.State` from
`eqx.nn.make_with_state`, one `eqx.filter_jit` bilevel step (see `darts_spec.py`).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
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

State = eqx.nn.State


def _bn(c: int, affine: bool = False) -> eqx.nn.BatchNorm:
    return eqx.nn.BatchNorm(
        c, "batch", eps=BN_EPS, channelwise_affine=affine, momentum=1 - BN_MOMENTUM, mode="batch"
    )


def _conv(cin: int, cout: int, k: int, key: jax.Array, **kw: Any) -> eqx.nn.Conv2d:
    return eqx.nn.Conv2d(cin, cout, k, use_bias=False, key=key, **kw)


class ReLUConvBN(eqx.Module):
    conv: eqx.nn.Conv2d
    bn: eqx.nn.BatchNorm

    def __init__(self, cin: int, cout: int, *, key: jax.Array) -> None:
        self.conv, self.bn = _conv(cin, cout, 1, key), _bn(cout)

    def __call__(self, x: jax.Array, state: State) -> tuple[jax.Array, State]:
        return self.bn(self.conv(jax.nn.relu(x)), state)


class FactorizedReduce(eqx.Module):
    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    bn: eqx.nn.BatchNorm

    def __init__(self, cin: int, cout: int, *, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.conv1 = _conv(cin, cout // 2, 1, k1, stride=2)
        self.conv2 = _conv(cin, cout // 2, 1, k2, stride=2)
        self.bn = _bn(cout)

    def __call__(self, x: jax.Array, state: State) -> tuple[jax.Array, State]:
        x = jax.nn.relu(x)
        return self.bn(jnp.concatenate([self.conv1(x), self.conv2(x[:, 1:, 1:])]), state)


class SepConv(eqx.Module):
    dw1: eqx.nn.Conv2d
    pw1: eqx.nn.Conv2d
    bn1: eqx.nn.BatchNorm
    dw2: eqx.nn.Conv2d
    pw2: eqx.nn.Conv2d
    bn2: eqx.nn.BatchNorm

    def __init__(self, c: int, k: int, stride: int, *, key: jax.Array) -> None:
        ks = jax.random.split(key, 4)
        self.dw1 = _conv(c, c, k, ks[0], stride=stride, padding=k // 2, groups=c)
        self.pw1, self.bn1 = _conv(c, c, 1, ks[1]), _bn(c)
        self.dw2 = _conv(c, c, k, ks[2], padding=k // 2, groups=c)
        self.pw2, self.bn2 = _conv(c, c, 1, ks[3]), _bn(c)

    def __call__(self, x: jax.Array, state: State) -> tuple[jax.Array, State]:
        h, state = self.bn1(self.pw1(self.dw1(jax.nn.relu(x))), state)
        return self.bn2(self.pw2(self.dw2(jax.nn.relu(h))), state)


class DilConv(eqx.Module):
    dw: eqx.nn.Conv2d
    pw: eqx.nn.Conv2d
    bn: eqx.nn.BatchNorm

    def __init__(self, c: int, k: int, stride: int, *, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.dw = _conv(c, c, k, k1, stride=stride, padding=k - 1, dilation=2, groups=c)
        self.pw, self.bn = _conv(c, c, 1, k2), _bn(c)

    def __call__(self, x: jax.Array, state: State) -> tuple[jax.Array, State]:
        return self.bn(self.pw(self.dw(jax.nn.relu(x))), state)


class MixedOp(eqx.Module):
    stride: int = eqx.field(static=True)
    max_pool: eqx.nn.MaxPool2d
    max_bn: eqx.nn.BatchNorm
    avg_pool: eqx.nn.AvgPool2d
    avg_bn: eqx.nn.BatchNorm
    skip: FactorizedReduce | None
    convs: list[Any]

    def __init__(self, c: int, stride: int, *, key: jax.Array) -> None:
        ks = jax.random.split(key, 5)
        self.stride = stride
        self.max_pool = eqx.nn.MaxPool2d(3, stride, padding=1)
        self.avg_pool = eqx.nn.AvgPool2d(3, stride, padding=1)
        self.max_bn, self.avg_bn = _bn(c), _bn(c)
        self.skip = FactorizedReduce(c, c, key=ks[0]) if stride != 1 else None
        self.convs = [
            SepConv(c, 3, stride, key=ks[1]), SepConv(c, 5, stride, key=ks[2]),
            DilConv(c, 3, stride, key=ks[3]), DilConv(c, 5, stride, key=ks[4]),
        ]  # fmt: skip

    def __call__(self, x: jax.Array, weights: jax.Array, state: State) -> tuple[jax.Array, State]:
        s = self.stride
        outs = [jnp.zeros_like(x[:, ::s, ::s])]
        y, state = self.max_bn(self.max_pool(x), state)
        outs.append(y)
        y, state = self.avg_bn(self.avg_pool(x), state)
        outs.append(y)
        if self.skip is None:
            outs.append(x)
        else:
            y, state = self.skip(x, state)
            outs.append(y)
        for conv in self.convs:
            y, state = conv(x, state)
            outs.append(y)
        return sum(w * o for w, o in zip(weights, outs, strict=True)), state  # type: ignore[return-value]


class Cell(eqx.Module):
    reduction: bool = eqx.field(static=True)
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

    def __call__(self, s0: jax.Array, s1: jax.Array, weights: jax.Array, state: State) -> Any:
        s0, state = self.pre0(s0, state)
        s1, state = self.pre1(s1, state)
        states, e = [s0, s1], 0
        for _ in range(NODES):
            total = 0.0
            for h in list(states):
                y, state = self.edges[e](h, weights[e], state)
                total, e = total + y, e + 1
            states.append(total)  # type: ignore[arg-type]
        return jnp.concatenate(states[-NODES:]), state


class Network(eqx.Module):
    stem: eqx.nn.Conv2d
    stem_bn: eqx.nn.BatchNorm
    cells: list[Cell]
    head: eqx.nn.Linear

    def __init__(self, cfg: DartsConfig, *, key: jax.Array) -> None:
        plan = cell_plan(cfg)
        ks = jax.random.split(key, len(plan) + 2)
        c_stem = STEM_MULTIPLIER * cfg.channels
        self.stem = _conv(3, c_stem, 3, ks[0], padding=1)
        self.stem_bn = _bn(c_stem, affine=True)
        self.cells = [Cell(pl, key=k) for pl, k in zip(plan, ks[1:-1], strict=True)]
        self.head = eqx.nn.Linear(NODES * plan[-1][2], cfg.classes, key=ks[-1])

    def __call__(self, x: jax.Array, alphas: Any, state: State) -> tuple[jax.Array, State]:
        w_normal = jax.nn.softmax(alphas["normal"], axis=-1)
        w_reduce = jax.nn.softmax(alphas["reduce"], axis=-1)
        s1, state = self.stem_bn(self.stem(x), state)
        s0 = s1
        for cell in self.cells:
            out, state = cell(s0, s1, w_reduce if cell.reduction else w_normal, state)
            s0, s1 = s1, out
        return self.head(s1.mean(axis=(1, 2))), state


def make_step(cfg: DartsConfig):
    """(init_fn, step): `step(carry, xt, yt, xv, yv) -> (carry, (train loss, val loss))`.

    Images come NHWC as for the other libraries and are transposed to one example's CHW."""
    w_opt = optax.sgd(W_LR, momentum=W_MOMENTUM)
    a_opt = optax.adam(A_LR, b1=A_B1, b2=A_B2)

    def init_carry(key: jax.Array) -> Any:
        kn, ka, kr = jax.random.split(key, 3)
        model, state = eqx.nn.make_with_state(Network)(cfg, key=kn)
        alphas = {
            "normal": 1e-3 * jax.random.normal(ka, (EDGES, len(OPS))),
            "reduce": 1e-3 * jax.random.normal(kr, (EDGES, len(OPS))),
        }
        params = eqx.filter(model, eqx.is_inexact_array)
        return model, state, alphas, w_opt.init(params), a_opt.init(alphas)

    def loss(model: Network, alphas: Any, state: State, x: jax.Array, y: jax.Array) -> Any:
        batched = jax.vmap(model, axis_name="batch", in_axes=(0, None, None), out_axes=(0, None))
        logits, state = batched(jnp.moveaxis(x, -1, 1), alphas, state)
        return cross_entropy(logits, y), state

    @eqx.filter_jit
    def step(carry: Any, xt: jax.Array, yt: jax.Array, xv: jax.Array, yv: jax.Array) -> Any:
        model, state, alphas, w_state, a_state = carry
        val = eqx.filter_value_and_grad(lambda a, s: loss(model, a, s, xv, yv), has_aux=True)
        (lv, state), ga = val(alphas, state)
        updates, a_state = a_opt.update(ga, a_state, alphas)
        alphas = optax.apply_updates(alphas, updates)
        train = eqx.filter_value_and_grad(lambda m, s: loss(m, alphas, s, xt, yt), has_aux=True)
        (lt, state), gw = train(model, state)
        updates, w_state = w_opt.update(gw, w_state, eqx.filter(model, eqx.is_inexact_array))
        model = eqx.apply_updates(model, updates)
        return (model, state, alphas, w_state, a_state), (lt, lv)

    return init_carry, step
