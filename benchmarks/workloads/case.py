"""`Case`: what the worker measures for one framework and one workload.

A framework module's `build(workload)` returns one for the model workloads (a model and a
(model, optimiser) training step); `bilevel_case` makes one from a DARTS module's
`make_step(cfg)` (`darts_<framework>.py`: the whole carry built at once, a bilevel step).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class Case:
    """One framework's version of one workload.

    Attributes:
        make_model: seed -> model, built eagerly (the framework's usual constructor call).
        make_model_abstract: seed -> abstract model, built under the framework's `eval_shape`
            (None: not measured).
        make_model_jit: seed -> model, built inside the framework's `jit` (first call compiles;
            None: not measured).
        make_carry: model -> what the training step threads (model, optimiser state, key);
            None where `make_model` builds the whole carry.
        step: (carry, x, y) -> (carry, loss): one training step through the framework's own
            jitted function (forward, backward, optax update, state update).
        count_params: model -> number of trainable parameters (running statistics excluded).
        wait: carry -> None, blocks until every array of the carry is computed.
        channels_last: the image layout this framework's convolutions use (NHWC or NCHW).
    """

    make_model: Callable[[int], Any]
    make_model_abstract: Callable[[int], Any] | None
    make_model_jit: Callable[[int], Any] | None
    make_carry: Callable[[Any], Any] | None
    step: Callable[[Any, Any, Any], tuple[Any, Any]]
    count_params: Callable[[Any], int]
    wait: Callable[[Any], None]
    channels_last: bool = True


def darts_weights(framework: str, carry: Any) -> Any:
    """The trainable weights in a DARTS carry (no architecture weights, no statistics)."""
    if framework == "treemod":
        import treemod as tm

        return tm.filter(carry[0], tm.is_param)
    if framework in ("nnx", "nnx_tree"):
        from flax import nnx

        return nnx.state(carry[0], nnx.Param)
    if framework == "linen":
        return carry[0].params  # the weights' TrainState
    return carry[0]  # a tree of weights (jax, haiku) or a module without its state (equinox)


def bilevel_case(framework: str, cfg: Any) -> Case:
    """The worker's view of `darts_<framework>.make_step(cfg)`.

    `make_model` builds the whole carry (weights, statistics, architecture weights and both
    optimisers' states); a batch is a (training, validation) pair of images and of labels,
    and the step's loss is the training loss (both losses come from the same compiled call).
    """
    import jax

    from .common import count_params, wait

    module = importlib.import_module(f"benchmarks.workloads.darts_{framework}")
    init_carry, bilevel_step = module.make_step(cfg)

    def step(carry: Any, x: tuple[Any, Any], y: tuple[Any, Any]) -> tuple[Any, Any]:
        carry, (train_loss, _) = bilevel_step(carry, x[0], y[0], x[1], y[1])
        return carry, train_loss

    if framework in ("nnx", "nnx_tree"):  # modules and optimisers: wait on their state
        from flax import nnx

        def wait_for(carry: Any) -> None:
            jax.block_until_ready([nnx.state(m) for m in carry])
    else:
        wait_for = wait

    return Case(
        make_model=lambda seed: init_carry(jax.random.key(seed)),
        make_model_abstract=None,
        make_model_jit=None,
        make_carry=None,
        step=step,
        count_params=lambda carry: count_params(darts_weights(framework, carry)),
        wait=wait_for,
        channels_last=True,
    )
