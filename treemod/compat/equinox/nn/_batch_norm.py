"""Equinox's `BatchNorm`: one example `(C, *spatial)` under a named vmap, state passed in and out.

The statistics and the normalisation are treemod's (`treemod.nn._batch_norm`); this layer adds
Equinox's two ways of keeping running statistics and its `layer(x, state) -> (y, state)` call.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import lax

from treemod import field
from treemod._compat_api import batch_statistics, default_dtype, normalise

from ._stateful import State, StatefulLayer, StateIndex

__all__ = ["BatchNorm"]


class BatchNorm(StatefulLayer):
    """Batch normalisation as Equinox's `nn.BatchNorm`: `y, state = bn(x, state)` under vmap.

    `x` is one example `(input_size, *spatial)`; the layer runs under `jax.vmap`/`filter_vmap`
    (or `pmap`/`shard_map`) with `axis_name`, and the statistics are over the spatial axes and
    the named axis. Build it with `make_with_state`.

    Two modes, as in Equinox:

    - `"batch"`: training normalises with the batch statistics and keeps exponential moving
      averages `m * hidden + (1 - m) * batch` (biased variance) and a step counter; inference
      normalises with the averages divided by `1 - m**count` (zero-debiased).
    - `"ema"`: training normalises with `m * running + (1 - m) * batch` (the batch statistics
      alone on the first call) and stores it; inference uses the stored statistics.

    `momentum` is Equinox's convention (the weight of the old value, `0.99` by default), the
    complement of `treemod.nn.BatchNorm`'s PyTorch convention.

    Arguments:
        input_size: the number of channels.
        axis_name: the name (or names) of the mapped axis holding the batch.
        eps: added to the variance.
        channelwise_affine: learn a per-channel `weight` and `bias`.
        momentum: in `[0, 1]`, the weight of the old running value.
        inference: start in inference mode (switch with `inference_mode`).
        dtype: of the parameters and statistics (float32 by default).
        mode: `"ema"` or `"batch"`; left out, it is `"ema"` with a warning, as in Equinox.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> bn, state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, "batch", mode="batch")
        >>> x = jax.random.normal(jax.random.key(0), (8, 3, 5))
        >>> run = jax.vmap(bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
        >>> y, state = run(x, state)
        >>> y.shape
        (8, 3, 5)
    """

    weight: jax.Array | None
    bias: jax.Array | None
    ema_first_time_index: StateIndex[jax.Array] | None
    ema_state_index: StateIndex[tuple[jax.Array, jax.Array]] | None
    batch_counter: StateIndex[jax.Array] | None
    batch_state_index: StateIndex[tuple[jax.Array, jax.Array]] | None
    axis_name: Hashable | Sequence[Hashable]
    inference: bool
    input_size: int = field(static=True)
    eps: float = field(static=True)
    channelwise_affine: bool = field(static=True)
    momentum: float = field(static=True)
    mode: Literal["ema", "batch"] = field(static=True)

    def __init__(
        self,
        input_size: int,
        axis_name: Hashable | Sequence[Hashable],
        eps: float = 1e-5,
        channelwise_affine: bool = True,
        momentum: float = 0.99,
        inference: bool = False,
        dtype: Any = None,
        mode: Literal["ema", "batch", "legacy"] = "legacy",
    ) -> None:
        if mode == "legacy":
            warnings.warn(
                "eqx.nn.BatchNorm: `mode` was not given, so it is 'ema' (Equinox's default, kept "
                "for old code). Pass mode='batch' (normalise with the batch statistics, as "
                "PyTorch and Flax do) or mode='ema' explicitly.",
                UserWarning,
                stacklevel=3,
            )
            mode = "ema"
        if mode not in ("ema", "batch"):
            raise ValueError(f"eqx.nn.BatchNorm: mode must be 'ema' or 'batch', got {mode!r}.")
        if isinstance(input_size, bool) or not isinstance(input_size, int) or input_size < 1:
            raise ValueError(
                f"eqx.nn.BatchNorm: input_size must be a positive int (the number of "
                f"channels), got {input_size!r}."
            )
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(
                f"eqx.nn.BatchNorm: momentum must be in [0, 1], got {momentum!r} (Equinox's "
                "convention: the weight of the old running value, 0.99 by default)."
            )
        dtype = jnp.zeros((), default_dtype("BatchNorm", dtype)).dtype
        self.weight = jnp.ones(input_size, dtype) if channelwise_affine else None
        self.bias = jnp.zeros(input_size, dtype) if channelwise_affine else None
        if mode == "ema":
            self.ema_first_time_index = StateIndex(jnp.array(True))
            # Overwritten by the first batch's statistics before they are read. Equinox fills
            # them with `jnp.empty`, which from JAX 0.11 is uninitialised memory: zeros, so a
            # saved state, its hash and a comparison are the same from run to run.
            self.ema_state_index = StateIndex(
                (jnp.zeros(input_size, dtype), jnp.zeros(input_size, dtype))
            )
            self.batch_counter = None
            self.batch_state_index = None
        else:
            self.ema_first_time_index = None
            self.ema_state_index = None
            self.batch_counter = StateIndex(jnp.array(0))
            self.batch_state_index = StateIndex(
                (jnp.zeros(input_size, dtype), jnp.ones(input_size, dtype))
            )
        self.axis_name = axis_name
        self.inference = inference
        self.input_size = input_size
        self.eps = eps
        self.channelwise_affine = channelwise_affine
        self.momentum = momentum
        self.mode = mode

    def _statistics(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        axis_name = tuple(self.axis_name) if isinstance(self.axis_name, list) else self.axis_name
        try:
            # Equinox allows a single value per channel (its variance is zero).
            axes = tuple(range(1, x.ndim))
            mean, var, _ = batch_statistics(x, axes, axis_name, check_count=False)
        except NameError:
            raise NameError(
                f"eqx.nn.BatchNorm(axis_name={self.axis_name!r}) takes one example (C, *spatial) "
                f"and must run under jax.vmap/filter_vmap(..., axis_name={self.axis_name!r}) "
                "(or pmap/shard_map with that axis name), e.g. "
                f"`jax.vmap(bn, axis_name={self.axis_name!r}, in_axes=(0, None), "
                "out_axes=(0, None))(x, state)`."
            ) from None
        return mean, var

    def __call__(
        self,
        x: jax.Array,
        state: State,
        *,
        key: Any = None,
        inference: bool | None = None,
    ) -> tuple[jax.Array, State]:
        """Normalise one example and return the updated state.

        Arguments:
            x: `(input_size, *spatial)`.
            state: the model's `State`.
            key: ignored.
            inference: overrides the `inference` field for this call.

        Returns:
            `(y, state)`, `y` of the shape of `x`.
        """
        del key
        if inference is None:
            inference = self.inference
        x = jnp.asarray(x)
        if x.ndim < 1 or x.shape[0] != self.input_size:
            raise ValueError(
                f"eqx.nn.BatchNorm(input_size={self.input_size}) takes one example "
                f"(C={self.input_size}, *spatial) under a named vmap, but got an input of shape "
                f"{tuple(x.shape)}."
            )
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            x = x.astype(jnp.result_type(x.dtype, float))
        m = self.momentum
        if self.mode == "ema":
            assert self.ema_first_time_index is not None and self.ema_state_index is not None
            if inference:
                mean, var = state.get(self.ema_state_index)
            else:
                first_time = state.get(self.ema_first_time_index)
                state = state.set(self.ema_first_time_index, jnp.array(False))
                batch_mean, batch_var = self._statistics(x)
                running_mean, running_var = state.get(self.ema_state_index)
                mean = lax.select(first_time, batch_mean, (1 - m) * batch_mean + m * running_mean)
                var = lax.select(first_time, batch_var, (1 - m) * batch_var + m * running_var)
                state = state.set(self.ema_state_index, (mean, var))
        else:
            assert self.batch_counter is not None and self.batch_state_index is not None
            counter = state.get(self.batch_counter)
            hidden_mean, hidden_var = state.get(self.batch_state_index)
            if inference:
                debias = jnp.where(counter == 0, 1, 1 - m**counter)
                mean, var = hidden_mean / debias, hidden_var / debias
            else:
                mean, var = self._statistics(x)
                state = state.set(self.batch_counter, counter + 1)
                state = state.set(
                    self.batch_state_index,
                    (hidden_mean * m + mean * (1 - m), hidden_var * m + var * (1 - m)),
                )
        mean, var = mean.astype(x.dtype), var.astype(x.dtype)
        y = normalise(x, mean, var, self.weight, self.bias, self.eps, 0)
        return y, state
