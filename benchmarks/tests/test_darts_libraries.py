"""The DARTS supernet in all six libraries (`benchmarks/workloads/darts_<library>.py`): the same
number of weights, and Flax Linen's and Haiku's forward passes equal plain JAX's with the same
weights (training mode). Their compiled steps run in the suite's smoke run
(`test_darts_suite.py`)."""

from __future__ import annotations

import importlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import run
from benchmarks.workloads import darts_jax
from benchmarks.workloads.case import darts_weights
from benchmarks.workloads.common import count_params
from benchmarks.workloads.darts_spec import DartsConfig, expected_params
from benchmarks.workloads.spec import FRAMEWORKS

from bench_helpers import default_promotion

CFG = DartsConfig.tiny()


def _needs(framework: str) -> None:
    if run.unavailable(framework):
        pytest.skip(f"{framework}: {run.unavailable(framework)}")


def _abstract_carry(framework: str) -> Any:
    """The carry of `make_step(CFG)` as shapes (NNX: its network only, as `(network,)`)."""
    module = importlib.import_module(f"benchmarks.workloads.darts_{framework}")
    init_carry, _ = module.make_step(CFG)
    key = jax.random.key(0)
    if framework == "treemod":
        import treemod as tm

        return tm.filter_eval_shape(init_carry, key)
    if framework == "equinox":
        import equinox as eqx

        return eqx.filter_eval_shape(init_carry, key)
    if framework in ("nnx", "nnx_tree"):  # init_carry draws a Python seed: it cannot run on shapes
        from flax import nnx

        with nnx.set_graph_mode(framework == "nnx"):
            return (nnx.eval_shape(lambda: module.Network(CFG, nnx.Rngs(0))),)
    return jax.eval_shape(init_carry, key)


# NNX, Linen and Haiku trace their networks slowly, even for shapes (12-40 s at load 6).
_SLOW = ("nnx", "nnx_tree", "linen", "haiku")


@pytest.mark.parametrize(
    "framework",
    [pytest.param(f, marks=pytest.mark.slow) if f in _SLOW else f for f in FRAMEWORKS],
)
def test_every_library_has_the_expected_number_of_weights(framework: str) -> None:
    _needs(framework)
    with default_promotion():
        carry = _abstract_carry(framework)
    weights = darts_weights(framework, carry)  # what the suite's worker counts
    assert count_params(_zeros(weights)) == expected_params(CFG) == 65606


# --- forward passes against plain JAX --------------------------------------------------------

_OPS = {"skip_connect": "skip", "sep_conv_3x3": "sep3", "sep_conv_5x5": "sep5",
        "dil_conv_3x3": "dil3", "dil_conv_5x5": "dil5"}  # fmt: skip
_CONVS = {"w": "conv", "w1": "conv1", "w2": "conv2"}  # other convolutions keep their names


def _named(params: Any) -> dict[tuple[str, ...], jax.Array]:
    """Plain JAX's weights by (layer path..., "kernel" | "scale" | "bias")."""
    out = {
        ("stem", "kernel"): params["stem"]["w"],
        ("stem_bn", "scale"): params["stem"]["scale"],
        ("stem_bn", "bias"): params["stem"]["bias"],
        ("head", "kernel"): params["head"]["w"],
        ("head", "bias"): params["head"]["b"],
    }
    for i, cell in enumerate(params["cells"]):
        for pre in ("pre0", "pre1"):
            for k, v in cell[pre].items():
                out[(f"cell{i}", pre, _CONVS[k], "kernel")] = v
        for e, edge in enumerate(cell["edges"]):
            for op, convs in edge.items():
                for k, v in convs.items():
                    out[(f"cell{i}", f"edge{e}", _OPS[op], _CONVS.get(k, k), "kernel")] = v
    return out


def _filled(target: Any, name_of: Any, named: dict[tuple[str, ...], jax.Array]) -> Any:
    """`target`'s tree with each leaf taken from `named` (by `name_of(its path)`), reshaped."""
    used = set()

    def leaf(path: Any, x: Any) -> jax.Array:
        name = name_of(tuple(str(getattr(k, "key", k)) for k in path))
        used.add(name)
        return jnp.reshape(named[name], x.shape)

    tree = jax.tree_util.tree_map_with_path(leaf, target)
    assert used == set(named)  # every weight copied once
    return tree


def _zeros(shapes: Any) -> Any:
    """Zeros for the shapes in `shapes` (other leaves, such as Equinox's strings, kept)."""
    return jax.tree_util.tree_map(
        lambda s: jnp.zeros(s.shape, s.dtype) if isinstance(s, jax.ShapeDtypeStruct) else s,
        shapes,
    )


def _linen_name(path: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(p.replace("edges_", "edge") for p in path)


def _haiku_name(path: tuple[str, ...]) -> tuple[str, ...]:
    module, param = path
    kind = {"w": "kernel", "b": "bias", "offset": "bias"}.get(param, param)
    return (*module.split("/"), kind)


@pytest.fixture(scope="module")
def reference() -> tuple[Any, Any, jax.Array, jax.Array]:
    """Plain JAX's weights, statistics, architecture weights, a batch and its logits."""
    with default_promotion():
        params, state, alphas = darts_jax.init(jax.random.key(0), CFG)
        x = jax.random.normal(jax.random.key(1), (CFG.batch, CFG.image, CFG.image, 3))
        logits, _ = darts_jax.forward(params, state, alphas, x, CFG)
    return params, alphas, x, logits


@pytest.mark.slow  # eager forward passes of a two-cell supernet (about 10 s each)
def test_linen_forward_equals_plain_jax_with_the_same_weights(reference: Any) -> None:
    _needs("linen")
    from benchmarks.workloads import darts_linen

    params, alphas, x, expected = reference
    with default_promotion():
        variables = jax.eval_shape(lambda k: darts_linen.init(k, CFG), jax.random.key(0))
        variables = {
            "params": _filled(variables["params"], _linen_name, _named(params)),
            "batch_stats": _zeros(variables["batch_stats"]),
            "arch": alphas,
        }
        logits, _ = darts_linen.Network(CFG).apply(variables, x, mutable=["batch_stats"])
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_haiku_forward_equals_plain_jax_with_the_same_weights(reference: Any) -> None:
    _needs("haiku")
    import haiku as hk

    from benchmarks.workloads import darts_haiku

    params, alphas, x, expected = reference
    net = hk.without_apply_rng(hk.transform_with_state(lambda x: darts_haiku.network(x, CFG)))
    with default_promotion():
        shapes, state = jax.eval_shape(net.init, jax.random.key(0), x)
        arch, weights = darts_haiku.split(shapes)
        weights = _filled(weights, _haiku_name, _named(params))
        state = _zeros(state)
        merged = hk.data_structures.merge(weights, {darts_haiku.ARCH: alphas})
        logits, _ = net.apply(merged, state, x)
    assert set(arch[darts_haiku.ARCH]) == set(alphas)
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)
