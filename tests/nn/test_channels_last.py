"""Channels-last convolutions, pools, BatchNorm and GroupNorm: PyTorch values and gradients,
and the law that a channels-last layer built from the same key computes the transposed result."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import treemod as tm
import treemod.nn as nn

from helpers import close, normal

SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def to_last(a):
    """(N, C, *spatial) -> (N, *spatial, C)."""
    return jnp.moveaxis(a, 1, -1)


def both(last, first, x):
    """`last(to_last(x))` and `to_last(first(x))`, compiled as one program (one compilation per
    example instead of two eager ones; the layers' eager calls are test_eager_calls.py's)."""
    return jax.jit(lambda x: (last(to_last(x)), to_last(first(x))))(x)


conv_cases = st.fixed_dictionaries(
    {
        "n": st.integers(1, 3),
        "kernel_size": st.integers(1, 3),
        "stride": st.integers(1, 2),
        "dilation": st.integers(1, 2),
        "groups": st.sampled_from([1, 2]),
        "padding": st.sampled_from([0, 1, "SAME", "VALID"]),
        "padding_mode": st.sampled_from(["ZEROS", "REFLECT", "CIRCULAR"]),
        "use_bias": st.booleans(),
        "seed": st.integers(0, 2**16),
    }
)


@SETTINGS
@given(conv_cases)
def test_conv_channels_last_is_the_transposed_channels_first_conv(case):
    n, seed = case.pop("n"), case.pop("seed")
    key = jax.random.key(seed)
    first = nn.Conv(n, 4, 6, key=key, **case)
    last = nn.Conv(n, 4, 6, key=key, channels_last=True, **case)
    kernel = tuple(range(2, n + 2))
    close(last.weight, jnp.transpose(first.weight, (*kernel, 1, 0)), atol=0)
    assert last.weight.shape == (*first.kernel_size, 2 if case["groups"] == 2 else 4, 6)
    x = normal((2, 4, *(7, 6, 5)[:n]), seed)
    close(*both(last, first, x))


@SETTINGS
@given(
    n=st.integers(1, 3),
    stride=st.integers(1, 3),
    padding=st.integers(0, 1),
    groups=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_conv_transpose_channels_last_is_the_transposed_channels_first_one(
    n, stride, padding, groups, seed
):
    key = jax.random.key(seed)
    kw = dict(kernel_size=3, stride=stride, padding=padding, output_padding=stride - 1)
    first = nn.ConvTranspose(n, 4, 6, groups=groups, key=key, **kw)
    last = nn.ConvTranspose(n, 4, 6, groups=groups, key=key, channels_last=True, **kw)
    x = normal((2, 4, *(5, 4, 3)[:n]), seed)
    close(*both(last, first, x))


@SETTINGS
@given(
    n=st.integers(1, 3),
    pool=st.sampled_from([nn.MaxPool, nn.AvgPool]),
    kernel_size=st.integers(2, 3),
    stride=st.integers(1, 3),
    padding=st.integers(0, 1),
    use_ceil=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_pools_channels_last_are_the_transposed_channels_first_ones(
    n, pool, kernel_size, stride, padding, use_ceil, seed
):
    kw = dict(kernel_size=kernel_size, stride=stride, padding=padding, use_ceil=use_ceil)
    x = normal((2, 3, *(7, 6, 5)[:n]), seed)
    close(*both(pool(n, **kw, channels_last=True), pool(n, **kw), x))


@pytest.mark.usefixtures("shape_checks_on")
@pytest.mark.parametrize("kind", ["Avg", "Max"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_per_dimension_pools_take_channels_last(kind, n):
    """As their `__call__` docs say. Before, the adaptive ones refused `channels_last` (a
    TypeError) and the shape check of every one refused channels-last arrays."""
    x = normal((2, 3, *(7, 6, 5)[:n]), n)
    pool = getattr(nn, f"{kind}Pool{n}d")
    close(pool(2, channels_last=True)(to_last(x)), to_last(pool(2)(x)))
    layer = getattr(nn, f"Adaptive{kind}Pool{n}d")
    expected = to_last(layer(2)(x))
    close(layer(2, channels_last=True)(to_last(x)), expected)
    # One output cell by hand: the first window along each axis is [0, ceil(size / 2)).
    window = np.asarray(x)[(slice(None), slice(None), *(slice(0, -(-s // 2)) for s in x.shape[2:]))]
    reduce = np.mean if kind == "Avg" else np.max
    first_cell = reduce(window.reshape(2, 3, -1), axis=-1)
    close(expected[(slice(None), *(0,) * n, slice(None))], first_cell)


@SETTINGS
@given(spatial=st.integers(0, 2), seed=st.integers(0, 2**16))
def test_batch_norm_channels_last_matches_channels_first(spatial, seed):
    x = normal((4, 3, *(5, 4)[:spatial]), seed) * 3 + 1
    first, last = nn.BatchNorm(3), nn.BatchNorm(3, channels_last=True)
    y_first, first = tm.stateful(first)(x)
    y_last, last = tm.stateful(last)(to_last(x))
    close(y_last, to_last(y_first))
    close(last.running_mean.value, first.running_mean.value)
    close(last.running_var.value, first.running_var.value)
    close(nn.inference_mode(last)(to_last(x)), to_last(nn.inference_mode(first)(x)))


@SETTINGS
@given(
    groups=st.sampled_from([1, 2, 3, 6]),
    spatial=st.integers(0, 3),
    batched=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_group_norm_channels_last_matches_channels_first(groups, spatial, batched, seed):
    x = normal((2, 6, *(4, 3, 2)[:spatial]), seed) * 2 + 1
    shift = jnp.arange(6.0)

    def build(last):
        ndim = spatial if batched else None
        layer = nn.GroupNorm(groups, 6, spatial_ndim=ndim, channels_last=last)
        return jax.tree.map(lambda v: v + shift, layer)  # weight and bias that differ per channel

    last, first = build(True), build(False)
    if batched:
        close(*both(last, first, x), atol=1e-5)
    else:
        close(*both(lambda x: last(x[0])[None], lambda x: first(x[0])[None], x), atol=1e-5)


def test_batch_norm_channels_last_under_vmap_with_an_axis_name():
    x = normal((6, 5, 4, 3), 0)  # (N, H, W, C)
    mapped = nn.BatchNorm(3, axis_name="batch", channels_last=True)
    batched = nn.BatchNorm(3, channels_last=True)
    out, mapped = jax.vmap(tm.stateful(mapped), axis_name="batch", out_axes=(0, None))(x)
    expected, batched = tm.stateful(batched)(x)
    close(out, expected)
    close(mapped.running_var.value, batched.running_var.value)


def test_channels_last_layers_take_any_number_of_batch_dimensions():
    conv = nn.Conv(2, 3, 5, 3, padding=1, channels_last=True, key=jax.random.key(0))
    x = normal((2, 4, 8, 8, 3), 1)
    flat = conv(x.reshape(8, 8, 8, 3))
    close(conv(x), flat.reshape(2, 4, 8, 8, 5))
    close(conv(x[0, 0]), flat[0])
    pool = nn.AvgPool(2, 2, 2, channels_last=True)
    assert pool(x).shape == (2, 4, 4, 4, 3) and pool(x[0, 0]).shape == (4, 4, 3)


@pytest.mark.parametrize(
    "case",
    [
        dict(kernel_size=3, padding=1),
        dict(kernel_size=3, stride=2, dilation=2, padding=2, groups=2),
        dict(kernel_size=1, use_bias=False),
        dict(kernel_size=3, padding=1, padding_mode="REFLECT"),
    ],
    ids=str,
)
def test_conv2d_channels_last_value_and_gradients_match_torch(case):
    """A channels-last `Conv` against `torch.nn.functional.conv2d` on the permuted arrays."""
    torch = pytest.importorskip(
        "torch", reason="PyTorch (CPU) is not installed: `pip install -e '.[torch]'` to run it"
    )
    layer = nn.Conv(2, 4, 6, key=jax.random.key(0), channels_last=True, **case)
    x = normal((2, 11, 9, 4), 1)  # (N, H, W, C)

    def loss(layer, x):
        return jnp.sum(jnp.sin(layer(x)))

    value, (grad_layer, grad_x) = jax.value_and_grad(loss, argnums=(0, 1))(layer, x)

    weight = torch.tensor(np.asarray(layer.weight).transpose(3, 2, 0, 1), requires_grad=True)
    bias = None if layer.bias is None else torch.tensor(np.asarray(layer.bias), requires_grad=True)
    tx = torch.tensor(np.asarray(x).transpose(0, 3, 1, 2), requires_grad=True)
    pad = case.get("padding", 0)
    mode = case.get("padding_mode", "ZEROS").lower()
    inp = tx if mode == "zeros" else torch.nn.functional.pad(tx, (pad,) * 4, mode=mode)
    out = torch.nn.functional.conv2d(
        inp,
        weight,
        bias,
        stride=case.get("stride", 1),
        padding=pad if mode == "zeros" else 0,
        dilation=case.get("dilation", 1),
        groups=case.get("groups", 1),
    )
    ref = torch.sin(out).sum()
    ref.backward()
    close(value, ref.detach().numpy(), atol=1e-3)
    close(grad_layer.weight, weight.grad.numpy().transpose(2, 3, 1, 0), atol=1e-4)
    close(grad_x, tx.grad.numpy().transpose(0, 2, 3, 1), atol=1e-4)
    if bias is not None:
        close(grad_layer.bias, bias.grad.numpy(), atol=1e-4)


def test_channels_last_errors_name_the_layer_and_the_layout():
    conv = nn.Conv(2, 3, 4, 3, channels_last=True, key=jax.random.key(0))
    with pytest.raises(
        ValueError,
        match=r"Conv\(channels_last=True\): `x` must have shape \(\*batch, height, width, "
        r"in_channels=3\).*got shape \(2, 3, 8, 8\)",
    ):
        conv(jnp.ones((2, 3, 8, 8)))
    up = nn.ConvTranspose(1, 3, 4, 3, channels_last=True, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"ConvTranspose\(channels_last=True\): `x` must have"):
        up(jnp.ones((2, 3, 8)))
    with pytest.raises(ValueError, match=r"MaxPool\(channels_last=True\): `x` must have shape"):
        nn.MaxPool(2, 2, channels_last=True)(jnp.ones(3))
    with pytest.raises(
        ValueError,
        match=r"BatchNorm\(input_size=3, axis_name=None, channels_last=True\) takes "
        r"\(N, \*spatial, C\) with C=3 on the last axis, but got an input of shape \(2, 3, 5\)",
    ):
        tm.stateful(nn.BatchNorm(3, channels_last=True))(jnp.ones((2, 3, 5)))
    with pytest.raises(
        ValueError,
        match=r"GroupNorm\(channels_last=True\): `x` must have shape \(\*batch, height, width, "
        r"channels=6\)",
    ):
        nn.GroupNorm(3, 6, spatial_ndim=2, channels_last=True)(jnp.ones((2, 6, 5, 4)))
    with pytest.raises(ValueError, match="The channels look last: build the layer with"):
        tm.stateful(nn.BatchNorm(3))(jnp.ones((2, 5, 5, 3)))
