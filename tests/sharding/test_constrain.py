"""Activation constraints by logical name (`tm.constrain`, `tm.axis_rules`): the specs the rule
table gives, where `nn.Stack` and the zoo's attention place them, outputs equal to one device's,
and nothing traced without active rules."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from sharding_models import mesh

import treemod as tm
import treemod.models as tmm

LLAMA = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
}
IDS = np.array([[1, 5, 9, 3, 7, 2, 4, 4]] * 4)


def constraints(jaxpr: Any) -> Iterator[tuple[tuple[int, ...], P]]:
    """`(shape, spec)` of every sharding constraint in a closed jaxpr, nested ones included."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "sharding_constraint":
            yield tuple(eqn.invars[0].aval.shape), eqn.params["sharding"].spec
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    yield from constraints(getattr(inner, "jaxpr", inner))


def normalised(spec: P) -> tuple[Any, ...]:
    """A spec without trailing `None`s (JAX versions differ in keeping them)."""
    entries = list(spec)
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


@pytest.fixture(scope="module")
def llama() -> Any:
    return tmm.LlamaForCausalLM.from_config(LLAMA, key=jax.random.key(0))


def test_constrain_maps_names_through_the_active_rules() -> None:
    m = mesh((2, 4), ("data", "model"))
    x = jnp.ones((8, 6, 16))
    with tm.axis_rules(m, tm.fsdp_tp_rules()):
        jaxpr = jax.make_jaxpr(lambda x: tm.constrain(x, ("batch", "seq", "heads")))(x)
        # 6 heads do not divide the 4 `model` devices: that dimension stays whole
        odd = jax.make_jaxpr(lambda x: tm.constrain(x, ("batch", None, "heads")))(x[:, :, :6])
    assert [normalised(s) for _, s in constraints(jaxpr.jaxpr)] == [("data", None, "model")]
    assert [normalised(s) for _, s in constraints(odd.jaxpr)] == [("data",)]
    y = jax.jit(lambda x: x)(x)
    with tm.axis_rules(m, tm.fsdp_tp_rules()):
        placed = jax.jit(lambda x: tm.constrain(x * 2, ("batch", "seq", "heads")))(y)
    assert normalised(placed.sharding.spec) == ("data", None, "model")
    np.testing.assert_array_equal(placed, 2 * np.ones((8, 6, 16)))


def test_without_rules_nothing_is_traced(llama: Any) -> None:
    x = jnp.ones((2, 3))
    assert tm.constrain(x, ("batch", "embed")) is x
    stack = tm.nn.Stack(lambda k: tm.nn.Linear(4, 4, key=k), 3, key=jax.random.key(0))

    def texts() -> tuple[str, str]:
        return (
            str(jax.make_jaxpr(lambda x: stack(x))(jnp.ones((2, 4)))),
            str(jax.make_jaxpr(lambda i: llama(input_ids=i))(IDS)),
        )

    before = texts()
    with tm.axis_rules(mesh((1, 8), ("data", "model")), tm.tensor_parallel_rules()):
        inside = texts()
    after = texts()
    assert before == after
    assert all("sharding_constraint" not in t for t in before)
    assert all("sharding_constraint" in t for t in inside)


def test_tensor_parallel_llama_constrains_heads_and_hidden_state(llama: Any) -> None:
    m = mesh((1, 8), ("data", "model"))
    rules = tm.tensor_parallel_rules()
    want = np.asarray(tm.filter_jit(lambda m, x: m(input_ids=x))(llama, IDS))
    sharded = tm.shard(llama, m, rules)
    with tm.axis_rules(m, rules):
        jaxpr = jax.make_jaxpr(lambda i: sharded(input_ids=i))(IDS)
        got = np.asarray(tm.filter_jit(lambda m, x: m(input_ids=x))(sharded, IDS))
    found = {(shape, normalised(spec)) for shape, spec in constraints(jaxpr.jaxpr)}
    # q, k, v (batch, seq, 8 heads, 4) split by heads; the hidden state between layers whole
    # (Megatron: each block ends in an all-reduce).
    assert found == {((4, 8, 8, 4), (None, None, "model")), ((4, 8, 32), ())}
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_fsdp_keeps_the_hidden_state_split_by_batch(llama: Any) -> None:
    m = mesh((8,), ("data",))
    with tm.axis_rules(m, tm.fsdp_rules()):
        jaxpr = jax.make_jaxpr(lambda i: llama(input_ids=i))(np.concatenate([IDS, IDS]))
    found = {(shape, normalised(spec)) for shape, spec in constraints(jaxpr.jaxpr)}
    assert found == {((8, 8, 8, 4), ("data",)), ((8, 8, 32), ("data",))}


def test_axis_rules_refuses_a_rule_naming_a_missing_mesh_axis() -> None:
    with pytest.raises(tm.ShardingError, match=r"rule \('batch', 'dp'\) names mesh axis 'dp'"):
        with tm.axis_rules(mesh((8,), ("data",)), [("batch", "dp")]):
            pass
