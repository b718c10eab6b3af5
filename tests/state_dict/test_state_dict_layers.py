"""Each layer with a PyTorch twin: PyTorch's `state_dict()` loads into treemod's layer with no
mapping code and gives PyTorch's outputs; `tm.state_dict` loads back into PyTorch (strict)
and gives them again."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from state_dict_helpers import check_both_ways

import treemod as tm
import treemod.nn as nn

KEY = jax.random.key(0)


def data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x)


def same_call(x: np.ndarray) -> tuple[Any, Any]:
    """Run both models on `x` (torch without gradients)."""

    def run_torch(m: torch.nn.Module) -> Any:
        with torch.no_grad():
            return m(t(x))

    def run_treemod(m: Any) -> Any:
        return m(jnp.asarray(x))

    return run_torch, run_treemod


@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias: bool) -> None:
    check_both_ways(
        torch.nn.Linear(5, 3, bias=bias),
        nn.Linear(5, 3, use_bias=bias, key=KEY),
        *same_call(data(2, 5)),
    )


def test_embedding() -> None:
    ids = np.array([[0, 3, 9], [2, 2, 1]])
    check_both_ways(
        torch.nn.Embedding(10, 4),
        nn.Embedding(10, 4, key=KEY),
        lambda m: m(torch.from_numpy(ids)),
        lambda m: m(jnp.asarray(ids)),
    )


CONV_CASES = [
    (1, dict(kernel_size=3, padding=1), False),
    (2, dict(kernel_size=(3, 2), stride=2), False),
    (2, dict(kernel_size=3, groups=2, padding=1), False),
    (2, dict(kernel_size=3, groups=2, padding=1), True),
    (3, dict(kernel_size=2), False),
]


@pytest.mark.parametrize(("n", "kw", "channels_last"), CONV_CASES)
def test_conv(n: int, kw: dict[str, Any], channels_last: bool) -> None:
    ref = [torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d][n - 1](4, 6, **kw)
    ours = nn.Conv(n, 4, 6, **kw, key=KEY, channels_last=channels_last)
    x = data(2, 4, *([5] * n))
    axes = (0, *range(2, n + 2), 1)

    def run_treemod(m: Any) -> Any:
        if not channels_last:
            return m(jnp.asarray(x))
        return jnp.moveaxis(m(jnp.asarray(x.transpose(axes))), -1, 1)

    check_both_ways(ref, ours, same_call(x)[0], run_treemod)


CONV_TRANSPOSE_CASES = [
    (1, dict(kernel_size=3, stride=2), False),
    (2, dict(kernel_size=3, stride=2, padding=1, output_padding=1), False),
    (2, dict(kernel_size=(3, 2), stride=2, groups=2), False),
    (2, dict(kernel_size=3, stride=2, groups=2, padding=1), True),
    (3, dict(kernel_size=2, stride=2), False),
]


@pytest.mark.parametrize(("n", "kw", "channels_last"), CONV_TRANSPOSE_CASES)
def test_conv_transpose(n: int, kw: dict[str, Any], channels_last: bool) -> None:
    classes = [torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d]
    ref = classes[n - 1](4, 6, **kw)
    ours = nn.ConvTranspose(n, 4, 6, **kw, key=KEY, channels_last=channels_last)
    x = data(2, 4, *([4] * n))
    axes = (0, *range(2, n + 2), 1)

    def run_treemod(m: Any) -> Any:
        if not channels_last:
            return m(jnp.asarray(x))
        return jnp.moveaxis(m(jnp.asarray(x.transpose(axes))), -1, 1)

    check_both_ways(ref, ours, same_call(x)[0], run_treemod)


@pytest.mark.parametrize(("n", "affine"), [(1, True), (2, True), (2, False)])
def test_batch_norm_running_statistics(n: int, affine: bool) -> None:
    """PyTorch's running statistics (after two training steps) and its count load into
    treemod's `State`; in inference mode both give the same outputs, and back."""
    ref = [torch.nn.BatchNorm1d, torch.nn.BatchNorm2d][n - 1](3, affine=affine)
    ref.train()
    with torch.no_grad():
        for seed in (1, 2):
            ref(t(data(8, 3, *([4] * n), seed=seed)) * 3 + 1)
    assert int(ref.num_batches_tracked) == 2
    x = data(5, 3, *([4] * n))
    loaded = check_both_ways(
        ref,
        nn.BatchNorm(3, channelwise_affine=affine, inference=True),
        *same_call(x),
    )
    np.testing.assert_array_equal(np.asarray(loaded.running_var.value), ref.running_var.numpy())
    exported = tm.state_dict(loaded)
    assert exported["num_batches_tracked"].dtype == np.int64
    assert exported["num_batches_tracked"].shape == ()
    np.testing.assert_array_equal(exported["running_mean"], ref.running_mean.numpy())


def test_layer_norm_group_norm_rms_norm() -> None:
    x = data(2, 6, 4, 5)
    check_both_ways(torch.nn.LayerNorm((4, 5)), nn.LayerNorm((4, 5)), *same_call(x))
    check_both_ways(torch.nn.GroupNorm(3, 6), nn.GroupNorm(3, 6, spatial_ndim=2), *same_call(x))
    check_both_ways(
        torch.nn.RMSNorm(5, eps=1e-6), nn.RMSNorm(5, eps=1e-6, use_bias=False), *same_call(x)
    )


@pytest.mark.parametrize("num", [1, 4])
def test_prelu(num: int) -> None:
    check_both_ways(torch.nn.PReLU(num), nn.PReLU(jnp.full((num,), 0.25)), *same_call(data(3, 4)))


