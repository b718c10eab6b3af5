"""Shared by tests/state_dict: move weights between a PyTorch model and its treemod mirror
through the public API only, and compare outputs (float32, 1e-5 relative)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import treemod as tm

RTOL = 1e-5


def np_of(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def assert_close(ours: Any, theirs: Any, rtol: float = RTOL) -> None:
    """Max abs error over max abs value of the reference, at most `rtol` (the issue's measure)."""
    a, b = np_of(ours), np_of(theirs)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = max(float(np.max(np.abs(b))), 1e-30)
    err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) / scale
    assert err <= rtol, f"relative error {err:.3g} > {rtol}"


def scrambled(module: torch.nn.Module, seed: int = 123) -> torch.nn.Module:
    """A copy of `module` whose every parameter and float buffer is redrawn, so that a later
    `load_state_dict` must overwrite each of them for the outputs to match again."""
    other = copy.deepcopy(module)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, tensor in other.state_dict(keep_vars=True).items():
            if tensor.is_floating_point():
                tensor.copy_(torch.rand(tensor.shape, generator=gen) + 0.5)
            else:
                tensor.fill_(7)
    return other


def check_both_ways(
    torch_model: torch.nn.Module,
    treemod_model: Any,
    run_torch: Callable[[torch.nn.Module], Any],
    run_treemod: Callable[[Any], Any],
    rtol: float = RTOL,
) -> Any:
    """Load the PyTorch model's `state_dict()` into the mirror (no mapping code) and compare
    outputs; export the mirror with `tm.state_dict` into a scrambled PyTorch copy with
    `load_state_dict(strict=True)` and compare again. Returns the loaded mirror."""
    torch_model.eval()
    expected = run_torch(torch_model)
    loaded = tm.load_state_dict(treemod_model, torch_model.state_dict())
    assert_close(run_treemod(loaded), expected, rtol)
    back = scrambled(torch_model)
    exported = {k: torch.from_numpy(v) for k, v in tm.state_dict(loaded).items()}
    back.load_state_dict(exported, strict=True)
    back.eval()
    assert_close(run_torch(back), expected, rtol)
    return loaded
