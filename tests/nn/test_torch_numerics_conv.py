"""Convolutions with a PyTorch counterpart: copy the parameters into it and compare (float32)."""

import jax
import numpy as np
import pytest

import treemod.nn as nn

from helpers import close, normal

torch = pytest.importorskip(
    "torch", reason="PyTorch (CPU) is not installed: `pip install -e '.[torch]'` to run these"
)

pytestmark = pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel")


def t(a):
    return torch.from_numpy(np.array(a, dtype=np.float32))


CONV2D_CASES = [
    dict(kernel_size=3),
    dict(kernel_size=3, stride=2),
    dict(kernel_size=(3, 2), stride=(2, 1), padding=1),
    dict(kernel_size=3, padding=(2, 0)),
    dict(kernel_size=3, padding="SAME"),
    dict(kernel_size=4, padding="SAME"),
    dict(kernel_size=3, padding="VALID", stride=2),
    dict(kernel_size=3, dilation=2, padding=2),
    dict(kernel_size=3, groups=2, padding=1),
    dict(kernel_size=1, groups=2, use_bias=False),
    dict(kernel_size=3, padding=1, padding_mode="REFLECT"),
    dict(kernel_size=3, padding=1, padding_mode="REPLICATE"),
    dict(kernel_size=3, padding=1, padding_mode="CIRCULAR"),
]


def _torch_padding(case):
    p = case.get("padding", 0)
    return p.lower() if isinstance(p, str) else p


def _copy_conv(ours, ref):
    with torch.no_grad():
        ref.weight.copy_(t(ours.weight))
        if ours.bias is not None:
            ref.bias.copy_(t(ours.bias))


@pytest.mark.parametrize("case", CONV2D_CASES, ids=str)
def test_conv2d(case):
    layer = nn.Conv2d(4, 6, key=jax.random.key(0), **case)
    ref = torch.nn.Conv2d(
        4,
        6,
        case["kernel_size"],
        stride=case.get("stride", 1),
        padding=_torch_padding(case),
        dilation=case.get("dilation", 1),
        groups=case.get("groups", 1),
        bias=case.get("use_bias", True),
        padding_mode=case.get("padding_mode", "zeros").lower(),
    )
    _copy_conv(layer, ref)
    x = normal((2, 4, 11, 9), 1)
    close(layer(x), ref(t(x)))


@pytest.mark.parametrize(
    "case",
    [
        dict(kernel_size=3),
        dict(kernel_size=5, stride=3, padding=2),
        dict(kernel_size=3, dilation=3, groups=2),
        dict(kernel_size=2, padding="SAME"),
    ],
    ids=str,
)
def test_conv1d(case):
    layer = nn.Conv1d(4, 6, key=jax.random.key(0), **case)
    ref = torch.nn.Conv1d(
        4,
        6,
        case["kernel_size"],
        stride=case.get("stride", 1),
        padding=_torch_padding(case),
        dilation=case.get("dilation", 1),
        groups=case.get("groups", 1),
    )
    _copy_conv(layer, ref)
    x = normal((3, 4, 20), 1)
    close(layer(x), ref(t(x)))


def test_conv3d():
    layer = nn.Conv3d(
        2, 4, kernel_size=(3, 2, 3), stride=(1, 2, 1), padding=1, key=jax.random.key(0)
    )
    ref = torch.nn.Conv3d(2, 4, (3, 2, 3), stride=(1, 2, 1), padding=1)
    _copy_conv(layer, ref)
    x = normal((2, 2, 5, 6, 7), 1)
    close(layer(x), ref(t(x)))


