"""Inside a traced function each layer call goes through its class's nested `filter_jit`, one
version per shape and configuration: a model with many shapes (ResNet-50) passes the warning
threshold without any retrace, so no `RecompileWarning` may fire there."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp

import treemod as tm
from treemod._transforms.jit_cache import WARN_VERSIONS

from helpers import built


def test_many_layer_shapes_inside_a_trace_do_not_warn() -> None:
    # Built with NumPy values: eager random initialisers would compile once per shape (~30 s).
    sizes = range(1, WARN_VERSIONS + 16)
    layers = built(lambda: [tm.nn.Linear(n, 2, key=jax.random.key(0)) for n in sizes])

    @tm.filter_jit
    def run(layers: list[tm.nn.Linear]) -> jax.Array:
        return sum(layer(jnp.ones(layer.in_features)).sum() for layer in layers)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        total = run(layers)
    reference = sum(float(layer.weight.sum() + layer.bias.sum()) for layer in layers)
    assert abs(float(total) - reference) < 1e-3 * abs(reference) + 1e-3