def _mha_runs(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[Any, Any]:
    def run_torch(m: torch.nn.Module) -> Any:
        with torch.no_grad():
            return m(t(q), t(k), t(v), need_weights=False)[0]

    return run_torch, lambda m: m(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))


@pytest.mark.parametrize("bias", [True, False])
def test_multihead_attention_packed(bias: bool) -> None:
    """Equal query, key and value sizes: PyTorch packs `in_proj_weight` (and `in_proj_bias`)."""
    ref = torch.nn.MultiheadAttention(8, 2, bias=bias, batch_first=True)
    ours = nn.MultiheadAttention(
        2,
        8,
        use_query_bias=bias,
        use_key_bias=bias,
        use_value_bias=bias,
        use_output_bias=bias,
        key=KEY,
    )
    q, kv = data(2, 3, 8, seed=1), data(2, 5, 8, seed=2)
    check_both_ways(ref, ours, *_mha_runs(q, kv, kv))
    assert "in_proj_weight" in tm.state_dict(ours)


def test_multihead_attention_separate_key_value_sizes() -> None:
    """`kdim`/`vdim` differ from `embed_dim`: `q_proj_weight`, `k_proj_weight`,
    `v_proj_weight` and a packed `in_proj_bias`."""
    ref = torch.nn.MultiheadAttention(8, 2, kdim=6, vdim=5, batch_first=True)
    ours = nn.MultiheadAttention(
        2,
        8,
        6,
        5,
        use_query_bias=True,
        use_key_bias=True,
        use_value_bias=True,
        use_output_bias=True,
        key=KEY,
    )
    check_both_ways(ref, ours, *_mha_runs(data(2, 3, 8), data(2, 4, 6), data(2, 4, 5)))
    assert {"q_proj_weight", "k_proj_weight", "v_proj_weight"} <= set(tm.state_dict(ours))


@pytest.mark.parametrize("bias", [True, False])
def test_lstm_cell(bias: bool) -> None:
    x, h, c = data(3, 5, seed=1), data(3, 7, seed=2), data(3, 7, seed=3)

    def run_torch(m: torch.nn.Module) -> Any:
        with torch.no_grad():
            return torch.cat(m(t(x), (t(h), t(c))), -1)

    def run_treemod(m: Any) -> Any:
        return jnp.concatenate(m(jnp.asarray(x), (jnp.asarray(h), jnp.asarray(c))), -1)

    check_both_ways(
        torch.nn.LSTMCell(5, 7, bias=bias),
        nn.LSTMCell(5, 7, use_bias=bias, key=KEY),
        run_torch,
        run_treemod,
    )


@pytest.mark.parametrize("bias", [True, False])
def test_gru_cell(bias: bool) -> None:
    x, h = data(3, 5, seed=1), data(3, 7, seed=2)

    def run_torch(m: torch.nn.Module) -> Any:
        with torch.no_grad():
            return m(t(x), t(h))

    check_both_ways(
        torch.nn.GRUCell(5, 7, bias=bias),
        nn.GRUCell(5, 7, use_bias=bias, key=KEY),
        run_torch,
        lambda m: m(jnp.asarray(x), jnp.asarray(h)),
    )


def test_gru_cell_biases_exact_both_ways() -> None:
    """The `n` gate's `bias_hh` stays apart (it is multiplied by `r`): PyTorch's biases come
    back exactly where treemod can hold them, and the `r, z` sums are PyTorch's sums."""
    ref = torch.nn.GRUCell(5, 7)
    loaded = tm.load_state_dict(nn.GRUCell(5, 7, key=KEY), ref.state_dict())
    b_ih, b_hh = ref.bias_ih.detach().numpy(), ref.bias_hh.detach().numpy()
    np.testing.assert_array_equal(np.asarray(loaded.bias_n), b_hh[14:])
    np.testing.assert_array_equal(np.asarray(loaded.bias)[14:], b_ih[14:])
    np.testing.assert_array_equal(np.asarray(loaded.bias)[:14], b_ih[:14] + b_hh[:14])


@pytest.mark.parametrize(
    ("make_ref", "make_ours", "shape"),
    [
        (lambda: torch.nn.Linear(5, 3), lambda: nn.Linear(5, 3, key=KEY), (2, 5)),
        (
            lambda: torch.nn.Conv2d(3, 4, 3),
            lambda: nn.Conv2d(3, 4, 3, key=KEY),
            (2, 3, 5, 5),
        ),
    ],
)
def test_weight_norm(make_ref: Any, make_ours: Any, shape: tuple[int, ...]) -> None:
    ref = torch.nn.utils.parametrizations.weight_norm(make_ref())
    check_both_ways(ref, nn.WeightNorm(make_ours()), *same_call(data(*shape)))


def test_weight_norm_over_the_whole_weight() -> None:
    """`axis=None` (PyTorch's `dim=None`): one norm, which PyTorch keeps as a scalar."""
    ref = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(5, 3), dim=None)
    assert ref.parametrizations.weight.original0.shape == ()
    ours = nn.WeightNorm(nn.Linear(5, 3, key=KEY), axis=None)
    check_both_ways(ref, ours, *same_call(data(2, 5)))


def test_spectral_norm_inference() -> None:
    """In inference mode both use the stored singular-vector estimates `_u`, `_v`."""
    ref = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(5, 4))
    ref.train()
    with torch.no_grad():
        ref(t(data(2, 5)))  # one power iteration: estimates that differ from the start
    ours = nn.SpectralNorm(nn.Linear(5, 4, key=KEY), inference=True, key=KEY)
    check_both_ways(ref, ours, *same_call(data(3, 5, seed=4)))
