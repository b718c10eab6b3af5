"""Equinox's checkpoint format, layer by layer: Equinox saves and treemod (or the compat layer)
loads with the same outputs, and the reverse; the layouts that differ are converted.

The references are real Equinox's layers; the module is skipped where Equinox is not installed.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from equinox_format_helpers import (
    KEY,
    built,
    close_leaves,
    eqx_bytes,
    noisy,
    prng,
    sample,
    tm_bytes,
)

import treemod as tm
import treemod.compat.equinox as ceqx

eqx = pytest.importorskip("equinox")


# Every layer: Equinox saves, treemod loads (same outputs), and the reverse.


class Case:
    """An Equinox layer, the same architecture in treemod, and how each is called."""

    def __init__(
        self,
        make_eqx: Callable[[Any], Any],
        make_tm: Callable[[int], Any],
        x: Any,
        run_eqx: Callable[[Any, Any], Any] | None = None,
        run_tm: Callable[[Any, Any], Any] | None = None,
        stateful: bool = False,
    ) -> None:
        self.make_eqx, self.make_tm, self.x = make_eqx, make_tm, x
        self.run_eqx = run_eqx or (lambda m, x: m(x))
        self.run_tm = run_tm or (lambda m, x: m(x))
        self.stateful = stateful


T = lambda: tm.nn  # noqa: E731


def _bn_eqx(nn: Any) -> Any:
    bn, state = nn.make_with_state(nn.BatchNorm)(3, "batch", mode="ema", momentum=0.9)
    bn = noisy(bn, 5)
    # One training call, so the statistics are real.
    _, state = jax.vmap(bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(
        sample(6, 3, 4, seed=8), state
    )
    return bn, state


def _sn_eqx(nn: Any) -> Any:
    sn, state = nn.make_with_state(nn.SpectralNorm)(nn.Linear(3, 4, key=KEY), "weight", key=KEY)
    sn = noisy(sn, 6)
    _, state = sn(sample(3), state)
    return sn, state


CASES: dict[str, Case] = {
    "Linear": Case(
        lambda nn: nn.Linear(3, 4, key=KEY), lambda s: T().Linear(3, 4, key=prng(s)), sample(3)
    ),
    "Identity": Case(lambda nn: nn.Identity(), lambda s: T().Identity(), sample(3)),
    "MLP": Case(
        lambda nn: nn.MLP(2, 3, 4, 2, key=KEY),
        lambda s: T().MLP(2, 3, 4, 2, key=prng(s)),
        sample(2),
    ),
    "Sequential": Case(
        lambda nn: nn.Sequential([nn.Linear(2, 3, key=KEY), nn.Lambda(jax.nn.relu)]),
        lambda s: T().Sequential([T().Linear(2, 3, key=prng(s)), T().Lambda(jax.nn.relu)]),
        sample(2),
    ),
    "Embedding": Case(
        lambda nn: nn.Embedding(5, 3, key=KEY),
        lambda s: T().Embedding(5, 3, key=prng(s)),
        jnp.array(2),
    ),
    "LayerNorm": Case(lambda nn: noisy(nn.LayerNorm(3), 1), lambda s: T().LayerNorm(3), sample(3)),
    "GroupNorm": Case(
        lambda nn: noisy(nn.GroupNorm(2, 4), 1), lambda s: T().GroupNorm(2, 4), sample(4, 5)
    ),
    "RMSNorm": Case(lambda nn: noisy(nn.RMSNorm(3), 1), lambda s: T().RMSNorm(3), sample(3)),
    "Dropout": Case(
        lambda nn: nn.Dropout(0.3, inference=True),
        lambda s: T().Dropout(0.7),
        sample(3),
        run_eqx=lambda m, x: m(x, inference=True),
        run_tm=lambda m, x: m(x, inference=True),
    ),
    "PReLU": Case(lambda nn: nn.PReLU(0.1), lambda s: T().PReLU(0.5), sample(5)),
    "PReLU_vector": Case(
        lambda nn: nn.PReLU(jnp.array([0.1, 0.2, 0.3])),
        lambda s: T().PReLU(jnp.zeros(3)),
        sample(3),
    ),
    "GRUCell": Case(
        lambda nn: nn.GRUCell(3, 4, key=KEY),
        lambda s: T().GRUCell(3, 4, key=prng(s)),
        (sample(3), sample(4, seed=4)),
        run_eqx=lambda m, x: m(*x),
        run_tm=lambda m, x: m(*x),
    ),
    "LSTMCell": Case(
        lambda nn: nn.LSTMCell(3, 4, key=KEY),
        lambda s: T().LSTMCell(3, 4, key=prng(s)),
        (sample(3), (sample(4, seed=4), sample(4, seed=5))),
        run_eqx=lambda m, x: m(*x),
        run_tm=lambda m, x: m(*x),
    ),
    "MultiheadAttention": Case(
        lambda nn: nn.MultiheadAttention(2, 4, key=KEY),
        lambda s: T().MultiheadAttention(2, 4, key=prng(s)),
        (sample(5, 4), sample(6, 4, seed=4), sample(6, 4, seed=5)),
        run_eqx=lambda m, x: m(*x),
        run_tm=lambda m, x: m(*x),
    ),
    "RotaryPositionalEmbedding": Case(
        lambda nn: nn.RotaryPositionalEmbedding(4),
        lambda s: T().RotaryPositionalEmbedding(4),
        sample(5, 4),
    ),
    "WeightNorm": Case(
        lambda nn: nn.WeightNorm(nn.Linear(3, 4, key=KEY)),
        lambda s: T().WeightNorm(T().Linear(3, 4, key=prng(s))),
        sample(3),
    ),
    "BatchNorm": Case(
        _bn_eqx,
        lambda s: T().BatchNorm(3, momentum=0.1),
        sample(6, 3, 4, seed=9),
        run_eqx=lambda m, x: jax.vmap(
            lambda y: m[0](y, m[1], inference=True)[0], axis_name="batch"
        )(x),
        run_tm=lambda m, x: m(x, inference=True),
        stateful=True,
    ),
    "SpectralNorm": Case(
        _sn_eqx,
        lambda s: T().SpectralNorm(T().Linear(3, 4, key=prng(s)), key=prng(s + 1)),
        sample(3),
        run_eqx=lambda m, x: m[0](x, m[1], inference=True)[0],
        run_tm=lambda m, x: m(x, inference=True),
        stateful=True,
    ),
}
# Convolutions in every dimension (their kernels' layouts are converted per dimension); the
# grouped layouts, whose conversion does not depend on the dimension, in two dimensions.
for _n in (1, 2, 3):
    _sp = (5,) * _n
    CASES[f"Conv{_n}d"] = Case(
        lambda nn, n=_n: getattr(nn, f"Conv{n}d")(2, 4, 3, stride=2, padding=1, key=KEY),
        lambda s, n=_n: getattr(T(), f"Conv{n}d")(2, 4, 3, stride=2, padding=1, key=prng(s)),
        sample(2, *_sp),
    )
    CASES[f"ConvTranspose{_n}d"] = Case(
        lambda nn, n=_n: getattr(nn, f"ConvTranspose{n}d")(
            2, 4, 3, stride=2, padding=1, output_padding=1, key=KEY
        ),
        lambda s, n=_n: getattr(T(), f"ConvTranspose{n}d")(
            2, 4, 3, stride=2, padding=1, output_padding=1, key=prng(s)
        ),
        sample(2, *_sp),
    )
CASES["Conv2d_groups"] = Case(
    lambda nn: nn.Conv2d(4, 6, 2, groups=2, key=KEY),
    lambda s: T().Conv2d(4, 6, 2, groups=2, key=prng(s)),
    sample(4, 5, 5),
)
CASES["ConvTranspose2d_groups"] = Case(
    lambda nn: nn.ConvTranspose2d(4, 6, 3, dilation=2, groups=2, key=KEY),
    lambda s: T().ConvTranspose2d(4, 6, 3, dilation=2, groups=2, key=prng(s)),
    sample(4, 5, 5),
)
# Pools hold no parameters (their files hold the same leaves in every dimension): each kind
# once, the three dimensions spread over them.
for _kind, _n, _adaptive_n in (("Max", 1, 2), ("Avg", 3, 1)):
    CASES[f"{_kind}Pool{_n}d"] = Case(
        lambda nn, n=_n, kind=_kind: getattr(nn, f"{kind}Pool{n}d")(3, stride=2, padding=1),
        lambda s, n=_n, kind=_kind: getattr(T(), f"{kind}Pool{n}d")(3, stride=2, padding=1),
        sample(2, *(5,) * _n),
    )
    CASES[f"Adaptive{_kind}Pool{_adaptive_n}d"] = Case(
        lambda nn, n=_adaptive_n, kind=_kind: getattr(nn, f"Adaptive{kind}Pool{n}d")(2),
        lambda s, n=_adaptive_n, kind=_kind: getattr(T(), f"Adaptive{kind}Pool{n}d")(2),
        sample(2, *(4,) * _adaptive_n),
    )


# The layers are built by their own classes under filter_eval_shape and filled with random
# values: a layer's random initialiser compiles for each new shape (~2 s for a 3-D kernel on
# the CPU), and the values are arbitrary here anyway. A stateful layer is built as it is, for its
# statistics come from a real call.


def _eqx_model(case: Case, nn: Any, seed: int) -> Any:
    """The case's Equinox (or compat) layer with random values."""
    if case.stateful:
        return case.make_eqx(nn)
    return built(lambda: case.make_eqx(nn), seed)


