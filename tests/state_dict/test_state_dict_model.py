"""A PyTorch model written for the test with every layer that has a treemod twin, in every
container (Sequential, ModuleList as a list and as a Stack, ModuleDict as a dict), and its
treemod mirror: the trained PyTorch model's state dict loads with no mapping code and gives
PyTorch's outputs, and `tm.state_dict` loads back into PyTorch (strict) and gives them again.
Also: tied weights through `nn.Shared`, and a safetensors file as the source."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
from state_dict_helpers import assert_close, check_both_ways

import treemod as tm
import treemod.nn as nn

D = 16


class TorchBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(D)
        self.attn = torch.nn.MultiheadAttention(D, 2, batch_first=True)
        self.mlp = torch.nn.Linear(D, D)
        self.norm = torch.nn.RMSNorm(D, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return self.norm(x + F.gelu(self.mlp(x)))


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.PReLU(),
            torch.nn.ConvTranspose2d(8, 4, 2, stride=2),
            torch.nn.GroupNorm(2, 4),
        )
        self.volume = torch.nn.ModuleDict(
            {"conv": torch.nn.Conv3d(2, 2, 2), "up": torch.nn.ConvTranspose3d(2, 2, 2)}
        )
        self.embed = torch.nn.Embedding(20, D)
        self.blocks = torch.nn.ModuleList([TorchBlock(), TorchBlock()])
        self.convs = torch.nn.ModuleDict(
            {"a": torch.nn.Conv1d(D, 4, 3), "b": torch.nn.ConvTranspose1d(4, 2, 3)}
        )
        self.lstm = torch.nn.LSTMCell(D, D)
        self.gru = torch.nn.GRUCell(D, D)
        self.bn = torch.nn.BatchNorm1d(D)
        self.wn = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(D, 8))
        self.sn = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(8, 4))
        self.heads = torch.nn.ModuleList([torch.nn.Linear(4, 2), torch.nn.Linear(4, 3)])

    def forward(self, img: Any, vol: Any, tokens: Any) -> torch.Tensor:
        a = self.features(img).mean((2, 3))
        v = self.volume["up"](self.volume["conv"](vol)).mean((2, 3, 4))
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        s = self.convs["b"](self.convs["a"](x.transpose(1, 2))).mean(2)
        h = c = torch.zeros(x.shape[0], D)
        for i in range(x.shape[1]):
            h, c = self.lstm(x[:, i], (h, c))
        g = h
        for i in range(x.shape[1]):
            g = self.gru(x[:, i], g)
        y = self.sn(self.wn(self.bn(g)))
        return torch.cat([a, v, s, *(head(y) for head in self.heads)], 1)


class Block(tm.Module):
    ln: nn.LayerNorm
    attn: nn.MultiheadAttention
    mlp: nn.Linear
    norm: nn.RMSNorm

    def __init__(self, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.ln = nn.LayerNorm(D)
        bias = dict(use_query_bias=True, use_key_bias=True, use_value_bias=True)
        self.attn = nn.MultiheadAttention(2, D, **bias, use_output_bias=True, key=k1)
        self.mlp = nn.Linear(D, D, key=k2)
        self.norm = nn.RMSNorm(D, eps=1e-6, use_bias=False)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.ln(x)
        x = x + self.attn(h, h, h)
        return self.norm(x + jax.nn.gelu(self.mlp(x), approximate=False))


class Net(tm.Module):
    """The mirror: attribute names are PyTorch's; a ModuleList of blocks is a `Stack`."""

    features: nn.Sequential
    volume: dict[str, Any]
    embed: nn.Embedding
    blocks: nn.Stack
    convs: dict[str, Any]
    lstm: nn.LSTMCell
    gru: nn.GRUCell
    bn: nn.BatchNorm
    wn: nn.WeightNorm[nn.Linear]
    sn: nn.SpectralNorm[nn.Linear]
    heads: list[nn.Linear]

    def __init__(self, key: jax.Array) -> None:
        k = iter(jax.random.split(key, 16))
        self.features = nn.Sequential(
            [
                nn.Conv2d(3, 8, 3, padding=1, key=next(k)),
                nn.BatchNorm(8),
                nn.PReLU(),
                nn.ConvTranspose2d(8, 4, 2, stride=2, key=next(k)),
                nn.GroupNorm(2, 4, spatial_ndim=2),
            ]
        )
        self.volume = {
            "conv": nn.Conv3d(2, 2, 2, key=next(k)),
            "up": nn.ConvTranspose3d(2, 2, 2, key=next(k)),
        }
        self.embed = nn.Embedding(20, D, key=next(k))
        self.blocks = nn.Stack(Block, 2, key=next(k))
        self.convs = {
            "a": nn.Conv1d(D, 4, 3, key=next(k)),
            "b": nn.ConvTranspose1d(4, 2, 3, key=next(k)),
        }
        self.lstm = nn.LSTMCell(D, D, key=next(k))
        self.gru = nn.GRUCell(D, D, key=next(k))
        self.bn = nn.BatchNorm(D)
        self.wn = nn.WeightNorm(nn.Linear(D, 8, key=next(k)))
        self.sn = nn.SpectralNorm(nn.Linear(8, 4, key=next(k)), key=next(k))
        self.heads = [nn.Linear(4, 2, key=next(k)), nn.Linear(4, 3, key=next(k))]

    def __call__(self, img: Any, vol: Any, tokens: Any) -> jax.Array:
        a = self.features(img).mean((2, 3))
        v = self.volume["up"](self.volume["conv"](vol)).mean((2, 3, 4))
        x = self.blocks(self.embed(tokens))
        s = self.convs["b"](self.convs["a"](jnp.swapaxes(x, 1, 2))).mean(2)
        h = c = jnp.zeros((x.shape[0], D))
        for i in range(x.shape[1]):
            h, c = self.lstm(x[:, i], (h, c))
        g = h
        for i in range(x.shape[1]):
            g = self.gru(x[:, i], g)
        y = self.sn(self.wn(self.bn(g)))
        return jnp.concatenate([a, v, s, *(head(y) for head in self.heads)], 1)