def _copy_transpose(ours, ref, groups):
    # ours: (out, in/g, *k) (Equinox layout); PyTorch: (in, out/g, *k).
    w = np.asarray(ours.weight)
    out, in_g = w.shape[:2]
    k = w.shape[2:]
    w = (
        w.reshape(groups, out // groups, in_g, *k)
        .swapaxes(1, 2)
        .reshape(groups * in_g, out // groups, *k)
    )
    with torch.no_grad():
        ref.weight.copy_(t(w))
        if ours.bias is not None:
            ref.bias.copy_(t(ours.bias))


TRANSPOSE_CASES = [
    dict(kernel_size=3),
    dict(kernel_size=4, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, output_padding=1),
    dict(kernel_size=3, dilation=2, padding=2),
    dict(kernel_size=3, stride=2, groups=2),
    dict(kernel_size=2, stride=2, use_bias=False),
]


def _check_conv_transpose(nd, case, x):
    """Our `ConvTransposeNd` against PyTorch's, same weights, on `x`."""
    layer = getattr(nn, f"ConvTranspose{nd}d")(4, 6, key=jax.random.key(0), **case)
    ref = getattr(torch.nn, f"ConvTranspose{nd}d")(
        4,
        6,
        case["kernel_size"],
        stride=case.get("stride", 1),
        padding=case.get("padding", 0),
        output_padding=case.get("output_padding", 0),
        groups=case.get("groups", 1),
        bias=case.get("use_bias", True),
        dilation=case.get("dilation", 1),
    )
    _copy_transpose(layer, ref, case.get("groups", 1))
    close(layer(x), ref(t(x)))


@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=str)
def test_conv_transpose2d(case):
    _check_conv_transpose(2, case, normal((2, 4, 7, 6), 1))


@pytest.mark.parametrize("case", TRANSPOSE_CASES[:4], ids=str)
def test_conv_transpose1d(case):
    layer = nn.ConvTranspose1d(4, 6, key=jax.random.key(0), **case)
    ref = torch.nn.ConvTranspose1d(
        4,
        6,
        case["kernel_size"],
        stride=case.get("stride", 1),
        padding=case.get("padding", 0),
        output_padding=case.get("output_padding", 0),
        dilation=case.get("dilation", 1),
    )
    _copy_transpose(layer, ref, 1)
    x = normal((3, 4, 9), 1)
    close(layer(x), ref(t(x)))


@pytest.mark.parametrize(
    "kernel_size,stride,dilation",
    [(3, 1, 1), (4, 2, 1), (3, 2, 1), (3, 2, 2), (1, 2, 1), (2, 3, 1), (5, 3, 1)],
)
@pytest.mark.parametrize("padding", ["SAME", "SAME_LOWER"])
def test_conv_transpose_same_padding_crops_torch_full_output(
    kernel_size, stride, dilation, padding
):
    """`SAME` gives `stride * L` outputs: PyTorch's unpadded output cropped (or extended with
    `output_padding`), with the odd element cropped from the high end (low for SAME_LOWER)."""
    layer = nn.ConvTranspose1d(
        4, 6, kernel_size, stride, padding, dilation=dilation, key=jax.random.key(0)
    )
    x = normal((2, 4, 7), 1)
    full_length = (7 - 1) * stride + dilation * (kernel_size - 1) + 1
    excess = full_length - 7 * stride
    ref = torch.nn.ConvTranspose1d(
        4,
        6,
        kernel_size,
        stride,
        output_padding=max(-excess, 0),
        dilation=dilation,
    )
    _copy_transpose(layer, ref, 1)
    full = ref(t(x))
    low = (max(excess, 0) + (padding == "SAME_LOWER")) // 2
    close(layer(x), full[..., low : low + 7 * stride])


def test_conv_transpose_positional_arguments_follow_torch():
    """`(in, out, kernel, stride, padding, output_padding)`, PyTorch's (and Equinox's) order."""
    layer = nn.ConvTranspose2d(4, 6, 3, 2, 1, 1, key=jax.random.key(0))
    ref = torch.nn.ConvTranspose2d(4, 6, 3, 2, 1, 1)
    _copy_transpose(layer, ref, 1)
    x = normal((2, 4, 5, 6), 1)
    assert layer(x).shape == (2, 6, 10, 12)
    close(layer(x), ref(t(x)))


@pytest.mark.parametrize("case", TRANSPOSE_CASES[:5], ids=str)
def test_conv_transpose3d(case):
    _check_conv_transpose(3, case, normal((2, 4, 4, 5, 3), 7))
