"""The compat namespace's convolutions, pools and PReLU against real Equinox.

Built with the same arguments and key, a compat layer holds Equinox's parameters (same values,
shapes and dtypes, so the same checkpoint bytes) and gives Equinox's outputs; Equinox's files
load into it and its files load into Equinox's layers.
"""

from __future__ import annotations

import io
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm
import treemod.compat.equinox as ceqx

eqx = pytest.importorskip("equinox")


def _bytes(save: Any, tree: Any) -> bytes:
    buf = io.BytesIO()
    save(buf, tree)
    return buf.getvalue()


def _x(*shape: int, seed: int = 0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _same_layer(ours: Any, theirs: Any, x: Any, same_tree: bool = True) -> None:
    """Same parameters (bytes of the files) and the same output on `x`; with `same_tree` the
    compat layer's own leaves are Equinox's too (pools keep `init` as configuration instead)."""
    data = _bytes(eqx.tree_serialise_leaves, theirs)
    assert _bytes(ceqx.tree_serialise_leaves, ours) == data
    if same_tree:
        assert _bytes(eqx.tree_serialise_leaves, ours) == data
    np.testing.assert_allclose(np.asarray(ours(x)), np.asarray(theirs(x)), rtol=1e-5, atol=1e-5)


_conv_config = st.fixed_dictionaries(
    {
        "n": st.integers(1, 3),
        "kernel": st.integers(1, 3),
        "stride": st.integers(1, 3),
        "dilation": st.integers(1, 2),
        "groups": st.sampled_from([1, 2]),
        "padding": st.one_of(st.integers(0, 2), st.sampled_from(["SAME", "SAME_LOWER", "VALID"])),
        "use_bias": st.booleans(),
        "seed": st.integers(0, 2**31 - 1),
    }
)


@settings(deadline=None, max_examples=20)
@given(_conv_config, st.sampled_from(["ZEROS", "REFLECT", "REPLICATE", "CIRCULAR"]))
def test_conv_is_equinoxs(config: dict, padding_mode: str) -> None:
    n = config["n"]
    args = (4, 6, config["kernel"])
    kwargs = dict(
        stride=config["stride"],
        padding=config["padding"],
        dilation=config["dilation"],
        groups=config["groups"],
        use_bias=config["use_bias"],
        padding_mode=padding_mode,
        key=jax.random.PRNGKey(config["seed"]),
    )
    theirs = getattr(eqx.nn, f"Conv{n}d")(*args, **kwargs)
    ours = getattr(ceqx.nn, f"Conv{n}d")(*args, **kwargs)
    _same_layer(ours, theirs, _x(4, *(7,) * n))
    general = ceqx.nn.Conv(n, *args, **kwargs)
    assert _bytes(ceqx.tree_serialise_leaves, general) == _bytes(eqx.tree_serialise_leaves, theirs)


@settings(deadline=None, max_examples=20)
@given(_conv_config, st.integers(0, 2))
def test_conv_transpose_is_equinoxs(config: dict, output_padding: int) -> None:
    n, stride, padding = config["n"], config["stride"], config["padding"]
    if isinstance(padding, str):
        output_padding = 0  # treemod takes output_padding with explicit padding only
    output_padding = min(output_padding, stride - 1)
    kwargs = dict(
        stride=stride,
        padding=padding,
        output_padding=output_padding,
        dilation=config["dilation"],
        groups=config["groups"],
        use_bias=config["use_bias"],
        key=jax.random.PRNGKey(config["seed"]),
    )
    theirs = getattr(eqx.nn, f"ConvTranspose{n}d")(4, 6, config["kernel"], **kwargs)
    ours = getattr(ceqx.nn, f"ConvTranspose{n}d")(4, 6, config["kernel"], **kwargs)
    _same_layer(ours, theirs, _x(4, *(6,) * n))


def test_circular_conv_transpose() -> None:
    key = jax.random.PRNGKey(3)
    for n in (1, 2):
        kwargs = dict(stride=2, padding="SAME", padding_mode="CIRCULAR", key=key)
        theirs = getattr(eqx.nn, f"ConvTranspose{n}d")(2, 3, 3, **kwargs)
        ours = getattr(ceqx.nn, f"ConvTranspose{n}d")(2, 3, 3, **kwargs)
        _same_layer(ours, theirs, _x(2, *(5,) * n))


def test_conv_dtypes_and_complex() -> None:
    key = jax.random.PRNGKey(1)
    for dtype in (jnp.float16, jnp.bfloat16, jnp.complex64):
        theirs = eqx.nn.Conv1d(2, 3, 3, dtype=dtype, key=key)
        ours = ceqx.nn.Conv1d(2, 3, 3, dtype=dtype, key=key)
        assert ours.weight.dtype == dtype and ours.bias.shape == (3, 1)
        _same_layer(ours, theirs, _x(2, 6).astype(dtype))


def test_equinox_file_loads_into_compat_conv_and_back() -> None:
    theirs = eqx.nn.ConvTranspose2d(3, 4, 3, stride=2, key=jax.random.PRNGKey(5))
    like = ceqx.nn.ConvTranspose2d(3, 4, 3, stride=2, key=jax.random.PRNGKey(6))
    data = _bytes(eqx.tree_serialise_leaves, theirs)
    ours = ceqx.tree_deserialise_leaves(io.BytesIO(data), like)
    _same_layer(ours, theirs, _x(3, 5, 5))
    back = eqx.tree_deserialise_leaves(io.BytesIO(_bytes(ceqx.tree_serialise_leaves, ours)), theirs)
    assert eqx.tree_equal(back, theirs)


def test_compat_and_treemod_convolutions_agree_through_a_file() -> None:
    # Equinox's layout (compat) and treemod's (PyTorch's orientation) hold one layer two ways.
    ours = ceqx.nn.ConvTranspose1d(2, 3, 4, stride=2, padding=1, key=jax.random.PRNGKey(0))
    like = tm.nn.ConvTranspose1d(2, 3, 4, stride=2, padding=1, key=jax.random.key(1))
    proper = ceqx.tree_deserialise_leaves(
        io.BytesIO(_bytes(ceqx.tree_serialise_leaves, ours)), like
    )
    x = _x(2, 9)
    np.testing.assert_allclose(np.asarray(proper(x)), np.asarray(ours(x)), rtol=1e-5, atol=1e-6)
    assert proper.bias.shape == (3,) and ours.bias.shape == (3, 1)


@pytest.mark.parametrize("layer", ["Conv2d", "ConvTranspose2d"])
def test_conv_takes_one_example_as_equinox(layer: str) -> None:
    conv = getattr(ceqx.nn, layer)(2, 3, 3, key=jax.random.PRNGKey(0))
    with pytest.raises(
        ValueError, match=rf"Input to `{layer}` needs to have rank 3 .*\(4, 2, 5, 5\)"
    ):
        conv(jnp.ones((4, 2, 5, 5)))
    assert jax.vmap(conv)(jnp.ones((4, 2, 5, 5))).shape[0] == 4


_POOL_OPTIONS = [
    {},
    {"stride": 2, "padding": 1},
    {"stride": 2, "use_ceil": True},
    {"stride": 2, "padding": 1, "use_ceil": True},
    {"stride": (1, 2, 2), "padding": ((0, 1), (1, 0), (1, 1)), "use_ceil": True},
]


# The windows and `use_ceil`'s padding are worked out per axis alike: every option in one
# dimension, and in two and three dimensions the options that combine axes (the plain one and
# per-axis strides and paddings with use_ceil); each for both reductions.
@pytest.mark.parametrize("kind", ["Max", "Avg"])
@pytest.mark.parametrize(
    ("n", "kwargs"),
    [(1, options) for options in _POOL_OPTIONS]
    + [(n, _POOL_OPTIONS[i]) for n in (2, 3) for i in (0, 4)],
)
def test_pools_are_equinoxs(n: int, kind: str, kwargs: dict) -> None:
    kwargs = {k: v[:n] if isinstance(v, tuple) else v for k, v in kwargs.items()}
    theirs = getattr(eqx.nn, f"{kind}Pool{n}d")(3, **kwargs)
    ours = getattr(ceqx.nn, f"{kind}Pool{n}d")(3, **kwargs)
    _same_layer(ours, theirs, _x(2, *(8,) * n), same_tree=False)


def test_general_pool_and_its_ceil_error() -> None:
    from jax import lax

    theirs = eqx.nn.Pool(jnp.inf, lax.min, 1, 2, stride=2, use_ceil=True)
    ours = ceqx.nn.Pool(jnp.inf, lax.min, 1, 2, stride=2, use_ceil=True)
    np.testing.assert_array_equal(ours(_x(2, 9)), theirs(_x(2, 9)))
    # Equinox refuses a ceil padding beyond the kernel; so does the compat pool, saying why.
    pool = ceqx.nn.MaxPool1d(3, stride=3, padding=1, use_ceil=True)
    with pytest.raises(
        RuntimeError, match=r"MaxPool1d: with use_ceil the padding becomes \(1, 4\)"
    ):
        pool(_x(2, 8))
    with pytest.raises(RuntimeError):
        eqx.nn.MaxPool1d(3, stride=3, padding=1, use_ceil=True)(_x(2, 8))


# Equinox's windows are computed axis by axis, the same way on every axis: every (target, size)
# kind (dividing, uneven runs, one run each) in one dimension, and an uneven case in two and
# three dimensions for the axes' loop; each for both reductions.
@pytest.mark.parametrize("kind", ["Max", "Avg"])
@pytest.mark.parametrize(
    ("n", "target", "size"), [(1, 2, 4), (1, 3, 7), (1, 4, 9), (1, 5, 5), (2, 4, 9), (3, 3, 7)]
)
def test_adaptive_pools_use_equinoxs_windows(n: int, kind: str, target: int, size: int) -> None:
    theirs = getattr(eqx.nn, f"Adaptive{kind}Pool{n}d")(target)
    ours = getattr(ceqx.nn, f"Adaptive{kind}Pool{n}d")(target)
    _same_layer(ours, theirs, _x(2, *(size,) * n))


def test_adaptive_pool_general_and_too_short() -> None:
    theirs = eqx.nn.AdaptivePool((2, 3), 2, jnp.min)
    ours = ceqx.nn.AdaptivePool((2, 3), 2, jnp.min)
    np.testing.assert_array_equal(ours(_x(3, 5, 7)), theirs(_x(3, 5, 7)))
    with pytest.raises(ValueError, match=r"AdaptiveAvgPool1d: cannot pool a length of 2 to 3"):
        ceqx.nn.AdaptiveAvgPool1d(3)(_x(1, 2))


@pytest.mark.parametrize("alpha", [0.25, jnp.array([0.1, 0.2, 0.3]), jnp.array(0.5, jnp.float16)])
def test_prelu_is_equinoxs(alpha: Any) -> None:
    theirs, ours = eqx.nn.PReLU(alpha), ceqx.nn.PReLU(alpha)
    assert ours.negative_slope.shape == theirs.negative_slope.shape
    assert ours.negative_slope.dtype == theirs.negative_slope.dtype
    with jax.numpy_dtype_promotion("standard"):
        _same_layer(ours, theirs, _x(4, 3))


def test_default_prelu_file_loads_into_treemods_prelu() -> None:
    data = _bytes(eqx.tree_serialise_leaves, eqx.nn.PReLU(0.3))
    ours = ceqx.tree_deserialise_leaves(io.BytesIO(data), ceqx.nn.PReLU())
    proper = ceqx.tree_deserialise_leaves(io.BytesIO(data), tm.nn.PReLU())
    assert ours.negative_slope.shape == () and proper.negative_slope.shape == (1,)
    x = _x(5)
    np.testing.assert_allclose(np.asarray(ours(x)), np.asarray(proper(x)))


@pytest.mark.parametrize("padding", ["SAME", "SAME_LOWER"])
@pytest.mark.parametrize(("kernel", "stride", "dilation"), [(3, 2, 2), (4, 3, 1), (2, 3, 1)])
def test_conv_transpose_same_padding_with_output_padding(
    padding: str, kernel: int, stride: int, dilation: int
) -> None:
    kwargs = dict(stride=stride, padding=padding, output_padding=1, dilation=dilation)
    theirs = eqx.nn.ConvTranspose1d(2, 3, kernel, key=jax.random.PRNGKey(2), **kwargs)
    ours = ceqx.nn.ConvTranspose1d(2, 3, kernel, key=jax.random.PRNGKey(2), **kwargs)
    _same_layer(ours, theirs, _x(2, 7))


def test_integer_inputs_are_pooled_as_equinox_pools_them() -> None:
    x = jnp.arange(-7, 7).reshape(1, 14)
    for make in (
        lambda nn: nn.MaxPool1d(3, stride=3, use_ceil=True),
        lambda nn: nn.AvgPool1d(2, 3),
        lambda nn: nn.AdaptiveMaxPool1d(4),
        lambda nn: nn.PReLU(0.1),
        lambda nn: nn.PReLU(jnp.full(14, 0.2)),
    ):
        with jax.numpy_dtype_promotion("standard"):
            theirs = make(eqx.nn)(x)
        ours = make(ceqx.nn)(x)
        assert ours.dtype == theirs.dtype
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
