"""`tm.compile_once`: same outputs, gradients, keys and state as the undecorated method, each
configuration traced once, and independent calls rolled into one loop."""

from __future__ import annotations

import re
from typing import Any

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings

import treemod as tm
import treemod.nn as nn

TRACES: list[str] = []


class Block(tm.Module):
    """A branch with weights, a BatchNorm and dropout: every kind of leaf crosses the call."""

    linear: nn.Linear
    norm: nn.BatchNorm
    scale: float = tm.field(static=True)

    def __init__(self, width: int, scale: float, *, key: jax.Array) -> None:
        self.linear = nn.Linear(width, width, key=key)
        self.norm = nn.BatchNorm(width)
        self.scale = scale

    def body(self, x: jax.Array, key: jax.Array | None) -> jax.Array:
        TRACES.append(type(self).__name__)
        h = self.norm(jnp.tanh(self.linear(x))) * self.scale
        if key is not None:
            h = jnp.where(jax.random.bernoulli(key, 0.7, h.shape), h, 0.0)
        return h


class Inline(Block):
    def __call__(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
        return self.body(x, key)


class Once(Block):
    @tm.compile_once
    def __call__(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
        return self.body(x, key)


def _blocks(cls: type[Block], n: int, width: int = 3) -> list[Block]:
    keys = jax.random.split(jax.random.key(0), n)
    return [cls(width, 1.0 + i % 2, key=k) for i, k in enumerate(keys)]


def _cell(blocks: list[Block], x: jax.Array, key: jax.Array) -> jax.Array:
    """Two independent branches into node a, a chain into node b, three into the output."""
    keys = jax.random.split(key, len(blocks))
    a = blocks[0](x, keys[0]) + blocks[1](x, keys[1])
    b = blocks[2](a, keys[2]) + blocks[3](x, keys[3])
    return blocks[4](a) + blocks[5](b) + blocks[6](a + b)


def _loss(blocks: list[Block], x: jax.Array, key: jax.Array) -> tuple[jax.Array, list[Block]]:
    out, new = tm.stateful(lambda bs: _cell(bs, x, key))(blocks)
    return jnp.sum(out**2), new


def _step(blocks: list[Block], x: jax.Array, key: jax.Array) -> tuple[Any, ...]:
    (loss, new), grads = tm.filter_value_and_grad(_loss, has_aux=True)(blocks, x, key)
    return loss, grads, new


def _leaves(tree: Any) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree) if tm.is_array(x)]


def test_outputs_gradients_state_and_keys_match_the_inline_method() -> None:
    x = jax.random.normal(jax.random.key(1), (4, 3))
    key = jax.random.key(2)
    want = tm.filter_jit(_step)(_blocks(Inline, 7), x, key)
    got = tm.filter_jit(_step)(_blocks(Once, 7), x, key)
    assert len(_leaves(want)) == len(_leaves(got)) > 20
    for w, g in zip(_leaves(want), _leaves(got), strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=2e-6)
    # The BatchNorm statistics moved, so the comparison above covers state updates.
    new_state = got[2][0].norm.running_mean.value
    assert not np.allclose(new_state, 0.0)


def test_each_configuration_is_traced_once() -> None:
    x = jnp.ones((4, 3))
    TRACES.clear()
    run = tm.filter_jit(lambda bs, x: _cell(bs, x, jax.random.key(0)))
    run(tm.nn.inference_mode(_blocks(Inline, 7)), x)
    inline = len(TRACES)
    TRACES.clear()
    run(tm.nn.inference_mode(_blocks(Once, 7)), x)
    # Seven calls inline; compiled once: scale 1.0 and 2.0, each with and without a key.
    assert inline == 7
    assert len(TRACES) == 4


def test_independent_calls_become_one_loop() -> None:
    blocks = tm.nn.inference_mode(_blocks(Once, 4))

    def side_by_side(bs: list[Block], x: jax.Array) -> jax.Array:
        return bs[0](x) + bs[2](x) + bs[0](2 * x)  # same configuration: scale 1.0

    def chain(bs: list[Block], x: jax.Array) -> jax.Array:
        return bs[2](bs[0](x))  # the second reads the first: left unrolled

    x = jnp.ones((2, 3))
    loops = tm.filter_jit(side_by_side).lower(blocks, x).as_text().count("stablehlo.while")
    assert loops == 1
    assert tm.filter_jit(chain).lower(blocks, x).as_text().count("stablehlo.while") == 0
    inline = [Inline(3, b.scale, key=jax.random.key(0)) for b in blocks]
    inline = [
        tm.tree_at(lambda m: m.linear, i, b.linear) for i, b in zip(inline, blocks, strict=True)
    ]
    inline = tm.nn.inference_mode(inline)
    np.testing.assert_allclose(
        tm.filter_jit(side_by_side)(blocks, x), tm.filter_jit(side_by_side)(inline, x), rtol=1e-6
    )


