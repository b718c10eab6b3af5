"""Flax NNX in tree mode: the models and training step of `nnx_models.py`, unchanged, run with
`nnx.set_graph_mode(False)` (FLIP 5310, meant to become NNX's default).

In tree mode NNX's transforms (`nnx.jit`, `nnx.value_and_grad`, `nnx.vmap`, `nnx.scan`,
`nnx.eval_shape`) treat modules as ordinary pytrees instead of splitting and merging their
object graph at every boundary (no shared `Variable`s allowed); the code a user writes is the
same. The mode is read when a transform is applied or traced, so every function of the case
(construction, the step, waiting) runs inside it: `tree_mode` wraps them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from flax import nnx

from . import nnx_models
from .case import Case
from .spec import Workload


def tree_mode(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, run with NNX's graph mode off (the mode as it was restored after each call)."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with nnx.set_graph_mode(False):
            return fn(*args, **kwargs)

    return wrapped


def build(w: Workload) -> Case:
    """The Flax NNX version of workload `w` (`nnx_models.build`), in tree mode."""
    with nnx.set_graph_mode(False):  # `nnx.jit` reads the mode when it wraps the step
        case = nnx_models.build(w)
    functions = {
        f.name: tree_mode(getattr(case, f.name))
        for f in dataclasses.fields(case)
        if callable(getattr(case, f.name))
    }
    return dataclasses.replace(case, **functions)
