"""FSDP on 8 devices against one device: memory per device, five training steps, and the
collectives XLA inserts (docs/sharding.md explains the counts)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from sharding_models import Tiny, loss_fn, mesh, tokens

import treemod as tm

optax = pytest.importorskip("optax")
OPT = optax.adamw(1e-2)


@tm.filter_jit
def step(model: Tiny, state: Any, x: jax.Array, place: Any) -> tuple[Tiny, Any, jax.Array]:
    loss, grads = tm.filter_value_and_grad(loss_fn)(model, x)
    grads = grads if place is None else tm.filter_shard(grads, place)  # sharded as the weights
    with jax.numpy_dtype_promotion("standard"):  # optax mixes its int step count with floats
        updates, state = OPT.update(grads, state, tm.filter(model, tm.is_array))
    return tm.apply_updates(model, updates), state, loss


def _setup(sharded: bool) -> tuple[Tiny, Any, jax.Array, Any]:
    m = mesh((8,), ("data",))
    batch = NamedSharding(m, P("data"))
    model = Tiny(jax.random.key(0), batch if sharded else None)
    state = OPT.init(tm.filter(model, tm.is_array))
    x = tokens()
    if not sharded:
        one = jax.devices()[0]
        placed = tm.filter_shard(model, one), tm.filter_shard(state, one), jax.device_put(x, one)
        return (*placed, None)
    rules = tm.fsdp_rules()
    place = tm.model_shardings(model, m, rules)
    return tm.shard(model, m, rules), tm.shard(state, m, rules), jax.device_put(x, batch), place


def _per_device_bytes(tree: Any) -> Counter[Any]:
    used: Counter[Any] = Counter()
    for leaf in jax.tree.leaves(tm.filter(tree, tm.is_array)):
        for s in leaf.addressable_shards:
            used[s.device] += s.data.nbytes
    return used


def test_params_grads_and_optimiser_state_are_an_eighth_per_device() -> None:
    model, state, x, place = _setup(sharded=True)
    grads = tm.filter_jit(lambda m, x: tm.filter_shard(tm.filter_grad(loss_fn)(m, x), place))(
        model, x
    )
    trees = (tm.filter(model, tm.is_array), grads, state)
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(trees))
    used = _per_device_bytes(trees)
    assert len(used) == 8
    assert max(used.values()) <= 1.15 * total / 8, max(used.values()) / (total / 8)


def test_five_steps_equal_one_device() -> None:
    runs = []
    for sharded in (False, True):
        model, state, x, place = _setup(sharded)
        losses = []
        for _ in range(5):
            model, state, loss = step(model, state, x, place)
            losses.append(loss)
        runs.append((model, losses))
    (one, one_losses), (eight, eight_losses) = runs
    np.testing.assert_allclose(eight_losses, one_losses, rtol=1e-5, atol=1e-5)
    for a, b in zip(
        jax.tree.leaves(tm.filter(eight, tm.is_array)),
        jax.tree.leaves(tm.filter(one, tm.is_array)),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # the step keeps the parameters sharded
    assert eight.head.weight.sharding == NamedSharding(mesh((8,), ("data",)), P("data"))


def collectives(hlo: str) -> list[tuple[str, str]]:
    """`(kind, result shape)` of each collective in a compiled program's HLO text (combined
    ones have a tuple of shapes)."""
    kinds = "all-gather|reduce-scatter|all-reduce|all-to-all|collective-permute"
    found = re.finditer(rf"= (.*?) ({kinds})(?:-start)?\(", hlo)
    return [(m.group(2), m.group(1)) for m in found]


def test_collectives_are_the_fsdp_ones() -> None:
    model, state, x, place = _setup(sharded=True)
    found = collectives(step.lower(model, state, x, place).compile().as_text())
    kinds = Counter(kind for kind, _ in found)
    gathered = {shape.split("{")[0] for kind, shape in found if kind == "all-gather"}
    reduced = " ".join(shape for kind, shape in found if kind == "all-reduce")
    # Each weight is gathered whole before use: the attention projections, the MLP's, the
    # vocabulary table (embedding and head).
    assert {"f32[32,32]", "f32[32,128]", "f32[64,32]"} <= gathered
    # Gradients are summed over the batch shards (one combined all-reduce for the blocks).
    assert "f32[32,32]" in reduced and "f32[64,32]" in reduced
    # Only attention moves activations between devices: its head reshapes of batch-split
    # activations; nothing is permuted.
    assert kinds["all-to-all"] <= 4 and kinds["collective-permute"] == 0
    assert kinds["reduce-scatter"] == 0  # XLA's CPU backend sums whole, then slices