def _tm_model(case: Case, seed: int) -> Any:
    """The case's treemod layer with random values."""
    if case.stateful:
        return noisy(case.make_tm(seed), seed)
    return built(lambda: case.make_tm(seed), seed)


@pytest.mark.parametrize("name", sorted(CASES))
def test_equinox_file_loads_into_treemod_layer(name: str) -> None:
    case = CASES[name]
    model = _eqx_model(case, eqx.nn, 2)
    data = eqx_bytes(model)
    loaded = ceqx.tree_deserialise_leaves(io.BytesIO(data), _tm_model(case, 10))
    close_leaves(case.run_tm(loaded, case.x), case.run_eqx(model, case.x))
    # And treemod writes back exactly the bytes it read.
    assert tm_bytes(loaded) == data


@pytest.mark.parametrize("name", sorted(CASES))
def test_equinox_file_loads_into_compat_layer(name: str) -> None:
    case = CASES[name]
    model = _eqx_model(case, eqx.nn, 2)
    data = eqx_bytes(model)
    like = _eqx_model(case, ceqx.nn, 20)
    loaded = ceqx.tree_deserialise_leaves(io.BytesIO(data), like)
    close_leaves(case.run_eqx(loaded, case.x), case.run_eqx(model, case.x))
    assert tm_bytes(loaded) == data
    # Equinox reads the compat layer's own file into its layer.
    back = eqx.tree_deserialise_leaves(io.BytesIO(tm_bytes(loaded)), _eqx_model(case, eqx.nn, 21))
    close_leaves(case.run_eqx(back, case.x), case.run_eqx(model, case.x))


