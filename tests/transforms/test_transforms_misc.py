"""filter_eval_shape, filter_checkpoint and filter_shard."""

from __future__ import annotations

from typing import Any

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import treemod as tm


class Block(tm.Module):
    w: jax.Array
    act: Any = jnp.sin
    name: str = tm.field(static=True, default="block")

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.act(self.w @ x)


_arrays = st.lists(
    hnp.array_shapes(min_dims=0, max_dims=3, max_side=4).flatmap(
        lambda s: hnp.arrays(np.float32, s, elements=st.floats(-1, 1, width=32))
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=10, deadline=None)
@given(_arrays)
def test_eval_shape_equals_jax_eval_shape(xs: list) -> None:
    f = lambda xs: [x * 2 for x in xs] + [jnp.sum(xs[0]).astype(jnp.int32)]
    assert tm.filter_eval_shape(f, xs) == jax.eval_shape(f, xs)


def test_eval_shape_keeps_static_leaves_and_accepts_abstract_inputs() -> None:
    def make(key: jax.Array, n: int) -> Block:
        return Block(jax.random.normal(key, (n, n)))

    abstract = tm.filter_eval_shape(make, jax.random.key(0), 4)
    assert abstract.w == jax.ShapeDtypeStruct((4, 4), jnp.float32)
    assert abstract.act is jnp.sin and abstract.name == "block"
    out = tm.filter_eval_shape(abstract, jax.ShapeDtypeStruct((4,), jnp.float32))
    assert out == jax.ShapeDtypeStruct((4,), jnp.float32)
    text = tm.filter_eval_shape(lambda x: (x, "tag"), jnp.ones(2))
    assert text == (jax.ShapeDtypeStruct((2,), jnp.float32), "tag")


def test_checkpoint_same_values_and_gradients() -> None:
    model = Block(jax.random.normal(jax.random.key(0), (3, 3)))
    x = jnp.arange(3.0)

    def loss(m: Block, x: jax.Array, checkpoint: bool) -> jax.Array:
        f = tm.filter_checkpoint(m) if checkpoint else m
        return jnp.sum(f(f(x)) ** 2)

    plain = tm.filter_value_and_grad(loss)(model, x, False)
    remat = tm.filter_value_and_grad(loss)(model, x, True)
    np.testing.assert_allclose(remat[0], plain[0], rtol=1e-6)
    np.testing.assert_allclose(remat[1].w, plain[1].w, rtol=1e-5)
    jaxpr = str(jax.make_jaxpr(lambda w: loss(Block(w), x, True))(model.w))
    assert "checkpoint" in jaxpr or "remat" in jaxpr


def test_checkpoint_options_and_static_outputs() -> None:
    policy = jax.checkpoint_policies.nothing_saveable

    @tm.filter_checkpoint(policy=policy)
    def f(x: jax.Array, label: str) -> tuple[jax.Array, str]:
        return jnp.sin(x), label

    np.testing.assert_allclose(jax.grad(lambda x: f(x, "a")[0])(jnp.float32(0.0)), 1.0)
    assert f(jnp.ones(1), "tag")[1] == "tag"
    model = Block(jnp.eye(2))
    np.testing.assert_allclose(tm.filter_checkpoint(model.__call__)(jnp.ones(2)), np.sin(1.0))


def test_shard_outside_and_inside_jit() -> None:
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("batch",))
    batch_sharding = NamedSharding(mesh, P("batch"))
    n = len(devices)
    tree = {"x": jnp.arange(2.0 * n).reshape(n, 2), "tag": "train"}
    out = tm.filter_shard(tree, batch_sharding)
    assert out["tag"] == "train"
    assert out["x"].sharding.is_equivalent_to(batch_sharding, 2)

    @tm.filter_jit
    def f(t: dict) -> dict:
        return tm.filter_shard({"y": t["x"] * 2, "tag": t["tag"]}, batch_sharding)

    inside = f(tree)
    assert inside["y"].sharding.is_equivalent_to(batch_sharding, 2)
    np.testing.assert_allclose(inside["y"], tree["x"] * 2)
    single = tm.filter_shard(jnp.ones(2), devices[-1])
    assert single.devices() == {devices[-1]}


def test_shard_with_prefix_and_errors() -> None:
    devices = jax.devices()
    tree = {"a": jnp.ones(2), "b": [jnp.ones(2), "s"]}
    out = tm.filter_shard(tree, {"a": devices[0], "b": None})
    assert out["a"].devices() == {devices[0]} and out["b"][1] == "s"
    assert out["b"][0] is tree["b"][0]
    with pytest.raises(ValueError, match="filter_shard: device_or_shardings must be"):
        tm.filter_shard(tree, {"a": devices[0]})


def _host_stats(x: np.ndarray, names: tuple) -> dict:
    assert isinstance(x, np.ndarray)
    return {names[0]: np.mean(x, axis=-1), names[1]: np.median(x, axis=-1), "unit": "m"}


def test_pure_callback_matches_numpy_under_jit_and_vmap() -> None:
    x = jnp.arange(12.0).reshape(3, 4) ** 1.5
    expected = {"mean": np.mean(np.asarray(x), -1), "median": np.median(np.asarray(x), -1)}

    def f(x: jax.Array) -> dict:
        out = jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)
        shape = {"mean": out, "median": out, "unit": "m"}
        return tm.filter_pure_callback(
            _host_stats, x, ("mean", "median"), result_shape_dtypes=shape, vmap_method="sequential"
        )

    for out in (tm.filter_jit(f)(x), tm.filter_vmap(f)(x)):
        np.testing.assert_allclose(out["mean"], expected["mean"], rtol=1e-6)
        np.testing.assert_allclose(out["median"], expected["median"], rtol=1e-6)
        assert out["unit"] == "m"


def test_pure_callback_structure_error() -> None:
    shape = {"mean": jax.ShapeDtypeStruct((), jnp.float32)}
    with pytest.raises(Exception, match=r"filter_pure_callback\(_host_stats\).*3 leaves"):
        out = tm.filter_pure_callback(
            _host_stats, jnp.ones(2), ("mean", "median"), result_shape_dtypes=shape
        )
        jax.block_until_ready(out)  # on a GPU the callback's error arrives with the result
