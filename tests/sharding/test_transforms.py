"""`filter_jit(in_shardings=, out_shardings=, donate=)` and `filter_shard_map`, against
`jax.jit` and `jax.shard_map` on the same arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from sharding_models import Tiny, loss_fn, mesh, tokens

import treemod as tm
import treemod.nn as nn

KEY = jax.random.key(0)


def test_in_shardings_place_the_arrays_as_jax_jit_does() -> None:
    m = mesh((8,), ("data",))
    model = Tiny(KEY)  # on one device: filter_jit moves it
    x = tokens()
    batch = NamedSharding(m, P("data"))
    shardings = tm.model_shardings(model, m, tm.fsdp_rules())

    @tm.filter_jit(in_shardings=(shardings, batch), out_shardings=batch)
    def per_example(model: Tiny, x: jax.Array) -> jax.Array:
        return jnp.sum(model(x), axis=(1, 2))

    got = per_example(model, x)
    assert got.sharding.is_equivalent_to(batch, 1)
    arrays = tm.filter(model, tm.is_array)
    flat_shardings = jax.tree.leaves(tm.filter(shardings, lambda s: s is not None))
    reference = jax.jit(
        lambda leaves, x: jnp.sum(
            tm.combine(jax.tree.unflatten(jax.tree.structure(arrays), leaves), model)(x),
            axis=(1, 2),
        ),
        in_shardings=(flat_shardings, batch),
        out_shardings=batch,
    )(jax.tree.leaves(arrays), x)
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)


def test_a_dict_prefix_none_and_keyword_arguments() -> None:
    m = mesh((4,), ("data",))
    split = NamedSharding(m, P("data"))

    @tm.filter_jit(in_shardings=({"a": split, "b": None}, split))
    def f(d: dict[str, jax.Array], y: jax.Array, *, z: jax.Array) -> jax.Array:
        return d["a"] + d["b"] + y + z

    one = jnp.arange(8.0)  # uncommitted: jit may move it
    out = f({"a": one, "b": one}, one, z=one)
    np.testing.assert_array_equal(out, 4 * np.arange(8.0))
    assert out.sharding.is_equivalent_to(split, 1)
    # As with jax.jit, an array committed elsewhere is not moved silently.
    committed = jax.device_put(one, jax.devices()[0])
    with pytest.raises(ValueError, match="does not match the sharding"):
        f({"a": committed, "b": one}, one, z=one)


def test_donated_sharded_training_step() -> None:
    m = mesh((8,), ("data",))
    model = tm.shard(Tiny(KEY), m, tm.fsdp_rules())
    shardings = tm.model_shardings(model, m, tm.fsdp_rules())
    batch = NamedSharding(m, P("data"))

    @tm.filter_jit(donate="all-except-first", in_shardings=(None, shardings, batch))
    def sgd(lr: jax.Array, model: Tiny, x: jax.Array) -> Tiny:
        grads = tm.filter_grad(loss_fn)(model, x)
        return tm.apply_updates(model, jax.tree.map(lambda g: -lr * g, grads))

    before = model.head.weight
    expected = np.asarray(before) - 0.1 * np.asarray(
        tm.filter_jit(tm.filter_grad(loss_fn))(model, tokens()).head.weight
    )
    new = sgd(jnp.float32(0.1), model, tokens())
    assert before.is_deleted()
    assert new.head.weight.sharding.is_equivalent_to(shardings.head.weight, 2)
    np.testing.assert_allclose(new.head.weight, expected, rtol=1e-5, atol=1e-6)


def test_a_bad_prefix_is_named() -> None:
    f = tm.filter_jit(lambda x, y: x + y, in_shardings=({"a": None},))
    with pytest.raises(ValueError, match=r"filter_jit\(in_shardings=\.\.\.\) must be"):
        f(jnp.ones(2), jnp.ones(2))


def test_filter_shard_map_matches_jax_shard_map() -> None:
    m = mesh((8,), ("data",))
    linear = nn.Linear(4, 4, key=KEY)  # replicated weights, static `in_features` etc.
    x = jax.random.normal(KEY, (16, 4))

    def local(model: nn.Linear, x: jax.Array) -> tuple[jax.Array, str]:
        return jax.lax.psum(jnp.sum(model(x)), "data"), "summed"

    total, tag = tm.filter_jit(
        tm.filter_shard_map(local, mesh=m, in_specs=(P(), P("data")), out_specs=(P(), P()))
    )(linear, x)
    reference = jax.shard_map(
        lambda w, b, x: jax.lax.psum(jnp.sum(x @ w.T + b[None]), "data"),
        mesh=m,
        in_specs=(P(), P(), P("data")),
        out_specs=P(),
    )(linear.weight, linear.bias, x)
    assert tag == "summed"
    np.testing.assert_allclose(total, reference, rtol=1e-6)
    np.testing.assert_allclose(total, jnp.sum(linear(x)), rtol=1e-5)


def test_filter_shard_map_refuses_keywords() -> None:
    mapped = tm.filter_shard_map(lambda x: x, mesh=mesh((2,), ("d",)), in_specs=P(), out_specs=P())
    with pytest.raises(TypeError, match="pass arguments positionally"):
        mapped(x=jnp.ones(2))
