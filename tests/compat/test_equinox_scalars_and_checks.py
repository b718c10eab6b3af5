"""Compat layers take Python numbers and are not shape-checked, as Equinox's; against Equinox.

Equinox accepts a Python `int`, `float` or `bool` wherever it accepts a scalar array, and never
checks annotations: neither of its layers nor of a user's subclasses of them. Every class in
`treemod.compat.equinox.nn` behaves so; treemod's own layers keep their checks.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Int

import treemod as tm
import treemod.compat.equinox as teqx

K = jax.random.key(1)
D = jax.random.key(2)


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the outcome is the error's type
        return e


# Layers that take a scalar in Equinox, each built from `nn` and called on `x`.
_SCALAR_CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "Linear-scalar-in": lambda nn, x: nn.Linear("scalar", 3, key=K)(x),
    "Linear-scalar-both": lambda nn, x: nn.Linear("scalar", "scalar", key=K)(x),
    "MLP-scalar-in": lambda nn, x: nn.MLP("scalar", 2, 4, 2, key=K)(x),
    "MLP-scalar-both": lambda nn, x: nn.MLP("scalar", "scalar", 4, 2, key=K)(x),
    "MLP-depth-0": lambda nn, x: nn.MLP("scalar", 2, 4, 0, key=K)(x),
    "MLP-scan": lambda nn, x: nn.MLP("scalar", 2, 4, 3, scan=True, key=K)(x),
    "MLP-prelu": lambda nn, x: nn.MLP("scalar", 2, 4, 2, activation=nn.PReLU(), key=K)(x),
    "Identity": lambda nn, x: nn.Identity()(x),
    "Dropout-inference": lambda nn, x: nn.Dropout(0.5, inference=True)(x),
    "Dropout-p0": lambda nn, x: nn.Dropout(0.0)(x, key=D),
    "Dropout": lambda nn, x: nn.Dropout(0.5)(x, key=D),
    "Lambda": lambda nn, x: nn.Lambda(jnp.tanh)(x),
    "PReLU": lambda nn, x: nn.PReLU()(x),
    "Sequential": lambda nn, x: nn.Sequential(
        [nn.Linear("scalar", 3, key=K), nn.Lambda(jax.nn.relu), nn.Linear(3, "scalar", key=D)]
    )(x),
    "Embedding": lambda nn, x: nn.Embedding(10, 4, key=K)(x),
    "LayerNorm-scalar": lambda nn, x: nn.LayerNorm(None, use_weight=False, use_bias=False)(x),
    "Shared": lambda nn, x: nn.Shared(
        (nn.Linear("scalar", 2, key=K), nn.Linear("scalar", 2, key=D)),
        lambda p: p[1].weight,
        lambda p: p[0].weight,
    )()[1](x),
    "WeightNorm": lambda nn, x: nn.WeightNorm(nn.Linear("scalar", 3, key=K))(x),
}
_INPUTS = [True, 3, 0.25, -1]


@pytest.mark.parametrize("x", _INPUTS, ids=repr)
@pytest.mark.parametrize("name", sorted(_SCALAR_CALLS))
def test_python_numbers_as_in_equinox(name: str, x: Any) -> None:
    with jax.numpy_dtype_promotion("standard"):  # JAX's default, as users run Equinox
        theirs = _outcome(lambda: _SCALAR_CALLS[name](eqx.nn, x))
        ours = _outcome(lambda: _SCALAR_CALLS[name](teqx.nn, x))
    if name == "Embedding" and x is True:
        # A deliberate difference: Equinox's `weight[True]` is the whole table with a new axis.
        assert jnp.shape(theirs) == (1, 10, 4)
        assert isinstance(ours, TypeError) and "indices must be integers" in str(ours)
        return
    if isinstance(theirs, Exception):
        # Equinox's training-mode Dropout reads `x.shape`: a number is its error, not ours.
        assert not isinstance(ours, tm.ShapeCheckError), (name, ours)
        return
    assert not isinstance(ours, Exception), (name, ours)
    assert jnp.shape(ours) == jnp.shape(theirs), name
    assert jnp.result_type(ours) == jnp.result_type(theirs), name
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-6, atol=1e-7)


def test_every_scalar_taking_layer_is_covered() -> None:
    covered = {n.split("-")[0] for n in _SCALAR_CALLS}
    # Layers whose input is a vector, an image, a sequence or a state: no scalar form.
    no_scalar = {"BatchNorm", "GRUCell", "LSTMCell", "MultiheadAttention", "RMSNorm"}
    no_scalar |= {"GroupNorm", "RotaryPositionalEmbedding", "SpectralNorm", "StatefulLayer"}
    no_scalar |= {"StateIndex", "Conv", "ConvTranspose", "Pool", "AdaptivePool"}
    for name in dir(eqx.nn):
        cls = getattr(eqx.nn, name)
        if inspect.isclass(cls) and issubclass(cls, eqx.Module) and name not in no_scalar:
            if not any(name.startswith(p) for p in ("Conv", "MaxPool", "AvgPool", "Adaptive")):
                assert name in covered, name


def _loose(self: Any, x: Int[Array, "seq dim"]) -> Int[Array, "seq dim"]:
    """A method whose annotation Equinox code often gets wrong: ints annotated, floats given."""
    return x


def _loose_call(self: Any, x: Int[Array, "seq dim"], *args: Any, **kwargs: Any) -> Any:
    return x


# Every compat class (and the bases the issue names), built from `nn`.
_BUILDERS: dict[str, Callable[[Any, type], Any]] = {
    "Linear": lambda nn, c: c(2, 3, key=K),
    "Dropout": lambda nn, c: c(0.5),
    "Identity": lambda nn, c: c(),
    "Lambda": lambda nn, c: c(jnp.tanh),
    "Sequential": lambda nn, c: c([nn.Identity()]),
    "MLP": lambda nn, c: c(2, 2, 4, 1, key=K),
    "PReLU": lambda nn, c: c(),
    "Embedding": lambda nn, c: c(4, 2, key=K),
    "RotaryPositionalEmbedding": lambda nn, c: c(4),
    "MultiheadAttention": lambda nn, c: c(2, 4, key=K),
    "LayerNorm": lambda nn, c: c(3),
    "RMSNorm": lambda nn, c: c(3),
    "GroupNorm": lambda nn, c: c(1, 3),
    "GRUCell": lambda nn, c: c(2, 3, key=K),
    "LSTMCell": lambda nn, c: c(2, 3, key=K),
    "Conv1d": lambda nn, c: c(1, 1, 2, key=K),
    "ConvTranspose2d": lambda nn, c: c(1, 1, 2, key=K),
    "MaxPool2d": lambda nn, c: c(2),
    "AvgPool1d": lambda nn, c: c(2),
    "AdaptiveAvgPool1d": lambda nn, c: c(2),
    "AdaptiveMaxPool3d": lambda nn, c: c(2),
    "BatchNorm": lambda nn, c: c(3, "batch", mode="batch"),
    "SpectralNorm": lambda nn, c: c(nn.Linear(2, 2, key=K), "weight", key=K),
    "WeightNorm": lambda nn, c: c(nn.Linear(2, 2, key=K)),
    "Shared": lambda nn, c: c((jnp.ones(2), jnp.ones(2)), lambda p: p[1], lambda p: p[0]),
    "StatefulLayer": lambda nn, c: c(),
}


@pytest.mark.parametrize("name", sorted(_BUILDERS))
def test_subclasses_of_compat_layers_are_not_shape_checked(name: str) -> None:
    x = jnp.ones((2, 3))  # float, where the annotation says int
    for lib in (eqx, teqx):
        base = getattr(lib.nn, name)
        body = {"__module__": __name__, "loose": _loose, "__call__": _loose_call}
        sub = type(f"My{name}", (base,), body)  # a class statement's body, as a dict
        layer = _BUILDERS[name](lib.nn, sub)
        assert layer.loose(x) is x and layer(x) is x, (lib.__name__, name)


def test_treemod_layers_keep_their_checks() -> None:
    Mine = type("Mine", (tm.nn.Linear,), {"__module__": __name__, "loose": _loose})

    with pytest.raises(tm.ShapeCheckError, match=r"Mine\._loose argument x"):
        Mine(2, 3, key=K).loose(jnp.ones((2, 3)))
    with pytest.raises(tm.ShapeCheckError, match=r"Linear\.__call__ argument x"):
        tm.nn.Linear("scalar", 3, key=K)(0.25)


def test_checks_can_be_asked_for() -> None:
    body = {"__module__": __name__, "loose": _loose}
    Checked = type("Checked", (teqx.nn.Linear,), body, shapecheck=True)

    with pytest.raises(tm.ShapeCheckError, match=r"Checked\._loose argument x"):
        Checked(2, 3, key=K).loose(jnp.ones((2, 3)))


def test_layers_built_inside_containers_are_the_compat_class() -> None:
    mlp = teqx.nn.MLP("scalar", 2, 4, 1, key=K)
    attention = teqx.nn.MultiheadAttention(2, 4, key=K)
    for layer in (*mlp.layers, attention.query_proj, attention.output_proj):
        assert type(layer) is teqx.nn.Linear
    assert type(attention.dropout) is teqx.nn.Dropout
    for lib in (eqx, teqx):  # as in Equinox: one class for the user's and the built ones
        assert type(lib.nn.MLP(2, 2, 4, 1, key=K).layers[0]) is lib.nn.Linear
