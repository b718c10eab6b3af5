"""The DARTS supernet in Flax NNX: stateful `nnx.Module`s (NHWC), BatchNorm statistics updated
in place, the architecture weights an `nnx.Param` module of their own with an Adam
`nnx.Optimizer`, the weights an SGD `nnx.Optimizer`, one `nnx.jit` bilevel step (see
`darts_spec.py`). `darts_nnx_tree.py` runs the same in NNX's tree mode.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

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
from .nnx_models import value_and_param_grad


def _bn(c: int, rngs: nnx.Rngs, affine: bool = False) -> nnx.BatchNorm:
    return nnx.BatchNorm(
        c, momentum=1 - BN_MOMENTUM, epsilon=BN_EPS, use_bias=affine, use_scale=affine, rngs=rngs
    )


def _conv(cin: int, cout: int, k: int, rngs: nnx.Rngs, stride: int = 1, pad: int = 0,
          dil: int = 1, groups: int = 1) -> nnx.Conv:  # fmt: skip
    return nnx.Conv(
        cin, cout, (k, k), strides=stride, padding=((pad, pad), (pad, pad)),
        kernel_dilation=dil, feature_group_count=groups, use_bias=False, rngs=rngs,
    )  # fmt: skip


class ReLUConvBN(nnx.Module):
    def __init__(self, cin: int, cout: int, rngs: nnx.Rngs) -> None:
        self.conv, self.bn = _conv(cin, cout, 1, rngs), _bn(cout, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.bn(self.conv(nnx.relu(x)))


class FactorizedReduce(nnx.Module):
    def __init__(self, cin: int, cout: int, rngs: nnx.Rngs) -> None:
        self.conv1 = _conv(cin, cout // 2, 1, rngs, stride=2)
        self.conv2 = _conv(cin, cout // 2, 1, rngs, stride=2)
        self.bn = _bn(cout, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(x)
        return self.bn(jnp.concatenate([self.conv1(x), self.conv2(x[:, 1:, 1:, :])], axis=-1))


class SepConv(nnx.Module):
    def __init__(self, c: int, k: int, stride: int, rngs: nnx.Rngs) -> None:
        self.dw1 = _conv(c, c, k, rngs, stride, k // 2, groups=c)
        self.pw1, self.bn1 = _conv(c, c, 1, rngs), _bn(c, rngs)
        self.dw2 = _conv(c, c, k, rngs, 1, k // 2, groups=c)
        self.pw2, self.bn2 = _conv(c, c, 1, rngs), _bn(c, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.bn1(self.pw1(self.dw1(nnx.relu(x))))
        return self.bn2(self.pw2(self.dw2(nnx.relu(h))))


class DilConv(nnx.Module):
    def __init__(self, c: int, k: int, stride: int, rngs: nnx.Rngs) -> None:
        self.dw = _conv(c, c, k, rngs, stride, k - 1, dil=2, groups=c)
        self.pw, self.bn = _conv(c, c, 1, rngs), _bn(c, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.bn(self.pw(self.dw(nnx.relu(x))))


class MixedOp(nnx.Module):
    def __init__(self, c: int, stride: int, rngs: nnx.Rngs) -> None:
        self.stride = stride
        self.max_bn, self.avg_bn = _bn(c, rngs), _bn(c, rngs)
        self.skip = FactorizedReduce(c, c, rngs) if stride != 1 else None
        self.convs = nnx.List([
            SepConv(c, 3, stride, rngs), SepConv(c, 5, stride, rngs),
            DilConv(c, 3, stride, rngs), DilConv(c, 5, stride, rngs),
        ])  # fmt: skip

    def __call__(self, x: jax.Array, weights: jax.Array) -> jax.Array:
        s, pad = self.stride, ((1, 1), (1, 1))
        outs = [
            jnp.zeros_like(x[:, ::s, ::s, :]),
            self.max_bn(nnx.max_pool(x, (3, 3), (s, s), pad)),
            self.avg_bn(nnx.avg_pool(x, (3, 3), (s, s), pad, count_include_pad=True)),
            x if self.skip is None else self.skip(x),
            *(conv(x) for conv in self.convs),
        ]
        return sum(w * o for w, o in zip(weights, outs, strict=True))  # type: ignore[return-value]


class Cell(nnx.Module):
    def __init__(self, plan: tuple[int, int, int, bool, bool], rngs: nnx.Rngs) -> None:
        c_pp, c_p, c, reduction, reduction_prev = plan
        self.reduction = reduction
        self.pre0 = (FactorizedReduce if reduction_prev else ReLUConvBN)(c_pp, c, rngs)
        self.pre1 = ReLUConvBN(c_p, c, rngs)
        self.edges = nnx.List([MixedOp(c, s, rngs) for s in edge_strides(reduction)])

    def __call__(self, s0: jax.Array, s1: jax.Array, weights: jax.Array) -> jax.Array:
        states, e = [self.pre0(s0), self.pre1(s1)], 0
        for _ in range(NODES):
            total = 0.0
            for h in list(states):
                total, e = total + self.edges[e](h, weights[e]), e + 1
            states.append(total)  # type: ignore[arg-type]
        return jnp.concatenate(states[-NODES:], axis=-1)


class Network(nnx.Module):
    def __init__(self, cfg: DartsConfig, rngs: nnx.Rngs) -> None:
        plan = cell_plan(cfg)
        c_stem = STEM_MULTIPLIER * cfg.channels
        self.stem = _conv(3, c_stem, 3, rngs, pad=1)
        self.stem_bn = _bn(c_stem, rngs, affine=True)
        self.cells = nnx.List([Cell(pl, rngs) for pl in plan])
        self.head = nnx.Linear(NODES * plan[-1][2], cfg.classes, rngs=rngs)

    def __call__(self, x: jax.Array, alphas: Alphas) -> jax.Array:
        w_normal = jax.nn.softmax(alphas.normal[...], axis=-1)
        w_reduce = jax.nn.softmax(alphas.reduce[...], axis=-1)
        s0 = s1 = self.stem_bn(self.stem(x))
        for cell in self.cells:
            s0, s1 = s1, cell(s0, s1, w_reduce if cell.reduction else w_normal)
        return self.head(s1.mean(axis=(1, 2)))


class Alphas(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.normal = nnx.Param(1e-3 * jax.random.normal(rngs.params(), (EDGES, len(OPS))))
        self.reduce = nnx.Param(1e-3 * jax.random.normal(rngs.params(), (EDGES, len(OPS))))


def make_step(cfg: DartsConfig):
    """(init_fn, step): `step(carry, xt, yt, xv, yv) -> (carry, (train loss, val loss))`."""

    def init_carry(key: jax.Array) -> Any:
        seed = int(jax.random.randint(key, (), 0, 2**31 - 1))
        model, alphas = Network(cfg, nnx.Rngs(seed)), Alphas(nnx.Rngs(seed + 1))
        w_opt = nnx.Optimizer(model, optax.sgd(W_LR, momentum=W_MOMENTUM), wrt=nnx.Param)
        a_opt = nnx.Optimizer(alphas, optax.adam(A_LR, b1=A_B1, b2=A_B2), wrt=nnx.Param)
        return model, alphas, w_opt, a_opt

    @nnx.jit
    def train_step(model: Network, alphas: Alphas, w_opt: Any, a_opt: Any, xt: Any, yt: Any,
                   xv: Any, yv: Any) -> Any:  # fmt: skip
        val = nnx.value_and_grad(lambda a, m: cross_entropy(m(xv, a), yv), argnums=0)
        lv, ga = val(alphas, model)
        a_opt.update(alphas, ga)
        lt, gw = value_and_param_grad(lambda m, a: cross_entropy(m(xt, a), yt), model, alphas)
        w_opt.update(model, gw)
        return lt, lv

    def step(carry: Any, xt: jax.Array, yt: jax.Array, xv: jax.Array, yv: jax.Array) -> Any:
        return carry, train_step(*carry, xt, yt, xv, yv)

    step.lower = lambda carry, *a: train_step.lower(*carry, *a)  # type: ignore[attr-defined]
    return init_carry, step
