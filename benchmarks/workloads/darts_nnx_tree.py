"""The DARTS supernet in Flax NNX tree mode: `darts_nnx.py`'s network and bilevel step,
unchanged, run with `nnx.set_graph_mode(False)` (see `nnx_tree_models.py`)."""

from __future__ import annotations

from typing import Any

from flax import nnx

from .darts_nnx import Alphas, Network
from .darts_spec import DartsConfig
from .nnx_tree_models import tree_mode

__all__ = ["Alphas", "Network", "make_step"]


def make_step(cfg: DartsConfig):
    """`darts_nnx.make_step(cfg)` in tree mode: (init_fn, step), both run with graph mode off."""
    from . import darts_nnx

    with nnx.set_graph_mode(False):  # `nnx.jit` reads the mode when it wraps the step
        init_carry, step = darts_nnx.make_step(cfg)
    tree_step: Any = tree_mode(step)
    tree_step.lower = tree_mode(step.lower)
    return tree_mode(init_carry), tree_step
