"""Orbax checkpoints of a sharded model and optimiser state, saved from 8 devices and restored
onto 4 and 2 with the rule table's shardings for the smaller mesh: values equal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from sharding_models import Tiny, mesh

import treemod as tm

ocp = pytest.importorskip("orbax.checkpoint")
optax = pytest.importorskip("optax")


def _abstract(tree: Any, shardings: Any) -> Any:
    """`tree`'s arrays as `jax.ShapeDtypeStruct`s carrying `shardings`: Orbax's restore target."""
    return jax.tree.map(
        lambda s, x: x if s is None else jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        shardings,
        tree,
        is_leaf=lambda s: s is None or isinstance(s, jax.sharding.Sharding),
    )


@pytest.mark.parametrize("devices", [4, 2])
def test_save_on_eight_restore_on_fewer(tmp_path: Path, devices: int) -> None:
    rules = tm.fsdp_tp_rules()
    big = mesh((2, 4), ("data", "model"))
    model = tm.sharded_init(Tiny, big, rules, jax.random.key(0))
    params = tm.filter(model, tm.is_array)
    state = tm.shard(optax.adam(1e-3).init(params), big, rules)
    with ocp.StandardCheckpointer() as saver:
        saver.save(tmp_path / "ckpt", {"params": params, "opt": state})

    small = mesh((devices // 2, 2), ("data", "model"))
    target = {
        "params": _abstract(params, tm.model_shardings(params, small, rules)),
        "opt": _abstract(state, tm.model_shardings(state, small, rules)),
    }
    with ocp.StandardCheckpointer() as loader:
        restored = loader.restore(tmp_path / "ckpt", target)
    for name, saved in (("params", params), ("opt", state)):
        for a, b in zip(jax.tree.leaves(restored[name]), jax.tree.leaves(saved), strict=True):
            np.testing.assert_array_equal(a, b)
            assert a.sharding.device_set == set(small.devices.flat)
    weight = restored["params"].blocks.layers.mlp.layers[0].weight  # (layers, mlp, embed)
    assert weight.sharding.spec == jax.sharding.PartitionSpec(None, "model", "data")
