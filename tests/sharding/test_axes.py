"""Logical axis names and the rule table, checked against `jax.sharding` placed by hand."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from sharding_models import EMBED, HIDDEN, VOCAB, Tiny, mesh, tokens

import treemod as tm
import treemod.nn as nn

KEY = jax.random.key(0)


def test_layers_declare_their_axes() -> None:
    assert tm.logical_axes(nn.Embedding(4, 2, key=KEY)).weight == ("vocab", "embed")
    mlp = tm.logical_axes(nn.MLP(2, 2, 4, 1, key=KEY))
    assert mlp.layers[0].weight == ("mlp", "embed")
    assert mlp.layers[1].weight == ("embed", "mlp")
    attention = tm.logical_axes(nn.MultiheadAttention(2, 4, key=KEY))
    assert attention.query_proj.weight == ("heads", "embed")
    assert attention.output_proj.weight == ("embed", "heads")
    conv = tm.logical_axes(nn.Conv2d(2, 4, 3, channels_last=True, key=KEY))
    assert conv.weight == (None, None, "conv_in", "conv_out")
    stack = tm.logical_axes(nn.Stack(lambda k: nn.Linear(2, 4, key=k), 3, key=KEY))
    assert stack.layers.weight == ("layers", "mlp", "embed")


def test_a_parent_overrides_and_users_declare() -> None:
    axes = tm.logical_axes(Tiny(KEY))
    assert axes.head.weight == ("vocab", "embed")  # Tiny's declaration wins over Linear's

    @tm.axis_names({"w": ("kv", None)})
    class Mine(tm.Module):
        w: jax.Array
        other: jax.Array

    axes = tm.logical_axes(Mine(jnp.zeros((2, 3, 4)), jnp.zeros(2)))
    assert (axes.w, axes.other) == (("kv", None, None), (None,))


def test_fsdp_and_tp_specs_match_jax_placed_by_hand() -> None:
    model = Tiny(KEY)
    m = mesh((2, 4), ("data", "model"))
    sharded = tm.shard(model, m, tm.fsdp_tp_rules())
    up = sharded.blocks.layers.mlp.layers[0].weight  # (layers, mlp, embed)
    reference = jax.device_put(
        model.blocks.layers.mlp.layers[0].weight, NamedSharding(m, P(None, "model", "data"))
    )
    assert up.sharding.is_equivalent_to(reference.sharding, up.ndim)
    np.testing.assert_array_equal(up, reference)
    head = sharded.head.weight
    assert head.sharding.spec == P("model", "data")
    assert [s.data.shape for s in head.addressable_shards] == [(VOCAB // 4, EMBED // 2)] * 8
    assert sharded.blocks.layers.norm.weight.sharding.spec == P(None, "data")


def test_path_rules_take_precedence() -> None:
    m = mesh((8,), ("data",))
    rules = ((r"blocks\.layers\.mlp\.layers\.0\.weight$", P(None, None, "data")), *tm.fsdp_rules())
    sharded = tm.shard(Tiny(KEY), m, rules)
    assert sharded.blocks.layers.mlp.layers[0].weight.sharding.spec == P(None, None, "data")
    assert sharded.blocks.layers.mlp.layers[1].weight.sharding.spec == P(None, "data")


def test_tp_logits_equal_one_device() -> None:
    model = Tiny(KEY)
    x = tokens()
    one = tm.filter_shard(model, jax.devices()[0])
    expected = tm.filter_jit(lambda m, x: m(x))(one, x)
    assert len(expected.sharding.device_set) == 1
    sharded = tm.shard(model, mesh((8,), ("model",)), tm.tensor_parallel_rules())
    assert sharded.blocks.layers.mlp.layers[0].weight.sharding.spec == P(None, "model")
    got = tm.filter_jit(lambda m, x: m(x))(sharded, x)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_an_indivisible_dimension_names_path_axis_and_rule() -> None:
    bad = nn.Linear(4, 6, key=KEY)  # mlp = 6 on 4 devices
    with pytest.raises(
        tm.ShardingError, match=r"weight: dimension 0 \(axis 'mlp', size 6\).*\('mlp', 'model'\)"
    ):
        tm.shard(bad, mesh((4,), ("model",)), (("mlp", "model"),))
    # with a fallback the dimension stays whole
    placed = tm.shard(bad, mesh((4,), ("model",)), (("mlp", "model"), ("mlp", None)))
    assert placed.weight.sharding.spec == P()
    with pytest.raises(tm.ShardingError, match=r"bias: rule 'bias' splits a dimension of size 6"):
        tm.shard(bad, mesh((4,), ("model",)), (("bias", P("model")),))


def test_bad_rules_are_named() -> None:
    m = mesh((2,), ("data",))
    with pytest.raises(tm.ShardingError, match="names mesh axis 'model'"):
        tm.shard(nn.Linear(2, 2, key=KEY), m, (("mlp", "model"),))
    with pytest.raises(tm.ShardingError, match="each sharding rule is"):
        tm.shard(nn.Linear(2, 2, key=KEY), m, ("mlp",))  # type: ignore[arg-type]

    @tm.axis_names({"w": ("a", "b", "c")})
    class TooMany(tm.Module):
        w: jax.Array

    with pytest.raises(tm.ShardingError, match=r"^w: 3 axis names"):
        tm.shard(TooMany(jnp.zeros((2, 2))), m, ())


def test_hidden_width_is_split() -> None:
    sharded = tm.shard(nn.Linear(EMBED, HIDDEN, key=KEY), mesh((8,), ("data",)), tm.fsdp_rules())
    assert sharded.weight.addressable_shards[0].data.shape == (HIDDEN // 8, EMBED)