def test_eager_calls_run_the_method_directly() -> None:
    (block,) = _blocks(Once, 1)
    TRACES.clear()
    out = tm.nn.inference_mode(block)(jnp.ones((2, 3)))
    assert TRACES == ["Once"] and out.shape == (2, 3)


def test_a_state_update_outside_the_module_is_refused_by_name() -> None:
    class Leaky(tm.Module):
        @tm.compile_once
        def __call__(self, other: nn.BatchNorm, x: jax.Array) -> jax.Array:
            return other(x)

    norm = nn.BatchNorm(3)
    run = tm.filter_jit(lambda m, n, x: tm.stateful(lambda n: m(n, x))(n))
    with pytest.raises(RuntimeError, match=re.escape("`test_a_state_update_outside_the_module")):
        run(Leaky(), norm, jnp.ones((2, 3)))


def test_plain_jax_jit_and_grad_give_the_same_values() -> None:
    blocks_once, blocks_inline = _blocks(Once, 7), _blocks(Inline, 7)
    x = jnp.ones((4, 3))

    def loss(bs: list[Block]) -> jax.Array:
        return jnp.sum(tm.nn.inference_mode(bs)[0](x) ** 2)

    g1 = jax.jit(jax.grad(lambda bs: loss(bs)))(tm.filter(blocks_once, tm.is_array))
    g2 = jax.jit(jax.grad(lambda bs: loss(bs)))(tm.filter(blocks_inline, tm.is_array))
    for a, b in zip(_leaves(g1), _leaves(g2), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


class Unit(tm.Module):
    w: jax.Array

    @tm.compile_once
    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.sin(x @ self.w)


class Outer(tm.Module):
    """A compile-once module calling compile-once modules: rolled inside its own program."""

    units: list[Unit]

    @tm.compile_once
    def __call__(self, x: jax.Array) -> jax.Array:
        return self.units[0](x) * self.units[1](x)


def test_nested_units_and_effects() -> None:
    ws = jax.random.normal(jax.random.key(3), (4, 2, 2))
    outers = [Outer([Unit(ws[0]), Unit(ws[1])]), Outer([Unit(ws[2]), Unit(ws[3])])]

    def f(os: list[Outer], x: jax.Array) -> jax.Array:
        jax.debug.callback(lambda: None)  # an effect: this level is evaluated as it is
        return os[0](x) + os[1](x)

    x = jnp.arange(2.0)
    want = sum(jnp.sin(x @ ws[2 * i]) * jnp.sin(x @ ws[2 * i + 1]) for i in range(2))
    np.testing.assert_allclose(tm.filter_jit(f)(outers, x), want, rtol=1e-6)
    text = tm.filter_jit(lambda os, x: os[0](x) + os[1](x)).lower(outers, x).as_text()
    assert text.count("stablehlo.while") == 2  # the outer pair, and the inner pair in its body
    # One outer call on its own stays a call, with its inner pair rolled inside it.
    single = tm.filter_jit(lambda os, x: os[0](x))
    assert single.lower(outers, x).as_text().count("stablehlo.while") == 1
    np.testing.assert_allclose(
        single(outers, x), want - jnp.sin(x @ ws[2]) * jnp.sin(x @ ws[3]), rtol=1e-6
    )


def _darts_like(us: list[Unit], x: jax.Array) -> jax.Array:
    """Two inputs (one behind extra glue) and three nodes, each the sum of one call per
    earlier state: 9 calls, 6 of them on the inputs."""
    states = [x, 2 * jnp.tanh(x) + 1]
    e = 0
    for _ in range(3):
        total = jnp.zeros_like(x)
        for h in list(states):
            total = total + us[e](h)
            e += 1
        states.append(total)
    return jnp.sum(jnp.concatenate(states[2:]) ** 2)


def test_calls_wait_for_the_other_calls_of_their_program() -> None:
    ws = jax.random.normal(jax.random.key(4), (9, 2, 2)) / 2
    us = [Unit(w) for w in ws]
    x = jnp.array([0.3, -0.7])
    step = tm.filter_jit(tm.filter_value_and_grad(_darts_like))
    text = step.lower(us, x).as_text()
    # Forward: the 6 calls on the inputs, then the 2 leaving node 2 (the last one alone).
    # Backward, mirrored: the call into node 4 from node 3 alone, the 2 leaving node 2, then
    # the 6 on the inputs, although the extra glue puts one input deeper than the other and
    # the backward pass reaches the calls into each node one node at a time.
    assert text.count("stablehlo.while") == 4
    assert "tensor<6x2x2xf32>" in text and "tensor<2x2x2xf32>" in text

    def plain(ws: jax.Array, x: jax.Array) -> jax.Array:
        return _darts_like([lambda h, w=w: jnp.sin(h @ w) for w in ws], x)  # type: ignore[misc]

    want_loss, want_grad = jax.value_and_grad(plain)(ws, x)
    loss, grads = step(us, x)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(jnp.stack([g.w for g in grads]), want_grad, rtol=1e-5)


class CosUnit(tm.Module):
    """A second program, so that calls of two programs wait on each other."""

    w: jax.Array

    @tm.compile_once
    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.cos(x @ self.w)


def _inline(u: Unit | CosUnit, h: jax.Array) -> jax.Array:
    return (jnp.cos if isinstance(u, CosUnit) else jnp.sin)(h @ u.w)


@settings(max_examples=25, deadline=None)
@given(
    wiring=st.lists(
        st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(0, 2)),
        min_size=1,
        max_size=8,
    ),
    cos=st.lists(st.booleans(), min_size=16, max_size=16),
)
# Calls of two programs waiting on each other: sin(node 2 = cos(x) + x) and cos(node 3 =
# sin(x) + x) are each free of their own program's calls but wait for the other's.
@example(
    wiring=[(0, 0, 0), (0, 0, 0), (2, 3, 1)],
    cos=[True, False, False, False, False, True] + [False] * 10,
)
def test_random_graphs_of_units_match_the_inline_program(
    wiring: list[tuple[int, int, int]], cos: list[bool]
) -> None:
    """Any DAG of calls of two programs: a node sums two calls on earlier nodes, or one call
    and an earlier node, or calls the last node (chains)."""
    ws = jax.random.normal(jax.random.key(4), (2 * len(wiring), 2, 2))
    units = [CosUnit(w) if c else Unit(w) for w, c in zip(ws, cos, strict=False)]

    def graph(us: list[Unit | CosUnit], x: jax.Array, inline: bool) -> jax.Array:
        nodes = [x, 2 * x]
        for i, (a, b, kind) in enumerate(wiring):
            ua, ub = us[2 * i], us[2 * i + 1]
            call = _inline if inline else (lambda u, h: u(h))
            h = nodes[a % len(nodes)]
            if kind == 2:  # a link of a chain
                nodes.append(call(ua, nodes[-1]))
            else:
                nodes.append(call(ua, h) + (call(ub, nodes[b % len(nodes)]) if kind else h))
        return sum(nodes[2:])

    x = jnp.array([0.3, -0.7])
    # Gradients for x too: every call then differentiates its input (one program per class).
    got = tm.filter_jit(
        jax.value_and_grad(lambda us, x: jnp.sum(graph(us, x, False)), argnums=(0, 1))
    )(units, x)
    want = jax.value_and_grad(lambda us, x: jnp.sum(graph(us, x, True)), argnums=(0, 1))(units, x)
    for g, w in zip(_leaves(got), _leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_functions_without_units_are_traced_once_and_units_roll_through_except() -> None:
    calls: list[str] = []
    units = [Unit(jnp.eye(2)), Unit(2 * jnp.eye(2))]

    def plain(x: jax.Array) -> jax.Array:
        calls.append("plain")
        return x + 1

    def guarded(us: list[Unit], x: jax.Array) -> jax.Array:
        calls.append("guarded")
        try:  # a user's handler must not swallow the switch to the rolling trace
            return us[0](x) + us[1](x)
        except Exception:  # pragma: no cover - the test fails if reached
            return x

    tm.filter_jit(plain)(jnp.ones(2))
    assert calls == ["plain"]
    text = tm.filter_jit(guarded).lower(units, jnp.ones(2)).as_text()
    assert text.count("stablehlo.while") == 1
    # The trace up to the first call ran, then the rolling trace: the Python before it twice.
    assert calls == ["plain", "guarded", "guarded"]
