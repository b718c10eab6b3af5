"""filter_jvp / filter_vjp: against jax.jvp / jax.vjp, finite differences, and each other."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm

from strategies import float_trees

_trees = float_trees(2)


def _f(tree: Any, scale: jax.Array) -> Any:
    """A nonlinear map from a tree to a tree of another structure."""
    leaves = jax.tree_util.tree_leaves(tree)
    total = sum((jnp.sum(jnp.sin(x) * scale) for x in leaves), jnp.float32(0))
    return {"total": total, "squares": [x * x * scale for x in leaves]}


def _like(tree: Any, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32), tree
    )


def _assert_trees_close(a: Any, b: Any, **tol: float) -> None:
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(x, y, **tol)


@settings(max_examples=10, deadline=None)
@given(_trees)
def test_jvp_equals_jax_jvp_on_array_trees(tree: Any) -> None:
    tree = jax.tree_util.tree_map(jnp.asarray, tree)
    scale = jnp.float32(1.5)
    tangent, t_scale = _like(tree, 0), jnp.float32(-0.5)
    # Both sides in one jax.jit: one compilation per example instead of one per op and shape
    # (the eager path is the Module tests' below).
    got, expected = jax.jit(lambda p, t: (tm.filter_jvp(_f, p, t), jax.jvp(_f, p, t)))(
        (tree, scale), (tangent, t_scale)
    )
    _assert_trees_close(got, expected, rtol=1e-6, atol=1e-6)


@settings(max_examples=10, deadline=None)
@given(_trees)
def test_vjp_equals_jax_vjp_on_array_trees(tree: Any) -> None:
    tree = jax.tree_util.tree_map(jnp.asarray, tree)
    scale = jnp.float32(1.5)
    cotangent = _like(jax.eval_shape(_f, tree, scale), 1)

    @jax.jit  # one compilation per example; the eager path is the Module tests' below
    def both(tree: Any, scale: jax.Array, cotangent: Any) -> Any:
        out, pullback = jax.vjp(_f, tree, scale)
        got_out, vjp_fn = tm.filter_vjp(_f, tree, scale)
        return got_out, out, vjp_fn(cotangent), pullback(cotangent)

    got_out, out, got, expected = both(tree, scale, cotangent)
    _assert_trees_close(got_out, out, rtol=1e-6)
    _assert_trees_close(got, expected, rtol=1e-6, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(_trees, st.integers(0, 2**16))
def test_jvp_and_vjp_are_adjoint(tree: Any, seed: int) -> None:
    """<cotangent, J tangent> == <J^T cotangent, tangent>, two independent code paths."""
    tree = jax.tree_util.tree_map(jnp.asarray, tree)
    scale = jnp.float32(0.7)
    tangent = _like(tree, seed)
    cotangent = _like(jax.eval_shape(_f, tree, scale), seed + 1)

    @jax.jit  # one compilation per example; the eager path is the Module tests' below
    def both(tree: Any, tangent: Any, cotangent: Any) -> Any:
        _, j_tangent = tm.filter_jvp(_f, (tree, scale), (tangent, None))
        _, vjp_fn = tm.filter_vjp(_f, tree, scale)
        return j_tangent, vjp_fn(cotangent)[0]

    j_tangent, jt_cotangent = both(tree, tangent, cotangent)

    def dot(a: Any, b: Any) -> float:
        pairs = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
        return float(sum(np.vdot(np.asarray(x, np.float64), np.asarray(y)) for x, y in pairs))

    lhs, rhs = dot(cotangent, j_tangent), dot(jt_cotangent, tangent)
    assert lhs == pytest.approx(rhs, rel=1e-4, abs=1e-4)


class Block(tm.Module):
    weight: jax.Array
    steps: jax.Array  # integer: never differentiated
    act: Any
    name: str = tm.field(static=True, default="block")

    def __call__(self, x: jax.Array) -> dict[str, Any]:
        y = self.act(self.weight @ x)
        return {"y": y, "count": self.steps + 1, "name": self.name, "none": None}


def _block(dtype: Any = jnp.float32) -> Block:
    w = jnp.asarray([[0.5, -1.0, 0.25], [1.5, 0.2, -0.3]], dtype)
    return Block(w, jnp.array(3), jnp.tanh)


def test_jvp_of_a_module_against_central_differences() -> None:
    with jax.enable_x64(True):
        block, x = _block(jnp.float64), jnp.asarray([0.3, -0.2, 0.9], jnp.float64)
        t_w = jnp.asarray([[1.0, 0.0, -1.0], [0.5, 2.0, 0.0]], jnp.float64)
        t_x = jnp.asarray([0.1, 0.2, -0.4], jnp.float64)
        t_block = Block(t_w, None, None)  # type: ignore[arg-type]
        out, tangent = tm.filter_jvp(lambda b, v: b(v), (block, x), (t_block, t_x))
        eps = 1e-6
        plus = tm.tree_at(lambda b: b.weight, block, block.weight + eps * t_w)(x + eps * t_x)
        minus = tm.tree_at(lambda b: b.weight, block, block.weight - eps * t_w)(x - eps * t_x)
        np.testing.assert_allclose(tangent["y"], (plus["y"] - minus["y"]) / (2 * eps), rtol=1e-7)
    assert out["name"] == "block" and int(out["count"]) == 4 and out["none"] is None
    assert tangent["count"] is None and tangent["name"] is None and tangent["none"] is None


def test_vjp_of_a_module_against_plain_jax() -> None:
    block, x = _block(), jnp.asarray([0.3, -0.2, 0.9])
    out, vjp_fn = tm.filter_vjp(lambda b, v: b(v), block, x)
    assert out["name"] == "block" and int(out["count"]) == 4
    ct_y = jnp.asarray([1.0, -2.0])
    ct_block, ct_x = vjp_fn({"y": ct_y, "count": None, "name": None, "none": None})
    _, pullback = jax.vjp(lambda w, v: jnp.tanh(w @ v), block.weight, x)
    ref_w, ref_x = pullback(ct_y)
    np.testing.assert_allclose(ct_block.weight, ref_w, rtol=1e-6)
    np.testing.assert_allclose(ct_x, ref_x, rtol=1e-6)
    assert ct_block.steps is None and ct_block.act is None and ct_block.name == "block"
    # A None cotangent is a zero cotangent, for one leaf or the whole output.
    _, zero_x = vjp_fn(None)
    np.testing.assert_array_equal(zero_x, jnp.zeros(3))


def test_a_none_tangent_holds_a_whole_subtree_constant() -> None:
    block, x = _block(), jnp.asarray([0.3, -0.2, 0.9])
    t_x = jnp.asarray([1.0, 0.0, 0.0])
    _, tangent = tm.filter_jvp(lambda b, v: b(v), (block, x), (None, t_x))
    _, expected = jax.jvp(lambda v: jnp.tanh(block.weight @ v), (x,), (t_x,))
    np.testing.assert_allclose(tangent["y"], expected, rtol=1e-6)


def test_vjp_has_aux_and_works_under_filter_jit() -> None:
    @tm.filter_jit
    def run(w: jax.Array, x: jax.Array) -> tuple[Any, Any, Any]:
        out, vjp_fn, aux = tm.filter_vjp(
            lambda w: (w * x, {"seen": x, "tag": "t"}), w, has_aux=True
        )
        return out, vjp_fn(jnp.ones_like(out)), aux

    w, x = jnp.asarray([1.0, 2.0]), jnp.asarray([3.0, -1.0])
    out, (ct_w,), aux = run(w, x)
    np.testing.assert_allclose(out, w * x)
    np.testing.assert_allclose(ct_w, x)
    np.testing.assert_allclose(aux["seen"], x)
    assert aux["tag"] == "t"


def test_kwargs_of_jvp_are_not_differentiated() -> None:
    out, tangent = tm.filter_jvp(
        lambda x, *, scale: x * scale, (jnp.array(2.0),), (jnp.array(1.0),), scale=jnp.array(5.0)
    )
    assert float(out) == 10.0 and float(tangent) == 5.0


def test_jvp_errors_name_the_leaf() -> None:
    params = {"w": jnp.ones(2), "n": jnp.array(1)}
    f = lambda p: p["w"] * p["n"]  # noqa: E731
    want = r"filter_jvp\(<lambda>\): primals\[0\]\['n'\] is i32\[\], which cannot be"
    with pytest.raises(TypeError, match=want):
        tm.filter_jvp(f, (params,), ({"w": jnp.ones(2), "n": jnp.array(1)},))
    with pytest.raises(ValueError, match=r"the tangent of primals\[0\]\['w'\] .* f32\[2\]"):
        tm.filter_jvp(f, (params,), ({"w": jnp.ones(3), "n": None},))
    with pytest.raises(ValueError, match=r"`tangents` must have the structure of `primals`"):
        tm.filter_jvp(f, (params,), ({"w": jnp.ones(2)},))
    with pytest.raises(TypeError, match=r"must be tuples \(or lists\)"):
        tm.filter_jvp(f, params, params)


def test_vjp_errors_name_the_output() -> None:
    f = lambda w: {"y": w * 2, "k": jnp.arange(2)}  # noqa: E731
    _, vjp_fn = tm.filter_vjp(f, jnp.ones(2))
    with pytest.raises(TypeError, match=r"the output\['k'\] is i32\[2\]"):
        vjp_fn({"y": jnp.ones(2), "k": jnp.ones(2)})
    with pytest.raises(ValueError, match=r"cotangent of the output\['y'\] .* got f32\[3\]"):
        vjp_fn({"y": jnp.ones(3), "k": None})
    with pytest.raises(ValueError, match=r"the cotangent must have the structure of the output"):
        vjp_fn({"y": jnp.ones(2)})
    with pytest.raises(TypeError, match=r"has_aux=True\): the function must return a pair"):
        tm.filter_vjp(lambda w: w, jnp.ones(2), has_aux=True)
