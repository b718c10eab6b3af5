"""Fixed seeds give Equinox's parameters in every dtype, bitwise, against real Equinox.

Equinox draws each parameter in its own dtype (a bfloat16 draw is not the float32 draw
rounded); the compat layers do too, for every layer that takes `dtype=`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod.compat.equinox as teqx

K = jax.random.key(3)

# Each builds a layer (and its state, for the stateful ones) from `nn` in `dtype`.
_LAYERS: dict[str, Callable[[Any, Any], Any]] = {
    "Linear": lambda nn, dt: nn.Linear(5, 3, dtype=dt, key=K),
    "Linear-scalar": lambda nn, dt: nn.Linear("scalar", "scalar", dtype=dt, key=K),
    "Linear-zero": lambda nn, dt: nn.Linear(0, 3, dtype=dt, key=K),
    "MLP": lambda nn, dt: nn.MLP(3, 2, 8, 2, dtype=dt, key=K),
    "MLP-scan": lambda nn, dt: nn.MLP(3, 2, 8, 3, dtype=dt, scan=True, key=K),
    "Conv": lambda nn, dt: nn.Conv(2, 3, 4, 3, dtype=dt, key=K),
    "Conv1d": lambda nn, dt: nn.Conv1d(3, 4, 3, groups=1, dtype=dt, key=K),
    "Conv2d": lambda nn, dt: nn.Conv2d(2, 4, 3, groups=2, dtype=dt, key=K),
    "Conv3d": lambda nn, dt: nn.Conv3d(2, 2, 2, dtype=dt, key=K),
    "ConvTranspose": lambda nn, dt: nn.ConvTranspose(1, 3, 4, 3, dtype=dt, key=K),
    "ConvTranspose1d": lambda nn, dt: nn.ConvTranspose1d(3, 4, 3, dtype=dt, key=K),
    "ConvTranspose2d": lambda nn, dt: nn.ConvTranspose2d(2, 4, 3, groups=2, dtype=dt, key=K),
    "ConvTranspose3d": lambda nn, dt: nn.ConvTranspose3d(2, 2, 2, dtype=dt, key=K),
    "Embedding": lambda nn, dt: nn.Embedding(10, 4, dtype=dt, key=K),
    "MultiheadAttention": lambda nn, dt: nn.MultiheadAttention(
        2, 8, use_query_bias=True, use_output_bias=True, dtype=dt, key=K
    ),
    "GRUCell": lambda nn, dt: nn.GRUCell(3, 4, dtype=dt, key=K),
    "LSTMCell": lambda nn, dt: nn.LSTMCell(3, 4, dtype=dt, key=K),
    "LayerNorm": lambda nn, dt: nn.LayerNorm(4, dtype=dt),
    "RMSNorm": lambda nn, dt: nn.RMSNorm(4, dtype=dt),
    "GroupNorm": lambda nn, dt: nn.GroupNorm(2, 4, dtype=dt),
    "BatchNorm": lambda nn, dt: nn.make_with_state(nn.BatchNorm)(4, "batch", dtype=dt),
    "SpectralNorm": lambda nn, dt: nn.make_with_state(nn.SpectralNorm)(
        nn.Linear(4, 3, dtype=dt, key=K), "weight", key=jax.random.key(5)
    ),
    "RotaryPositionalEmbedding": lambda nn, dt: nn.RotaryPositionalEmbedding(4, dtype=dt),
}
_DTYPES = [jnp.float16, jnp.bfloat16, jnp.float32, jnp.complex64]


def _arrays(tree: Any) -> list[Any]:
    if isinstance(tree, tuple) and isinstance(tree[1], eqx.nn.State | teqx.nn.State):
        model, state = tree  # the model's arrays, then each state entry's, in tree order
        index = (eqx.nn.StateIndex, teqx.nn.StateIndex)
        found = jax.tree_util.tree_leaves(model, is_leaf=lambda x: isinstance(x, index))
        entries = [state.get(i) for i in found if isinstance(i, index)]
        return _arrays(model) + _arrays(entries)
    return [x for x in jax.tree_util.tree_leaves(tree) if isinstance(x, jax.Array)]


# A remaining difference (docs/migrating-from-equinox.md): treemod's normalisation layers take
# real dtypes only; Equinox's hold complex ones and ones.
_REAL_ONLY = {"LayerNorm", "RMSNorm", "GroupNorm"}


def _compare(name: str, dtype: Any) -> None:
    try:
        theirs = _LAYERS[name](eqx.nn, dtype)
    except Exception:  # noqa: BLE001 - a dtype Equinox does not take for this layer
        return
    if name in _REAL_ONLY and jnp.issubdtype(dtype, jnp.complexfloating):
        with pytest.raises(TypeError, match=f"{name}: dtype must be a real floating dtype"):
            _LAYERS[name](teqx.nn, dtype)
        return
    ours = _LAYERS[name](teqx.nn, dtype)
    a, b = _arrays(ours), _arrays(theirs)
    assert len(a) == len(b), (name, len(a), len(b))
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape, (name, x.dtype, y.dtype)
        if name == "SpectralNorm" and jnp.issubdtype(dtype, jnp.complexfloating):
            # The state holds the estimates after 15 power iterations: arithmetic, whose
            # complex rounding differs by an ulp; the draws themselves are bitwise equal.
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
            continue
        # Bitwise: the same draws, not merely close values.
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=f"{name} {dtype}")


@pytest.mark.parametrize("dtype", _DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name", sorted(_LAYERS))
def test_parameters_are_equinox_bitwise(name: str, dtype: Any) -> None:
    _compare(name, dtype)


def test_every_dtype_taking_layer_is_covered() -> None:
    import inspect

    takes_dtype = {
        n
        for n in dir(eqx.nn)
        if inspect.isclass(getattr(eqx.nn, n))
        and "dtype" in inspect.signature(getattr(eqx.nn, n).__init__).parameters
    }
    assert takes_dtype <= {n.split("-")[0] for n in _LAYERS}, takes_dtype


def test_float64_under_x64() -> None:
    with jax.enable_x64(True):
        for name in ("Linear", "Embedding", "MLP", "GRUCell", "Conv2d", "MultiheadAttention"):
            _compare(name, jnp.float64)
