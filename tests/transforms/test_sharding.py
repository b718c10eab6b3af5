"""Data parallelism on 8 (fake CPU) devices equals the single-device training step."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm

N_DEVICES = 8


class MLP(tm.Module):
    w1: jax.Array
    b1: jax.Array
    w2: jax.Array
    act: Any = tm.field(static=True, default=jnp.tanh)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.act(x @ self.w1 + self.b1[None, :]) @ self.w2


def _loss(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


@tm.filter_jit
def _step(model: MLP, x: jax.Array, y: jax.Array) -> tuple[MLP, jax.Array]:
    loss, grads = tm.filter_value_and_grad(_loss)(model, x, y)
    model = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, model, grads)
    return model, loss


def check_data_parallel_step() -> None:
    """Run 3 steps on one device and sharded across 8; compare parameters and losses."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices()[:N_DEVICES]
    assert len(devices) == N_DEVICES, f"need {N_DEVICES} devices, have {len(jax.devices())}"
    k1, k2, k3, k4 = jax.random.split(jax.random.key(0), 4)
    model = MLP(
        jax.random.normal(k1, (4, 16)) / 2, jnp.zeros(16), jax.random.normal(k2, (16, 2)) / 4
    )
    x = jax.random.normal(k3, (32, 4))
    y = jax.random.normal(k4, (32, 2))

    single_model, single_losses = jax.device_put(model, devices[0]), []
    for _ in range(3):
        single_model, loss = _step(single_model, jax.device_put(x, devices[0]), y)
        single_losses.append(float(loss))

    mesh = Mesh(np.array(devices), ("batch",))
    replicated = NamedSharding(mesh, P())
    batch = NamedSharding(mesh, P("batch"))
    dp_model = tm.filter_shard(model, replicated)
    xs, ys = tm.filter_shard((x, y), batch)
    assert xs.sharding.is_equivalent_to(batch, 2) and len(xs.sharding.device_set) == N_DEVICES
    dp_losses = []
    for _ in range(3):
        dp_model, loss = _step(dp_model, xs, ys)
        dp_losses.append(float(loss))
    assert dp_model.w1.sharding.is_equivalent_to(replicated, 2)  # stays replicated
    assert dp_model.act is jnp.tanh
    np.testing.assert_allclose(dp_losses, single_losses, rtol=1e-5)
    leaves = jax.tree_util.tree_leaves
    for a, b in zip(leaves(dp_model), leaves(single_model), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.heavy
def test_data_parallel_step_equals_single_device() -> None:
    if len(jax.devices()) >= N_DEVICES:
        check_data_parallel_step()
        return
    # JAX was started with fewer devices: run in a fresh process with eight fake CPUs.
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={N_DEVICES}")
    env["JAX_PLATFORMS"] = "cpu"
    code = "import tests.test_sharding as t; t.check_data_parallel_step()"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
