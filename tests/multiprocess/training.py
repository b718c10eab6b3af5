"""Training steps run by every process of a multi-process test (through harness.run_function).

The model, data and steps are the same whatever the number of processes: a global batch made
from a fixed NumPy seed, of which each process feeds its own rows, and a model built from a fixed
key on every process. The tests compare what 2 processes x 2 devices and 1 process x 4 devices
return, and both with a plain-JAX reference computed in the test process.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import treemod as tm

BATCH, IN, HIDDEN, OUT, STEPS, LR = 8, 3, 8, 4, 3, 0.1


class Net(tm.Module):
    """Linear -> tanh -> Linear, the model the tests train."""

    first: tm.nn.Linear
    second: tm.nn.Linear

    def __init__(self, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.first = tm.nn.Linear(IN, HIDDEN, key=k1)
        self.second = tm.nn.Linear(HIDDEN, OUT, key=k2)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.second(jnp.tanh(self.first(x)))


class NormNet(tm.Module):
    """Linear -> BatchNorm -> Linear: BatchNorm's running statistics are `State`."""

    first: tm.nn.Linear
    norm: tm.nn.BatchNorm
    second: tm.nn.Linear

    def __init__(self, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.first = tm.nn.Linear(IN, HIDDEN, key=k1)
        self.norm = tm.nn.BatchNorm(HIDDEN)
        self.second = tm.nn.Linear(HIDDEN, OUT, key=k2)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.second(self.norm(self.first(x)))


def data() -> tuple[np.ndarray, np.ndarray]:
    """The global batches, one per step: inputs (STEPS, BATCH, IN), targets (STEPS, BATCH, OUT)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((STEPS, BATCH, IN)).astype(np.float32)
    y = rng.standard_normal((STEPS, BATCH, OUT)).astype(np.float32)
    return x, y


def local_rows(global_rows: np.ndarray) -> np.ndarray:
    """This process's contiguous share of a global batch (its rows in `jax.process_index` order)."""
    per = global_rows.shape[0] // jax.process_count()
    return global_rows[jax.process_index() * per : (jax.process_index() + 1) * per]


def _loss(model: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


@tm.filter_jit
def sgd_step(model: Any, x: jax.Array, y: jax.Array) -> tuple[Any, jax.Array]:
    """One step of plain SGD on the mean squared error."""
    loss, grads = tm.filter_value_and_grad(_loss)(model, x, y)
    updates = jax.tree.map(lambda g: -LR * g, grads)
    return tm.apply_updates(model, updates), loss


@tm.filter_jit
def norm_step(model: Any, x: jax.Array, y: jax.Array) -> tuple[Any, jax.Array]:
    """One SGD step through a model with BatchNorm (its running statistics updated)."""

    def loss(params: Any, rest: Any) -> tuple[jax.Array, Any]:
        out, new_model = tm.stateful(tm.combine(params, rest))(x)
        return jnp.mean((out - y) ** 2), new_model

    params, rest = tm.partition(model, tm.is_param)
    (value, new_model), grads = jax.value_and_grad(loss, has_aux=True)(params, rest)
    updates = jax.tree.map(lambda g: -LR * g, grads)
    return tm.apply_updates(new_model, updates), value


def gathered(tree: Any) -> dict[str, np.ndarray]:
    """Every array leaf of `tree`, whole (gathered from all processes), by key path."""
    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if isinstance(leaf, jax.Array):
            name = jax.tree_util.keystr(path)
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                leaf = jax.random.key_data(leaf)
            out[name] = np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
    return out


def _train(model: Any, step: Any, batch_sharding: NamedSharding) -> tuple[Any, list[float]]:
    xs, ys = data()
    losses = []
    for x_global, y_global in zip(xs, ys, strict=True):
        x = jax.make_array_from_process_local_data(batch_sharding, local_rows(x_global))
        y = jax.make_array_from_process_local_data(batch_sharding, local_rows(y_global))
        model, loss = step(model, x, y)
        losses.append(float(loss))
    return model, losses


def train_all() -> dict[str, Any]:
    """Data parallel, fully sharded (FSDP-style) and BatchNorm training; what each gives.

    Returns, with prefixes `dp/`, `fsdp/`, `bn/`: the losses of each step and the final arrays
    (whole), plus facts about where the arrays lived (`fsdp/addressable`: whether the sharded
    weight was fully addressable; `fsdp/local_rows`: how many of its rows this process held).
    """
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, P())
    batch_sharding = NamedSharding(mesh, P("data"))
    out: dict[str, Any] = {
        "process_index": jax.process_index(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
    }

    # Data parallel: a replicated model, the batch split along "data".
    model = tm.filter_shard(Net(jax.random.key(0)), replicated)
    model, losses = _train(model, sgd_step, batch_sharding)
    out["dp/losses"] = np.array(losses)
    out.update({f"dp/{k}": v for k, v in gathered(model).items()})

    # Fully sharded: each weight's output axis (and bias) split across all devices of all
    # processes; the batch too. filter_jit's step gathers what each device needs.
    model = Net(jax.random.key(0))
    shardings = jax.tree.map(
        lambda a: NamedSharding(mesh, P("data", *[None] * (a.ndim - 1))),
        tm.filter(model, tm.is_array),
    )
    model = tm.filter_shard(model, shardings)
    out["fsdp/addressable"] = model.first.weight.is_fully_addressable
    out["fsdp/local_rows"] = sum(s.data.shape[0] for s in model.first.weight.addressable_shards)
    model, losses = _train(model, sgd_step, batch_sharding)
    out["fsdp/still_sharded"] = model.first.weight.sharding.is_equivalent_to(
        shardings.first.weight, 2
    )
    out["fsdp/losses"] = np.array(losses)
    out.update({f"fsdp/{k}": v for k, v in gathered(model).items()})

    # BatchNorm with the batch sharded across processes: statistics over the global batch.
    model = tm.filter_shard(NormNet(jax.random.key(0)), replicated)
    model, losses = _train(model, norm_step, batch_sharding)
    out["bn/losses"] = np.array(losses)
    out.update({f"bn/{k}": v for k, v in gathered(model).items()})
    # This process's own copy of the running mean, not gathered: equal on every process.
    out["bn/local_running_mean"] = np.asarray(model.norm.running_mean.value.addressable_data(0))
    return out