def _inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    img = rng.standard_normal((3, 3, 6, 6)).astype(np.float32)
    vol = rng.standard_normal((3, 2, 4, 4, 4)).astype(np.float32)
    tokens = rng.integers(0, 20, (3, 5))
    return img, vol, tokens


@pytest.fixture(scope="module")
def trained_torch_net() -> TorchNet:
    """Two training steps: BatchNorm statistics and counts, spectral-norm estimates move."""
    torch.manual_seed(0)
    net = TorchNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    img, vol, tokens = (torch.from_numpy(a) for a in _inputs())
    for _ in range(2):
        opt.zero_grad()
        net(img, vol, tokens).square().mean().backward()
        opt.step()
    assert int(net.bn.num_batches_tracked) == 2
    return net


def _runs() -> tuple[Any, Any]:
    img, vol, tokens = _inputs()

    def run_torch(m: torch.nn.Module) -> Any:
        with torch.no_grad():
            return m(*(torch.from_numpy(a) for a in (img, vol, tokens)))

    @tm.filter_jit
    def run_treemod(m: Any) -> Any:
        return nn.inference_mode(m)(jnp.asarray(img), jnp.asarray(vol), jnp.asarray(tokens))

    return run_torch, run_treemod


def test_every_layer_loads_and_exports(trained_torch_net: TorchNet) -> None:
    """Into an abstract mirror (`filter_eval_shape`: no initialisation run), so the strict
    load must fill every array."""
    ours = tm.filter_eval_shape(Net, jax.random.key(0))
    loaded = check_both_ways(trained_torch_net, ours, *_runs())
    assert list(tm.state_dict(loaded)) == list(trained_torch_net.state_dict())
    np.testing.assert_array_equal(
        np.asarray(loaded.features.layers[1].running_mean.value),
        trained_torch_net.features[1].running_mean.numpy(),
    )
    stacked = np.asarray(loaded.blocks.layers.mlp.weight)
    for i in range(2):
        np.testing.assert_array_equal(
            stacked[i], trained_torch_net.blocks[i].mlp.weight.detach().numpy()
        )


def test_every_layer_from_a_safetensors_file(trained_torch_net: TorchNet, tmp_path: Any) -> None:
    """A `.safetensors` file (safetensors' own torch writer) loads like the dict: lazily, per
    tensor, without torch in the reading path."""
    path = tmp_path / "net.safetensors"
    safetensors.torch.save_file(trained_torch_net.state_dict(), path)
    run_torch, run_treemod = _runs()
    trained_torch_net.eval()
    loaded = tm.load_state_dict(tm.filter_eval_shape(Net, jax.random.key(1)), path)
    assert_close(run_treemod(loaded), run_torch(trained_torch_net))


class TorchTied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: Any) -> torch.Tensor:
        return self.head(self.embed(ids))


class Tied(tm.Module):
    embed: nn.Embedding
    head: nn.Linear

    def __call__(self, ids: Any) -> jax.Array:
        return self.head(self.embed(ids))


def _tied() -> nn.Shared:
    k1, k2 = jax.random.split(jax.random.key(0))
    net = Tied(nn.Embedding(10, 4, key=k1), nn.Linear(4, 10, use_bias=False, key=k2))
    return nn.Shared(net, lambda n: n.head.weight, lambda n: n.embed.weight)


def test_tied_weights_through_shared() -> None:
    """`nn.Shared` adds no name: the tied tensor is written under both names, as PyTorch does,
    and loads into the one stored copy."""
    ids = np.array([[1, 2, 3]])
    ref = TorchTied()
    loaded = check_both_ways(
        ref,
        _tied(),
        lambda m: m(torch.from_numpy(ids)),
        lambda m: m()(jnp.asarray(ids)),
    )
    assert loaded.pytree.head.weight is None  # still one stored copy
    np.testing.assert_array_equal(
        np.asarray(loaded.pytree.embed.weight), ref.embed.weight.detach().numpy()
    )


def test_tied_weights_that_differ_are_refused() -> None:
    sd = {k: v.clone() for k, v in TorchTied().state_dict().items()}
    sd["head.weight"] += 1
    with pytest.raises(tm.CheckpointError, match=r"Shared at the model's root: the tied"):
        tm.load_state_dict(_tied(), sd)
