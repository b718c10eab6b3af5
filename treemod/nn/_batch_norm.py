"""`BatchNorm`: batch normalisation with its running statistics kept in the model tree."""

import math
import warnings
from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float

from treemod._module.module import Module, field
from treemod._module.state import State, in_stateful_call, update_state
from treemod._sharding.axes import axis_names

from ._utils import check_number, check_size, default_dtype

__all__ = ["BatchNorm"]


def _compute_dtype(x_dtype: Any, state_dtype: Any) -> Any:
    """The float dtype to compute in: the wider of the two (float32 at least when they differ)."""
    if not jnp.issubdtype(x_dtype, jnp.floating) or x_dtype == state_dtype:
        return state_dtype
    bits = 8 * max(jnp.dtype(x_dtype).itemsize, jnp.dtype(state_dtype).itemsize, 4)
    return jnp.dtype(f"float{bits}")


@axis_names({"weight": ("norm",), "bias": ("norm",)})
class BatchNorm(Module):
    """Batch normalisation (Ioffe and Szegedy, 2015) with running statistics kept in the model.

    In training mode the input is normalised with the mean and (biased) variance of the batch,
    per channel, and the running statistics are updated with PyTorch's convention:

        running_mean = (1 - momentum) * running_mean + momentum * batch_mean
        running_var = (1 - momentum) * running_var + momentum * batch_var * n / (n - 1)

    where `n` is the number of values per channel (the running variance is unbiased, as in
    PyTorch). In inference mode the running statistics are used instead, so each example is
    normalised on its own. The running statistics are `State` fields: they are saved and printed
    with the model, get no gradient, and are left alone by optimisers. Training mode updates
    them, so it runs as `out, model = treemod.stateful(model)(x)`.

    Input layout, decided by `axis_name` (and `channels_last`):

    - `axis_name=None` (PyTorch style): `x` is a batch `(N, C, *spatial)`, as for PyTorch's
      `BatchNorm1d` (`(N, C)` or `(N, C, L)`), `BatchNorm2d` (`(N, C, H, W)`) and
      `BatchNorm3d`. Statistics are over every axis except the channel axis 1.
    - `axis_name` given (Equinox style): `x` is one example `(C, *spatial)`, and the layer runs
      under `jax.vmap`/`filter_vmap` (or `shard_map`) with that axis name. Statistics are over
      the spatial axes and across the named axis (or axes, if a tuple).
    - `channels_last=True`: the channels are the last axis instead, `(N, *spatial, C)` or
      `(*spatial, C)`, as for the channels-last `Conv`.

    Arguments:
        input_size: the number of channels `C`.
        axis_name: `None` for batched input; otherwise the name (or tuple of names) of the
            mapped axis that holds the batch.
        eps: added to the variance before taking its square root (a positive number).
        channelwise_affine: whether to learn a per-channel scale `weight` (ones at first) and
            shift `bias` (zeros at first); if `False` both are `None`.
        momentum: PyTorch's convention (see above): the weight of the new batch statistics,
            in `[0, 1]`. Equinox and Flax use the complementary convention (`0.99` there is
            `0.01` here); a value above `0.5` warns, since it is most likely such a port.
        inference: start in inference mode (use the running statistics). Switch a whole model
            with `treemod.nn.inference_mode`.
        dtype: the dtype of the parameters and running statistics (default float32).
        channels_last: the channels are the last axis of `x` rather than the first after the
            batch.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> bn = tm.nn.BatchNorm(3)
        >>> bn
        BatchNorm(
          weight=f32[3],
          bias=f32[3],
          running_mean=State(value=f32[3]),
          running_var=State(value=f32[3]),
          input_size=3,
          axis_name=None,
          eps=1e-05,
          channelwise_affine=True,
          momentum=0.1,
          inference=False,
          channels_last=False
        )
        >>> x = jax.random.normal(jax.random.key(0), (8, 3, 5, 5))   # (N, C, H, W)
        >>> y, bn = tm.stateful(bn)(x)                                 # training mode
        >>> y.shape, bn.running_mean.value.shape
        ((8, 3, 5, 5), (3,))
        >>> y_eval = tm.nn.inference_mode(bn)(x)                       # running statistics
    """

    weight: Float[Array, " channels"] | None
    bias: Float[Array, " channels"] | None
    running_mean: State
    running_var: State
    input_size: int = field(static=True)
    axis_name: Hashable | tuple[Hashable, ...] | None = field(static=True)
    eps: float = field(static=True)
    channelwise_affine: bool = field(static=True)
    momentum: float = field(static=True)
    inference: bool = field(static=True)
    channels_last: bool = field(static=True)

    def __init__(
        self,
        input_size: int,
        axis_name: Hashable | tuple[Hashable, ...] | None = None,
        eps: float = 1e-5,
        channelwise_affine: bool = True,
        momentum: float = 0.1,
        inference: bool = False,
        dtype: Any = None,
        *,
        channels_last: bool = False,
    ) -> None:
        check_size("BatchNorm", "input_size", input_size)
        # A bool, a string, None (PyTorch's cumulative average) or NaN is refused here; the range
        # checks below keep their own messages.
        momentum_note = (
            " It is the weight of the new batch statistics (PyTorch's convention; 0.1 is usual;"
            " PyTorch's momentum=None, a cumulative average, is not supported)."
        )
        momentum = check_number("BatchNorm", "momentum", momentum, note=momentum_note)
        eps = check_number("BatchNorm", "eps", eps, note=" It is added to the variance.")
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(
                f"BatchNorm: momentum must be in [0, 1], got {momentum!r}. It is the weight of "
                "the new batch statistics (PyTorch's convention; 0.1 is usual)."
            )
        if momentum > 0.5:
            warnings.warn(
                f"BatchNorm(momentum={momentum}): treemod uses PyTorch's convention, "
                "running = (1 - momentum) * running + momentum * batch, so the running "
                "statistics will mostly follow the last batch. If this value comes from "
                "Equinox or Flax (running = momentum * running + (1 - momentum) * batch), "
                f"pass momentum={1 - momentum:.3g}.",
                stacklevel=3,
            )
        if not eps > 0:
            raise ValueError(f"BatchNorm: eps must be positive, got {eps!r}.")
        dtype = jnp.zeros((), default_dtype("BatchNorm", dtype)).dtype  # float64 needs x64
        self.weight = jnp.ones(input_size, dtype) if channelwise_affine else None
        self.bias = jnp.zeros(input_size, dtype) if channelwise_affine else None
        self.running_mean = State(jnp.zeros(input_size, dtype))
        self.running_var = State(jnp.ones(input_size, dtype))
        self.input_size = input_size
        self.axis_name = axis_name
        self.eps = eps
        self.channelwise_affine = channelwise_affine
        self.momentum = momentum
        self.inference = inference
        self.channels_last = channels_last

    def _layout_error(self, x: jax.Array, inference: bool = False) -> ValueError:
        c = self.input_size
        if self.channels_last:
            batch = "(N, *spatial, C)" if self.axis_name is None else "one example (*spatial, C)"
            return ValueError(
                f"BatchNorm(input_size={c}, axis_name={self.axis_name!r}, channels_last=True) "
                f"takes {batch} with C={c} on the last axis, but got an input of shape "
                f"{tuple(x.shape)}."
            )
        if self.axis_name is None:
            one = f" (or, in inference mode, one example (C={c}, *spatial))" if inference else ""
            hint = (
                f"BatchNorm(input_size={c}, axis_name=None) takes a batch (N, C={c}, *spatial), "
                f"with the channels on axis 1{one}, but got an input of shape {tuple(x.shape)}."
            )
            if x.ndim >= 2 and x.shape[-1] == c:
                hint += (
                    " The channels look last: build the layer with channels_last=True to "
                    "normalise channels-last input."
                )
            elif not inference and x.ndim >= 1 and x.shape[0] == c:
                hint += (
                    " This looks like one example (C, *spatial): call it on the batch "
                    "directly, or, under jax.vmap/filter_vmap, build the layer with "
                    "axis_name=... and give vmap the same axis_name (in inference mode, a "
                    "single example needs neither)."
                )
            return ValueError(hint)
        return ValueError(
            f"BatchNorm(input_size={c}, axis_name={self.axis_name!r}) takes one example "
            f"(C={c}, *spatial) under jax.vmap/filter_vmap with axis_name={self.axis_name!r}, "
            f"but got an input of shape {tuple(x.shape)}. To call it on a batch "
            "(N, C, *spatial) directly, build it with axis_name=None."
        )

    def _reads_as_batch(self, x: jax.Array) -> bool:
        """Whether `x` has the batched layout `(N, C, *spatial)` (or `(N, *spatial, C)`)."""
        if self.channels_last:
            return x.ndim >= 2
        return x.ndim >= 2 and x.shape[1] == self.input_size

    def __call__(
        self, x: Float[Array, "..."], *, key: Any = None, inference: bool | None = None
    ) -> Float[Array, "..."]:
        """Normalise `x`.

        In training mode the statistics come from the batch, so with `axis_name=None` `x` must
        be a batch. In inference mode the running statistics are used, so `x` may also be one
        example `(C, *spatial)` (read as such when its axis 1 is not `C`; an input
        `(C, C, ...)` is read as a batch, so pass `x[None]` for one example of that shape).

        Arguments:
            x: `(N, C, *spatial)` if `axis_name` is `None` (or, in inference mode, one example
                `(C, *spatial)`), else one example `(C, *spatial)`; with the channels last
                instead if `channels_last`: `(N, *spatial, C)` or `(*spatial, C)`.
            key: ignored (accepted so that containers can pass keys to every layer).
            inference: override the layer's `inference` flag for this call.

        Returns:
            An array of the shape and dtype of `x`, normalised per channel.

        Raises:
            ValueError: if the axis where the layout puts the channels is not of size `C`
                (the message names the layout expected), or, in training mode, if there is
                only one value per channel.
            RuntimeError: in training mode outside `treemod.stateful`.
        """
        del key
        if inference is None:
            inference = self.inference
        x = jnp.asarray(x)
        batched = self.axis_name is None
        if inference and batched and not self._reads_as_batch(x):
            batched = False  # one example (C, *spatial): the running statistics need no batch
        channel_axis = x.ndim - 1 if self.channels_last else int(batched)
        if x.ndim <= int(batched) or x.shape[channel_axis] != self.input_size:
            raise self._layout_error(x, inference)
        state_dtype = self.running_mean.value.dtype
        compute = _compute_dtype(x.dtype, state_dtype)
        out_dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else compute
        xc = x.astype(compute)
        axes = tuple(i for i in range(x.ndim) if i != channel_axis)
        if inference:
            mean = self.running_mean.value.astype(compute)
            var = self.running_var.value.astype(compute)
        else:
            mean, var, n = self._batch_statistics(xc, axes)
            if not in_stateful_call():
                raise RuntimeError(
                    "BatchNorm is in training mode, which updates its running statistics, so "
                    "the model must run as `out, model = treemod.stateful(model)(x)` (keep the "
                    "returned model). To evaluate with the running statistics, switch it with "
                    "`treemod.nn.inference_mode(model)`."
                )
            m = self.momentum
            bmean = lax.stop_gradient(mean)
            bvar = lax.stop_gradient(var) * (n / (n - 1))
            new_mean = (1 - m) * self.running_mean.value.astype(compute) + m * bmean
            new_var = (1 - m) * self.running_var.value.astype(compute) + m * bvar
            update_state(self.running_mean, new_mean.astype(state_dtype))
            update_state(self.running_var, new_var.astype(state_dtype))
        y = normalise(xc, mean, var, self.weight, self.bias, self.eps, channel_axis)
        return y.astype(out_dtype)

    def _batch_statistics(self, x: jax.Array, axes: tuple[int, ...]) -> tuple[Any, Any, Any]:
        """Per-channel mean and biased variance over `axes` (and `axis_name`), and the count."""
        return batch_statistics(x, axes, self.axis_name)


