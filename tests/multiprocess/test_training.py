"""Training across processes: 2 processes x 2 devices against 1 process x 4 and plain JAX.

Data parallel (replicated model, batch split), fully sharded (weights split along their output
axis across every device of both processes) and BatchNorm (statistics of the global batch, the
same on every process). The reference is a plain-JAX loop on one device in this process, written
without treemod: the same initial numbers, the same global batches, plain SGD.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiprocess import training
from multiprocess.conftest import Launch

# One xdist worker runs them all (`make test`: -n 2 --dist loadgroup), so each run starts once.
pytestmark = pytest.mark.heavy  # processes talking through jax.distributed

TARGET = "multiprocess.training:train_all"


@pytest.fixture(scope="module")
def two_by_two(launch: Launch) -> list[dict[str, np.ndarray]]:
    return launch(TARGET, processes=2, devices=2)


@pytest.fixture(scope="module")
def one_by_four(launch: Launch) -> list[dict[str, np.ndarray]]:
    return launch(TARGET, processes=1, devices=4)


def _initial(norm: bool) -> dict[str, np.ndarray]:
    model = (training.NormNet if norm else training.Net)(jax.random.key(0))
    p = {
        "w1": model.first.weight,
        "b1": model.first.bias,
        "w2": model.second.weight,
        "b2": model.second.bias,
    }
    if norm:
        p["g"], p["h"] = model.norm.weight, model.norm.bias
    return {k: np.asarray(v) for k, v in p.items()}


@functools.cache
def _reference(norm: bool) -> tuple[list[float], dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Plain JAX on one device: losses, final parameters, running mean and variance."""
    params = {k: jnp.asarray(v) for k, v in _initial(norm).items()}
    mean, var = jnp.zeros(training.HIDDEN), jnp.ones(training.HIDDEN)

    def forward(p: dict[str, Any], x: jax.Array) -> tuple[jax.Array, Any]:
        h = x @ p["w1"].T + p["b1"][None]
        stats = None
        if norm:
            mu, sigma2 = h.mean(0), h.var(0)
            h = (h - mu[None]) / jnp.sqrt(sigma2[None] + 1e-5) * p["g"][None] + p["h"][None]
            stats = (mu, sigma2)
        else:
            h = jnp.tanh(h)
        return h @ p["w2"].T + p["b2"][None], stats

    def loss(p: dict[str, Any], x: jax.Array, y: jax.Array) -> tuple[jax.Array, Any]:
        out, stats = forward(p, x)
        return jnp.mean((out - y) ** 2), stats

    losses = []
    xs, ys = training.data()
    n = training.BATCH
    for x, y in zip(xs, ys, strict=True):
        (value, stats), grads = jax.value_and_grad(loss, has_aux=True)(params, x, y)
        params = jax.tree.map(lambda a, g: a - training.LR * g, params, grads)
        if norm:
            mean = 0.9 * mean + 0.1 * stats[0]
            var = 0.9 * var + 0.1 * stats[1] * n / (n - 1)
        losses.append(float(value))
    return losses, {k: np.asarray(v) for k, v in params.items()}, np.asarray(mean), np.asarray(var)


NAMES = {
    "w1": ".first.weight",
    "b1": ".first.bias",
    "w2": ".second.weight",
    "b2": ".second.bias",
    "g": ".norm.weight",
    "h": ".norm.bias",
}


def test_processes_see_the_global_devices(two_by_two: list[dict[str, np.ndarray]]) -> None:
    assert [int(r["process_index"]) for r in two_by_two] == [0, 1]
    assert all(int(r["devices"]) == 4 and int(r["local_devices"]) == 2 for r in two_by_two)


@pytest.mark.parametrize("kind", ["dp", "fsdp"])
def test_two_processes_train_as_one(
    kind: str,
    two_by_two: list[dict[str, np.ndarray]],
    one_by_four: list[dict[str, np.ndarray]],
) -> None:
    losses, params, _, _ = _reference(norm=False)
    single = one_by_four[0]
    for result in two_by_two:
        np.testing.assert_allclose(result[f"{kind}/losses"], single[f"{kind}/losses"], rtol=1e-6)
        np.testing.assert_allclose(result[f"{kind}/losses"], losses, rtol=1e-5)
        for short, name in NAMES.items():
            if short in params:
                got = result[f"{kind}/{name}"]
                np.testing.assert_allclose(got, single[f"{kind}/{name}"], rtol=1e-6, atol=1e-7)
                np.testing.assert_allclose(got, params[short], rtol=1e-5, atol=1e-6)


def test_fsdp_weights_span_processes(two_by_two: list[dict[str, np.ndarray]]) -> None:
    for result in two_by_two:
        # Not fully addressable: each process holds half the rows (its two devices' quarters),
        # before and after training.
        assert not bool(result["fsdp/addressable"])
        assert int(result["fsdp/local_rows"]) == training.HIDDEN // 2
        assert bool(result["fsdp/still_sharded"])


def test_batch_norm_statistics_agree_across_processes(
    two_by_two: list[dict[str, np.ndarray]], one_by_four: list[dict[str, np.ndarray]]
) -> None:
    losses, params, mean, var = _reference(norm=True)
    first, second = two_by_two
    # Each process's own copy of the running mean is the same, and is the global batch's.
    np.testing.assert_array_equal(first["bn/local_running_mean"], second["bn/local_running_mean"])
    for result in [*two_by_two, *one_by_four]:
        np.testing.assert_allclose(result["bn/losses"], losses, rtol=1e-5)
        np.testing.assert_allclose(result["bn/local_running_mean"], mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            result["bn/.norm.running_mean.value"], mean, rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(result["bn/.norm.running_var.value"], var, rtol=1e-5, atol=1e-6)
        for short, name in NAMES.items():
            np.testing.assert_allclose(result[f"bn/{name}"], params[short], rtol=1e-5, atol=1e-6)
