"""The round-trip law over layer kinds and sizes: `load_state_dict(m2, state_dict(m))` equals
`m` (for `m2` another instance of the same configuration), and exports the same tensors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import treemod as tm
import treemod.nn as nn

Make = Callable[[jax.Array], Any]


@st.composite
def layers(draw: st.DrawFn) -> Make:
    size = st.integers(1, 4)
    kind = draw(
        st.sampled_from(["linear", "conv", "conv_t", "lstm", "gru", "mha", "bn", "stack", "wn"])
    )
    a, b = draw(size), draw(size)
    bias = draw(st.booleans())
    if kind == "linear":
        return lambda k: nn.Linear(a, b, use_bias=bias, key=k)
    if kind in ("conv", "conv_t"):
        n, groups, last = (
            draw(st.integers(1, 2)),
            draw(st.sampled_from([1, 2])),
            draw(st.booleans()),
        )
        cls = nn.Conv if kind == "conv" else nn.ConvTranspose
        return lambda k: cls(
            n, 2 * a, 2 * b, 2, groups=groups, use_bias=bias, key=k, channels_last=last
        )
    if kind == "lstm":
        return lambda k: nn.LSTMCell(a, b, use_bias=bias, key=k)
    if kind == "gru":
        return lambda k: nn.GRUCell(a, b, use_bias=bias, key=k)
    if kind == "mha":
        heads = draw(st.integers(1, 2))
        flags = dict(use_query_bias=bias, use_key_bias=bias, use_value_bias=bias)
        return lambda k: nn.MultiheadAttention(
            heads, 2 * a, b, use_output_bias=not bias, **flags, key=k
        )
    if kind == "bn":
        return lambda k: nn.BatchNorm(a, channelwise_affine=bias)
    if kind == "stack":
        depth = draw(st.integers(1, 3))
        if draw(st.booleans()):  # State inside a Stack: BatchNorm's statistics get a layer axis
            return lambda k: nn.Stack(
                lambda kk: nn.BatchNorm(a, channelwise_affine=bias), depth, key=k
            )
        return lambda k: nn.Stack(lambda kk: nn.Linear(a, a, use_bias=bias, key=kk), depth, key=k)
    axis = draw(st.sampled_from([0, 1, None]))
    return lambda k: nn.WeightNorm(nn.Linear(a, b, use_bias=bias, key=k), axis=axis)


@given(st.lists(layers(), min_size=1, max_size=2), st.integers(0, 2**31 - 1))
def test_round_trip(makers: list[Make], seed: int) -> None:
    k1, k2 = jax.random.split(jax.random.key(seed))
    model = [make(k) for make, k in zip(makers, jax.random.split(k1, len(makers)), strict=True)]
    other = [make(k) for make, k in zip(makers, jax.random.split(k2, len(makers)), strict=True)]
    exported = tm.state_dict(model)
    loaded = tm.load_state_dict(other, exported)
    assert tm.tree_equal(loaded, model) is True
    again = tm.state_dict(loaded)
    assert list(again) == list(exported)
    for name in exported:
        np.testing.assert_array_equal(again[name], exported[name], err_msg=name)