@pytest.mark.parametrize("name", sorted(CASES))
def test_treemod_file_loads_into_equinox_layer(name: str) -> None:
    case = CASES[name]
    layer = _tm_model(case, 11)
    data = tm_bytes(layer)
    loaded = eqx.tree_deserialise_leaves(io.BytesIO(data), _eqx_model(case, eqx.nn, 30))
    close_leaves(case.run_eqx(loaded, case.x), case.run_tm(layer, case.x))
    assert eqx_bytes(loaded) == data


def test_channels_last_conv_converts_its_kernel() -> None:
    conv = built(lambda: eqx.nn.Conv2d(2, 4, (2, 3), key=KEY))
    x = sample(2, 5, 6)
    like = built(lambda: tm.nn.Conv(2, 2, 4, (2, 3), channels_last=True, key=prng(1)), 1)
    loaded = ceqx.tree_deserialise_leaves(io.BytesIO(eqx_bytes(conv)), like)
    close_leaves(loaded(jnp.moveaxis(x, 0, -1)), jnp.moveaxis(conv(x), 0, -1))
    assert tm_bytes(loaded) == eqx_bytes(conv)
    up = built(
        lambda: tm.nn.ConvTranspose(2, 2, 4, (2, 3), stride=2, channels_last=True, key=prng(2)), 2
    )
    ref = eqx.tree_deserialise_leaves(
        io.BytesIO(tm_bytes(up)),
        built(lambda: eqx.nn.ConvTranspose2d(2, 4, (2, 3), stride=2, key=KEY), 3),
    )
    close_leaves(up(jnp.moveaxis(x, 0, -1)), jnp.moveaxis(ref(x), 0, -1))


def test_batch_norm_before_any_training_call_loads_treemods_initial_statistics() -> None:
    bn, state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, "batch", mode="ema")
    loaded = ceqx.tree_deserialise_leaves(io.BytesIO(eqx_bytes((bn, state))), tm.nn.BatchNorm(3))
    assert tm.tree_equal(loaded, tm.nn.BatchNorm(3))


def test_batch_mode_batch_norm_loads_into_the_compat_layer() -> None:
    # Equinox's mode="batch" keeps a debiasing counter: the compat BatchNorm holds it.
    def make(nn: Any) -> Any:
        return nn.make_with_state(nn.BatchNorm)(3, "batch", mode="batch", momentum=0.9)

    bn, state = make(eqx.nn)
    bn = noisy(bn, 7)
    call = jax.vmap(bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    for seed in (1, 2):
        _, state = call(sample(6, 3, 4, seed=seed), state)
    data = eqx_bytes((bn, state))
    loaded = ceqx.tree_deserialise_leaves(io.BytesIO(data), make(ceqx.nn))
    assert tm_bytes(loaded) == data
    x = sample(6, 3, 4, seed=9)
    run = CASES["BatchNorm"].run_eqx
    close_leaves(run(loaded, x), run((bn, state), x))
    # treemod's BatchNorm holds ema-mode statistics; a batch-mode file says which layer reads it.
    with pytest.raises(tm.CheckpointError, match=r"changed dtype from bool in `like` to int32"):
        ceqx.tree_deserialise_leaves(io.BytesIO(data), tm.nn.BatchNorm(3))
