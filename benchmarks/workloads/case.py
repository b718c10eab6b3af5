"""`Case`: what a framework module hands the worker for one workload."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class Case:
    """One framework's version of one workload.

    Attributes:
        make_model: seed -> model, built eagerly (the framework's usual constructor call).
        make_model_abstract: seed -> abstract model, built under the framework's `eval_shape`.
        make_model_jit: seed -> model, built inside the framework's `jit` (first call compiles).
        make_carry: model -> what the training step threads (model, optimiser state, key).
        step: (carry, x, y) -> (carry, loss): one training step through the framework's own
            jitted function (forward, backward, optax update, state update).
        count_params: model -> number of trainable parameters (running statistics excluded).
        wait: carry -> None, blocks until every array of the carry is computed.
        channels_last: the image layout this framework's convolutions use (NHWC or NCHW).
    """

    make_model: Callable[[int], Any]
    make_model_abstract: Callable[[int], Any]
    make_model_jit: Callable[[int], Any]
    make_carry: Callable[[Any], Any]
    step: Callable[[Any, Any, Any], tuple[Any, Any]]
    count_params: Callable[[Any], int]
    wait: Callable[[Any], None]
    channels_last: bool = True
