"""`GroupNorm` without `spatial_ndim` takes one example; a batch given to it is refused with a
message that says how it read the input and what `spatial_ndim=` to pass. Values against
PyTorch's `nn.GroupNorm`, which takes `(N, C, *)`."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from treemod import nn

torch = pytest.importorskip("torch")


def _torch_group_norm(x: np.ndarray, groups: int, channels: int) -> np.ndarray:
    out = torch.nn.GroupNorm(groups, channels)(torch.from_numpy(x))
    return out.detach().numpy()


@pytest.mark.parametrize(
    "shape, read, spatial_ndim, batch, example",
    [
        ((2, 4, 5), "one 2-d example with 2 channels", 1, (2,), (4, 5)),
        ((8, 4, 5, 5), "one 3-d example with 8 channels", 2, (8,), (4, 5, 5)),
        ((3, 2, 4, 6), "one 3-d example with 3 channels", 1, (3, 2), (4, 6)),
    ],
)
def test_a_batch_without_spatial_ndim_says_what_to_pass(
    shape: tuple[int, ...],
    read: str,
    spatial_ndim: int,
    batch: tuple[int, ...],
    example: tuple[int, ...],
) -> None:
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    with pytest.raises(ValueError) as e:
        nn.GroupNorm(2, 4)(jnp.asarray(x))
    msg = str(e.value)
    assert msg.startswith("GroupNorm: without `spatial_ndim`, the input is one example"), msg
    assert f"got shape {shape}, read as {read}" in msg
    assert "pass `spatial_ndim=`" in msg and "PyTorch's GroupNorm takes (N, C, *)" in msg
    assert f"GroupNorm(2, 4, spatial_ndim={spatial_ndim}) reads {shape} as a batch {batch}" in msg
    assert f"of examples of shape {example}" in msg
    # The suggestion works, and computes what PyTorch's GroupNorm computes on (N, C, *).
    ours = nn.GroupNorm(2, 4, spatial_ndim=spatial_ndim)(jnp.asarray(x))
    flat = x.reshape((-1, *example))
    theirs = _torch_group_norm(flat, 2, 4).reshape(shape)
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-5, atol=1e-5)


def test_no_axis_with_the_channels() -> None:
    with pytest.raises(ValueError, match=r"no axis of \(2, 3, 5\) has the 4 channels"):
        nn.GroupNorm(2, 4)(jnp.ones((2, 3, 5)))


def test_a_batch_cannot_be_told_from_one_example() -> None:
    # Why GroupNorm cannot follow PyTorch's (N, C, *) without `spatial_ndim`: (4, 4, 5) is one
    # example (channels=4, 4, 5) or a batch of 4 examples (4, 5), and the two differ.
    x = np.random.default_rng(1).normal(size=(4, 4, 5)).astype(np.float32)
    one = nn.GroupNorm(2, 4)(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(one), _torch_group_norm(x[None], 2, 4)[0], atol=1e-5)
    batch = nn.GroupNorm(2, 4, spatial_ndim=1)(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(batch), _torch_group_norm(x, 2, 4), atol=1e-5)
    assert not np.allclose(np.asarray(one), np.asarray(batch), atol=1e-3)


def test_channels_last_keeps_the_shape_message() -> None:
    with pytest.raises(ValueError, match=r"GroupNorm\(channels_last=True\): `x` must have shape"):
        nn.GroupNorm(2, 4, channels_last=True)(jnp.ones((2, 5, 3)))