def batch_statistics(
    x: jax.Array,
    axes: tuple[int, ...],
    axis_name: Hashable | tuple[Hashable, ...] | None,
    *,
    check_count: bool = True,
) -> tuple[Any, Any, Any]:
    """Per-channel mean and biased variance of `x` over `axes` and the mapped `axis_name`.

    Shared by `BatchNorm` and compat layers (`treemod/_compat_api.py`). With `check_count`,
    fewer than two values per channel (a variance of zero, an unbiased variance of nan) is an
    error.

    Returns:
        `(mean, variance, count)`; the count is the number of values per channel.
    """
    local = math.prod(x.shape[i] for i in axes)
    if axis_name is None:
        n: Any = local
        if check_count and n <= 1:
            raise ValueError(
                f"BatchNorm in training mode needs more than one value per channel to "
                f"estimate a variance, but the input of shape {tuple(x.shape)} has {n}. "
                "Give it a batch of at least two examples, or use inference mode."
            )
        mean = jnp.mean(x, axis=axes)
        centred = x - jnp.expand_dims(mean, axes)
        return mean, jnp.mean(centred * centred, axis=axes), n
    try:
        n = lax.psum(local, axis_name)
    except NameError:
        raise NameError(
            f"BatchNorm(axis_name={axis_name!r}) in training mode must run under "
            f"jax.vmap/filter_vmap(..., axis_name={axis_name!r}) (or shard_map/pmap "
            "with that axis), on one example (C, *spatial) at a time. To call it on a "
            "batch (N, C, *spatial) directly, build it with axis_name=None."
        ) from None
    if check_count and isinstance(n, int) and n <= 1:
        raise ValueError(
            f"BatchNorm in training mode needs more than one value per channel to "
            f"estimate a variance, but the mapped axis {axis_name!r} and the input of "
            f"shape {tuple(x.shape)} give {n}. Map over a batch of at least two examples."
        )
    mean = lax.psum(jnp.sum(x, axis=axes), axis_name) / n
    centred = x - jnp.expand_dims(mean, axes)
    var = lax.psum(jnp.sum(centred * centred, axis=axes), axis_name) / n
    return mean, var, n


def normalise(
    x: jax.Array,
    mean: jax.Array,
    var: jax.Array,
    weight: jax.Array | None,
    bias: jax.Array | None,
    eps: float,
    channel_axis: int,
) -> jax.Array:
    """`(x - mean) / sqrt(var + eps) * weight + bias`, with per-channel statistics and affine.

    Shared by `BatchNorm` and compat layers; computes in `x`'s dtype.
    """
    shape = [1] * x.ndim
    shape[channel_axis] = x.shape[channel_axis]
    scale = lax.rsqrt(var + eps)
    if weight is not None:
        scale = scale * weight.astype(x.dtype)
    y = (x - mean.reshape(shape)) * scale.reshape(shape)
    if bias is not None:
        y = y + bias.astype(x.dtype).reshape(shape)
    return y
