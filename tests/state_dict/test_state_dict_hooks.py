"""A user's own layer declares its PyTorch names with `tm.register_state_dict_hooks`: a layer
stored differently from its PyTorch twin (a log-parametrised scale), and a full single-layer
`torch.nn.LSTM` mirrored by a treemod loop over an `nn.LSTMCell`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from state_dict_helpers import check_both_ways

import treemod as tm
import treemod.nn as nn


class Scale(tm.Module):
    """Stores the scale; its PyTorch twin stores the scale's logarithm."""

    scale: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * self.scale[None]


class TorchScale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.log_scale = torch.nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.log_scale.exp()


def _scale_to(m: Scale) -> Mapping[str, Any]:
    return {"log_scale": jnp.log(m.scale)}


def _scale_from(m: Scale, t: Mapping[str, Any]) -> Scale:
    new: Scale = tm.tree_at(lambda m: m.scale, m, jnp.exp(t["log_scale"]))
    return new


tm.register_state_dict_hooks(Scale, to_torch=_scale_to, from_torch=_scale_from)


class TorchModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.norms = torch.nn.ModuleList([TorchScale(), TorchScale()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norms[1](self.fc(self.norms[0](x)))


class Model(tm.Module):
    fc: nn.Linear
    norms: tuple[Scale, Scale]

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.norms[1](self.fc(self.norms[0](x)))


def test_user_layer_hooks_both_ways() -> None:
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    model = Model(nn.Linear(3, 3, key=jax.random.key(0)), (Scale(jnp.ones(3)), Scale(jnp.ones(3))))
    assert set(tm.state_dict(model)) == {
        "fc.weight",
        "fc.bias",
        "norms.0.log_scale",
        "norms.1.log_scale",
    }

    def run_torch(m: torch.nn.Module) -> Any:
        with torch.no_grad():
            return m(torch.from_numpy(x))

    check_both_ways(TorchModel(), model, run_torch, lambda m: m(jnp.asarray(x)))


def test_subclasses_inherit_hooks_and_registering_again_replaces() -> None:
    class Sub(Scale):
        pass

    class Other(tm.Module):
        scale: jax.Array

    assert list(tm.state_dict(Sub(jnp.ones(2)))) == ["log_scale"]
    tm.register_state_dict_hooks(
        Other, to_torch=lambda m: {"a": m.scale}, from_torch=lambda m, t: Other(t["a"])
    )
    tm.register_state_dict_hooks(
        Other, to_torch=lambda m: {"b": m.scale}, from_torch=lambda m, t: Other(t["b"])
    )
    assert list(tm.state_dict(Other(jnp.ones(2)))) == ["b"]


def test_registration_errors() -> None:
    with pytest.raises(TypeError, match=r"`cls` must be a class, got Scale"):
        tm.register_state_dict_hooks(Scale(jnp.ones(1)), to_torch=_scale_to, from_torch=_scale_from)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"register_state_dict_hooks\(Scale\): `from_torch` must be callable"
    ):
        tm.register_state_dict_hooks(Scale, to_torch=_scale_to, from_torch=None)  # type: ignore[arg-type]


def test_a_hook_refusal_names_the_layer() -> None:
    class Picky(tm.Module):
        w: jax.Array

    def refuse(m: Picky, t: Mapping[str, Any]) -> Picky:
        raise tm.CheckpointError("w must be positive")

    tm.register_state_dict_hooks(Picky, to_torch=lambda m: {"w": m.w}, from_torch=refuse)
    with pytest.raises(tm.CheckpointError, match=r"Picky at 'layers.1': w must be positive"):
        tm.load_state_dict(
            {"layers": [None, Picky(jnp.ones(2))]}, {"layers.1.w": np.ones(2, np.float32)}
        )


class LSTM(tm.Module):
    """A single-layer `torch.nn.LSTM(batch_first=True)`: an `LSTMCell` run over the sequence."""

    cell: nn.LSTMCell

    def __call__(self, x: jax.Array) -> jax.Array:
        h = c = jnp.zeros((x.shape[0], self.cell.hidden_size))
        outputs = []
        for i in range(x.shape[1]):
            h, c = self.cell(x[:, i], (h, c))
            outputs.append(h)
        return jnp.stack(outputs, 1)


def _lstm_to(m: LSTM) -> Mapping[str, Any]:
    cell = m.cell
    return {
        "weight_ih_l0": cell.weight_ih,
        "weight_hh_l0": cell.weight_hh,
        "bias_ih_l0": cell.bias,
        "bias_hh_l0": jnp.zeros_like(cell.bias),
    }


def _lstm_from(m: LSTM, t: Mapping[str, Any]) -> LSTM:
    new = (t["weight_ih_l0"], t["weight_hh_l0"], t["bias_ih_l0"] + t["bias_hh_l0"])
    rebuilt: LSTM = tm.tree_at(lambda m: (m.cell.weight_ih, m.cell.weight_hh, m.cell.bias), m, new)
    return rebuilt


tm.register_state_dict_hooks(LSTM, to_torch=_lstm_to, from_torch=_lstm_from)


def test_full_torch_lstm_unrolled_by_a_treemod_loop() -> None:
    x = np.random.default_rng(1).standard_normal((2, 6, 5)).astype(np.float32)

    def run_torch(m: torch.nn.Module) -> Any:
        with torch.no_grad():
            return m(torch.from_numpy(x))[0]

    check_both_ways(
        torch.nn.LSTM(5, 7, batch_first=True),
        LSTM(nn.LSTMCell(5, 7, key=jax.random.key(0))),
        run_torch,
        lambda m: m(jnp.asarray(x)),
    )
