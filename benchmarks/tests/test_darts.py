"""The DARTS supernet workloads: every library's model has the parameter count of the same
search network built in PyTorch (the structure of Liu et al.'s `model_search.py`)."""

from __future__ import annotations

import equinox as eqx
import jax
import pytest
from torch import nn

import treemod as tm
from benchmarks.workloads import darts_equinox, darts_jax, darts_treemod
from benchmarks.workloads.common import count_params
from benchmarks.workloads.darts_spec import DartsConfig, expected_params

CONFIGS = [DartsConfig.tiny(), DartsConfig.small(), DartsConfig(channels=8, cells=4)]


def _rcb(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(
        nn.ReLU(), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout, affine=False)
    )


class _FactorizedReduce(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout // 2, 1, 2, bias=False)
        self.c2 = nn.Conv2d(cin, cout // 2, 1, 2, bias=False)
        self.bn = nn.BatchNorm2d(cout, affine=False)


def _sep(c: int, k: int, s: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(c, c, k, s, k // 2, groups=c, bias=False), nn.Conv2d(c, c, 1, bias=False),
        nn.BatchNorm2d(c, affine=False), nn.Conv2d(c, c, k, 1, k // 2, groups=c, bias=False),
        nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c, affine=False),
    )  # fmt: skip


def _dil(c: int, k: int, s: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(c, c, k, s, k - 1, 2, groups=c, bias=False), nn.Conv2d(c, c, 1, bias=False),
        nn.BatchNorm2d(c, affine=False),
    )  # fmt: skip


def _mixed(c: int, s: int) -> nn.Module:
    ops = [nn.Sequential(nn.MaxPool2d(3, s, 1), nn.BatchNorm2d(c, affine=False)),
           nn.Sequential(nn.AvgPool2d(3, s, 1), nn.BatchNorm2d(c, affine=False)),
           nn.Identity() if s == 1 else _FactorizedReduce(c, c),
           _sep(c, 3, s), _sep(c, 5, s), _dil(c, 3, s), _dil(c, 5, s)]  # fmt: skip
    return nn.ModuleList(ops)


def _torch_supernet(cfg: DartsConfig) -> nn.Module:
    c_curr = 3 * cfg.channels
    layers: list[nn.Module] = [
        nn.Conv2d(3, c_curr, 3, padding=1, bias=False),
        nn.BatchNorm2d(c_curr),
    ]
    c_pp, c_p, c, reduction_prev = c_curr, c_curr, cfg.channels, False
    for i in range(cfg.cells):
        reduction = i in (cfg.cells // 3, 2 * cfg.cells // 3)
        c = 2 * c if reduction else c
        layers.append(_FactorizedReduce(c_pp, c) if reduction_prev else _rcb(c_pp, c))
        layers.append(_rcb(c_p, c))
        for node in range(4):
            for j in range(2 + node):
                layers.append(_mixed(c, 2 if reduction and j < 2 else 1))
        reduction_prev = reduction
        c_pp, c_p = c_p, 4 * c
    layers.append(nn.Linear(c_p, cfg.classes))
    return nn.ModuleList(layers)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"C{c.channels}x{c.cells}")
def test_supernet_parameter_counts_match_pytorch(cfg: DartsConfig) -> None:
    reference = sum(p.numel() for p in _torch_supernet(cfg).parameters())
    assert expected_params(cfg) == reference
    params, _, _ = jax.eval_shape(lambda k: darts_jax.init(k, cfg), jax.random.key(0))
    assert count_params(params) == reference
    model = tm.filter_eval_shape(lambda k: darts_treemod.Network(cfg, key=k), jax.random.key(0))
    assert count_params(tm.filter(model, tm.is_param)) == reference
    make = eqx.nn.make_with_state(darts_equinox.Network)
    model, _ = eqx.filter_eval_shape(make, cfg, key=jax.random.key(0))
    assert count_params(model) == reference  # the running statistics are in the state


def test_small_config_is_the_issues_136k_weights() -> None:
    assert expected_params(DartsConfig.small()) == 136182


@pytest.mark.slow  # NNX builds its module graph slowly, even under eval_shape
@pytest.mark.parametrize("cfg", CONFIGS[:1], ids=lambda c: f"C{c.channels}x{c.cells}")
def test_nnx_supernet_parameter_count_matches_pytorch(cfg: DartsConfig) -> None:
    # Flax is one of the benchmarks' optional peers (the `bench` extra), not a test reference:
    # `make test` does not install it, as for the suite's other Flax and Haiku workloads.
    nnx = pytest.importorskip("flax.nnx", reason="flax is not installed (`make bench`)")

    from benchmarks.workloads import darts_nnx

    model = nnx.eval_shape(lambda: darts_nnx.Network(cfg, nnx.Rngs(0)))
    params = nnx.state(model, nnx.Param)
    assert count_params(params) == sum(p.numel() for p in _torch_supernet(cfg).parameters())
