"""The DARTS supernet in Flax Linen: `nn.Module`s applied with `init`/`apply`, variables in
collections, one `jax.jit` bilevel step (see `darts_spec.py`).

Written as the Linen docs recommend: weights in the `params` collection, BatchNorm statistics
in `batch_stats` (`use_running_average=False`, applied with `mutable=["batch_stats"]`), the
architecture weights in a collection of their own (`arch`) so that each optimiser sees one
collection, a `flax.training.train_state.TrainState` per optimiser, layout NHWC. Cells list
their edges in `setup`; the other modules are `@nn.compact`.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

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


def _bn(name: str | None = None, affine: bool = False) -> nn.BatchNorm:
    # Flax's momentum is the running statistics' decay: PyTorch's 0.1 is Flax's 0.9.
    return nn.BatchNorm(
        use_running_average=False, momentum=1 - BN_MOMENTUM, epsilon=BN_EPS,
        use_bias=affine, use_scale=affine, name=name,
    )  # fmt: skip


def _conv(cout: int, k: int, stride: int = 1, pad: int = 0, dil: int = 1, groups: int = 1,
          name: str | None = None) -> nn.Conv:  # fmt: skip
    return nn.Conv(
        cout, (k, k), strides=stride, padding=((pad, pad), (pad, pad)), kernel_dilation=dil,
        feature_group_count=groups, use_bias=False, name=name,
    )  # fmt: skip


class ReLUConvBN(nn.Module):
    cout: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return _bn("bn")(_conv(self.cout, 1, name="conv")(nn.relu(x)))


class FactorizedReduce(nn.Module):
    cout: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(x)
        a = _conv(self.cout // 2, 1, stride=2, name="conv1")(x)
        b = _conv(self.cout // 2, 1, stride=2, name="conv2")(x[:, 1:, 1:, :])
        return _bn("bn")(jnp.concatenate([a, b], axis=-1))


class SepConv(nn.Module):
    c: int
    k: int
    stride: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c, k = self.c, self.k
        h = _conv(c, k, self.stride, k // 2, groups=c, name="dw1")(nn.relu(x))
        h = _bn("bn1")(_conv(c, 1, name="pw1")(h))
        h = _conv(c, k, 1, k // 2, groups=c, name="dw2")(nn.relu(h))
        return _bn("bn2")(_conv(c, 1, name="pw2")(h))


class DilConv(nn.Module):
    c: int
    k: int
    stride: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c, k = self.c, self.k
        h = _conv(c, k, self.stride, k - 1, dil=2, groups=c, name="dw")(nn.relu(x))
        return _bn("bn")(_conv(c, 1, name="pw")(h))


class MixedOp(nn.Module):
    c: int
    stride: int

    @nn.compact
    def __call__(self, x: jax.Array, weights: jax.Array) -> jax.Array:
        c, s, pad = self.c, self.stride, ((1, 1), (1, 1))
        outs = [
            jnp.zeros_like(x[:, ::s, ::s, :]),
            _bn("max_bn")(nn.max_pool(x, (3, 3), (s, s), pad)),
            _bn("avg_bn")(nn.avg_pool(x, (3, 3), (s, s), pad, count_include_pad=True)),
            x if s == 1 else FactorizedReduce(c, name="skip")(x),
            SepConv(c, 3, s, name="sep3")(x),
            SepConv(c, 5, s, name="sep5")(x),
            DilConv(c, 3, s, name="dil3")(x),
            DilConv(c, 5, s, name="dil5")(x),
        ]
        return sum(w * o for w, o in zip(weights, outs, strict=True))  # type: ignore[return-value]


class Cell(nn.Module):
    plan: tuple[int, int, int, bool, bool]

    def setup(self) -> None:
        _, _, c, reduction, reduction_prev = self.plan
        self.pre0 = FactorizedReduce(c) if reduction_prev else ReLUConvBN(c)
        self.pre1 = ReLUConvBN(c)
        self.edges = [MixedOp(c, s) for s in edge_strides(reduction)]

    def __call__(self, s0: jax.Array, s1: jax.Array, weights: jax.Array) -> jax.Array:
        states, e = [self.pre0(s0), self.pre1(s1)], 0
        for _ in range(NODES):
            total = 0.0
            for h in list(states):
                total, e = total + self.edges[e](h, weights[e]), e + 1
            states.append(total)  # type: ignore[arg-type]
        return jnp.concatenate(states[-NODES:], axis=-1)


class Network(nn.Module):
    """The supernet; its architecture weights are the `arch` collection's `normal`/`reduce`."""

    cfg: DartsConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        plan = cell_plan(self.cfg)
        draw = lambda: 1e-3 * jax.random.normal(self.make_rng("arch"), (EDGES, len(OPS)))
        alphas = {name: self.variable("arch", name, draw).value for name in ("normal", "reduce")}
        w_normal = jax.nn.softmax(alphas["normal"], axis=-1)
        w_reduce = jax.nn.softmax(alphas["reduce"], axis=-1)
        c_stem = STEM_MULTIPLIER * self.cfg.channels
        s0 = s1 = _bn("stem_bn", affine=True)(_conv(c_stem, 3, pad=1, name="stem")(x))
        for i, pl in enumerate(plan):
            s0, s1 = s1, Cell(pl, name=f"cell{i}")(s0, s1, w_reduce if pl[3] else w_normal)
        return nn.Dense(self.cfg.classes, name="head")(s1.mean(axis=(1, 2)))


class TrainState(train_state.TrainState):
    batch_stats: Any = None


def init(key: jax.Array, cfg: DartsConfig) -> Any:
    """The supernet's variables: `params`, `batch_stats` and `arch`."""
    kp, ka = jax.random.split(key)
    sample = jnp.zeros((1, cfg.image, cfg.image, 3))
    return Network(cfg).init({"params": kp, "arch": ka}, sample)


def make_step(cfg: DartsConfig):
    """(init_fn, step): `step(carry, xt, yt, xv, yv) -> (carry, (train loss, val loss))`."""
    model = Network(cfg)

    def init_carry(key: jax.Array) -> Any:
        variables = init(key, cfg)
        weights = TrainState.create(
            apply_fn=model.apply, params=variables["params"],
            tx=optax.sgd(W_LR, momentum=W_MOMENTUM), batch_stats=variables["batch_stats"],
        )  # fmt: skip
        arch = train_state.TrainState.create(
            apply_fn=model.apply, params=variables["arch"], tx=optax.adam(A_LR, b1=A_B1, b2=A_B2)
        )
        return weights, arch

    def loss(params: Any, stats: Any, arch: Any, x: jax.Array, y: jax.Array) -> Any:
        variables = {"params": params, "batch_stats": stats, "arch": arch}
        logits, updates = model.apply(variables, x, mutable=["batch_stats"])
        return cross_entropy(logits, y), updates["batch_stats"]

    @jax.jit
    def step(carry: Any, xt: jax.Array, yt: jax.Array, xv: jax.Array, yv: jax.Array) -> Any:
        weights, arch = carry
        val = jax.value_and_grad(
            lambda a, s: loss(weights.params, s, a, xv, yv), has_aux=True
        )  # fmt: skip
        (lv, stats), ga = val(arch.params, weights.batch_stats)
        arch = arch.apply_gradients(grads=ga)
        train = jax.value_and_grad(lambda p, s: loss(p, s, arch.params, xt, yt), has_aux=True)
        (lt, stats), gw = train(weights.params, stats)
        weights = weights.apply_gradients(grads=gw).replace(batch_stats=stats)
        return (weights, arch), (lt, lv)

    return init_carry, step
