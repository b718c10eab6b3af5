"""Pools against PyTorch's (float32): fixed, dilated, adaptive and general pools in both layouts."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod.nn as nn

from helpers import close, normal

torch = pytest.importorskip(
    "torch", reason="PyTorch (CPU) is not installed: `pip install -e '.[torch]'` to run these"
)


def t(a):
    return torch.from_numpy(np.array(a, dtype=np.float32))


POOL_CASES = [
    dict(kernel_size=2, stride=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=1),
    dict(kernel_size=3, stride=2, use_ceil=True),
    dict(kernel_size=2, stride=2, padding=1, use_ceil=True),
]


def _torch_pool_kwargs(case):
    kwargs = dict(
        kernel_size=case["kernel_size"],
        stride=case["stride"],
        padding=case.get("padding", 0),
        ceil_mode=case.get("use_ceil", False),
    )
    return kwargs | ({"dilation": case["dilation"]} if "dilation" in case else {})


@pytest.mark.parametrize("case", POOL_CASES, ids=str)
def test_pools_2d(case):
    x = normal((2, 3, 10, 9), 1)
    close(nn.MaxPool2d(**case)(x), torch.nn.MaxPool2d(**_torch_pool_kwargs(case))(t(x)))
    close(nn.AvgPool2d(**case)(x), torch.nn.AvgPool2d(**_torch_pool_kwargs(case))(t(x)))


@pytest.mark.parametrize("case", POOL_CASES, ids=str)
def test_pools_1d(case):
    x = normal((2, 3, 11), 2)
    close(nn.MaxPool1d(**case)(x), torch.nn.MaxPool1d(**_torch_pool_kwargs(case))(t(x)))
    close(nn.AvgPool1d(**case)(x), torch.nn.AvgPool1d(**_torch_pool_kwargs(case))(t(x)))


DILATED_POOL_CASES = [
    {"kernel_size": 3, "stride": 2, "dilation": 2},
    {"kernel_size": (2, 3), "stride": 1, "padding": 1, "dilation": (3, 1)},
    {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2, "use_ceil": True},
]


@pytest.mark.parametrize("case", DILATED_POOL_CASES, ids=str)
def test_dilated_max_pools(case):
    x = normal((2, 3, 11, 10), 3)
    theirs = torch.nn.MaxPool2d(**_torch_pool_kwargs(case))(t(x))
    close(nn.MaxPool2d(**case)(x), theirs)
    close(nn.MaxPool(2, **case, channels_last=True)(jnp.moveaxis(x, 1, -1)), theirs.movedim(1, -1))
    one = {k: v if isinstance(v, int) else v[0] for k, v in case.items()}
    close(
        nn.MaxPool1d(**one)(x[..., 0]), torch.nn.MaxPool1d(**_torch_pool_kwargs(one))(t(x[..., 0]))
    )


@pytest.mark.parametrize(
    "size,target", [((7, 5), (3, 2)), ((8, 8), (4, 4)), ((5, 9), (1, 1)), ((4, 6), (4, 7))]
)
def test_adaptive_avg_pool(size, target):
    x = normal((2, 3, *size), 3)
    close(nn.AdaptiveAvgPool2d(target)(x), torch.nn.AdaptiveAvgPool2d(target)(t(x)))
    close(
        nn.AdaptiveAvgPool1d(target[0])(x[..., 0]),
        torch.nn.AdaptiveAvgPool1d(target[0])(t(x[..., 0])),
    )


@pytest.mark.parametrize("case", POOL_CASES, ids=str)
def test_pools_3d(case):
    x = normal((2, 3, 7, 6, 5), 4)
    close(nn.MaxPool3d(**case)(x), torch.nn.MaxPool3d(**_torch_pool_kwargs(case))(t(x)))
    close(nn.AvgPool3d(**case)(x), torch.nn.AvgPool3d(**_torch_pool_kwargs(case))(t(x)))


@pytest.mark.parametrize(
    "size,target",
    [
        ((7, 5, 4), (3, 2, 2)),
        ((8, 8, 8), (4, 4, 1)),
        ((5, 9, 3), (1, 1, 1)),
        ((4, 6, 3), (4, 7, 5)),
    ],
)
def test_adaptive_pools(size, target):
    x = normal((2, 3, *size), 5)
    cases = [
        (d, cut, kind) for d, cut in ((3, ()), (2, (0,)), (1, (0, 0))) for kind in ("Avg", "Max")
    ]

    @jax.jit  # the six pools in one program: one compilation, not one per pool
    def pools(x):
        return [
            getattr(nn, f"Adaptive{kind}Pool{d}d")(target[:d])(x[(..., *cut)] if cut else x)
            for d, cut, kind in cases
        ]

    for ours, (d, cut, kind) in zip(pools(x), cases, strict=True):
        theirs = getattr(torch.nn, f"Adaptive{kind}Pool{d}d")(target[:d])
        close(ours, theirs(t(x[(..., *cut)] if cut else x)))


def test_adaptive_max_pool_gradient_matches_torch():
    x = normal((2, 3, 7, 5), 6)
    pool = nn.AdaptiveMaxPool2d((3, 2))
    grad = jax.grad(lambda x: jnp.sum(pool(x) * jnp.arange(6.0).reshape(1, 1, 3, 2)))(x)
    xt = t(x).requires_grad_()
    (torch.nn.AdaptiveMaxPool2d((3, 2))(xt) * torch.arange(6.0).reshape(3, 2)).sum().backward()
    close(grad, xt.grad)


def _last(x):
    return jnp.moveaxis(x, 1, -1)


@partial(jax.jit, static_argnums=(2, 3))
def _adaptive_pools(x, last, goal, d):
    """The general adaptive pools (mean, max, min) in both layouts and the channels-last
    AdaptiveAvgPool/AdaptiveMaxPool, as one program: one compilation, not one per pool."""
    ops = (jnp.mean, jnp.max, jnp.min)
    general = [nn.AdaptivePool(goal, d, op)(x) for op in ops]
    general_last = [nn.AdaptivePool(goal, d, op, channels_last=True)(last) for op in ops]
    avg_last = nn.AdaptiveAvgPool(goal, d, channels_last=True)(last)
    max_last = nn.AdaptiveMaxPool(goal, d, channels_last=True)(last)
    return general, general_last, avg_last, max_last


@pytest.mark.parametrize("size,target", [((7, 5, 4), (3, 2, 2)), ((4, 6, 3), (4, 7, 5))])
def test_general_and_channels_last_adaptive_pools_match_torch(size, target):
    x = normal((2, 3, *size), 7)
    for d, cut in ((3, ()), (2, (0,)), (1, (0, 0))):
        xd = x[(..., *cut)] if cut else x
        goal = target[:d]
        avg = getattr(torch.nn, f"AdaptiveAvgPool{d}d")
        big = getattr(torch.nn, f"AdaptiveMaxPool{d}d")
        mean, top = avg(goal)(t(xd)), big(goal)(t(xd))
        bottom = -big(goal)(-t(xd))
        general, general_last, avg_last, max_last = _adaptive_pools(xd, _last(xd), goal, d)
        for ours, ours_last, theirs in zip(general, general_last, (mean, top, bottom), strict=True):
            close(ours, theirs)
            close(ours_last, theirs.movedim(1, -1))
        close(avg_last, mean.movedim(1, -1))
        close(max_last, top.movedim(1, -1))


def test_general_pool_matches_torch_in_both_layouts():
    x = normal((2, 3, 9, 8), 8)
    smallest = nn.Pool(jnp.inf, jax.lax.min, 2, kernel_size=3, stride=2, padding=1, use_ceil=True)
    theirs = -torch.nn.functional.max_pool2d(-t(x), 3, 2, padding=1, ceil_mode=True)
    close(smallest(x), theirs)
    total = nn.Pool(0, jax.lax.add, 2, kernel_size=(3, 2), stride=(2, 1), padding=(1, 0))
    theirs = torch.nn.functional.avg_pool2d(t(x), (3, 2), (2, 1), padding=(1, 0)) * 6
    close(total(x), theirs)
    total = nn.Pool(0, jax.lax.add, 2, (3, 2), (2, 1), (1, 0), channels_last=True)
    close(total(_last(x)), theirs.movedim(1, -1))
