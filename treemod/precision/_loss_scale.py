"""Dynamic loss scaling for float16 training, as a small functional API around any optimiser."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from treemod._module.module import Module, field
from treemod._tree.filters import is_inexact_array

__all__ = ["DynamicLossScale", "all_finite", "select_tree"]

_MAX = float(np.finfo(np.float32).max)  # the scale is float32; it never grows past this


def _positive(name: str, value: Any) -> float | None:
    """`value` as a float if it is a finite positive number that float32 holds (`None` for a
    traced array, which `adjust` builds under `jit`); else a `ValueError` naming `name`."""
    if isinstance(value, jax.core.Tracer):
        return None
    if isinstance(value, jax.Array | np.ndarray) and value.shape == ():
        if jnp.issubdtype(value.dtype, jnp.floating) or jnp.issubdtype(value.dtype, jnp.integer):
            value = value.item()
    number = isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )
    if number and 0 < float(value) <= _MAX:
        return float(value)
    raise ValueError(
        f"DynamicLossScale: `{name}` must be positive and finite, at most float32's largest "
        f"value {_MAX:.4g} (the scale is a float32 array); got {value!r}."
    )


def all_finite(tree: Any) -> Bool[Array, ""]:
    """Whether every floating array of `tree` is finite (no inf, no NaN): one boolean scalar.

    Arguments:
        tree: a pytree (gradients, usually).

    Returns:
        A boolean scalar array.

    Example:
        >>> import jax.numpy as jnp, treemod.precision as precision
        >>> bool(precision.all_finite({"a": jnp.ones(2), "b": jnp.array([1.0, jnp.inf])}))
        False
    """
    leaves = [x for x in jtu.tree_leaves(tree) if is_inexact_array(x)]
    if not leaves:
        return jnp.array(True)
    return jnp.stack([jnp.isfinite(x).all() for x in leaves]).all()


def select_tree(pred: Any, on_true: Any, on_false: Any) -> Any:
    """`on_true` where the scalar `pred` holds, else `on_false`, leaf by leaf (arrays only;
    other leaves must be equal and are taken from `on_true`).

    Arguments:
        pred: a boolean scalar (e.g. `all_finite(grads)`).
        on_true: a pytree.
        on_false: a pytree of the same structure.

    Returns:
        The selected pytree (no Python branch: it runs under `jit`).

    Example:
        >>> import jax.numpy as jnp, treemod.precision as precision
        >>> precision.select_tree(jnp.array(False), {"w": jnp.ones(2)}, {"w": jnp.zeros(2)})
        {'w': Array([0., 0.], dtype=float32)}
    """

    def pick(a: Any, b: Any) -> Any:
        if isinstance(a, jax.Array) or isinstance(b, jax.Array):
            return jnp.where(pred, a, b)
        return a

    return jtu.tree_map(pick, on_true, on_false)


class DynamicLossScale(Module):
    """Dynamic loss scaling (as PyTorch's `GradScaler` and jmp's `DynamicLossScale`).

    Float16 gradients of small values underflow to zero. Multiply the loss by `scale` before
    differentiating (`scale_loss`), divide the gradients by it (`unscale`), then `adjust`: if
    the gradients are finite the step is applied and, after `period` finite steps in a row, the
    scale grows by `factor`; if not, the step must be skipped (`select_tree`) and the scale
    shrinks by `factor` (never below `min_scale`). Growth stops at float32's largest finite
    value, so the scale never becomes infinite and always recovers by halving. Works with any
    optimiser: the optimiser only ever sees unscaled gradients, and a skipped step keeps its
    state.

    Arguments:
        scale: the initial scale (`2**15` is usual): positive and finite in float32.
        period: finite steps between increases (a positive int).
        factor: the growth and shrink factor (finite, above 1).
        min_scale: the smallest scale (positive, finite, at most `scale`).

    Example:
        >>> import jax, jax.numpy as jnp, optax, treemod as tm, treemod.precision as precision
        >>> params = {"w": jnp.ones(3)}
        >>> opt = optax.sgd(0.1); opt_state = opt.init(params)
        >>> scaler = precision.DynamicLossScale(2.0**10)
        >>> def loss(p):
        ...     value = jnp.sum(p["w"].astype(jnp.float16) ** 2).astype(jnp.float32)
        ...     return scaler.scale_loss(value)
        >>> grads = scaler.unscale(jax.grad(loss)(params))
        >>> finite = precision.all_finite(grads)
        >>> updates, new_state = opt.update(grads, opt_state, params)
        >>> params, opt_state = precision.select_tree(
        ...     finite, (optax.apply_updates(params, updates), new_state), (params, opt_state))
        >>> scaler = scaler.adjust(finite)
        >>> params["w"], float(scaler.scale)
        (Array([0.8, 0.8, 0.8], dtype=float32), 1024.0)
    """

    scale: Float[Array, ""]
    counter: Int[Array, ""]
    period: int = field(static=True)
    factor: float = field(static=True)
    min_scale: float = field(static=True)

    def __init__(
        self,
        scale: float | Array = 2.0**15,
        *,
        period: int = 2000,
        factor: float = 2.0,
        min_scale: float = 1.0,
        counter: int | Array = 0,
    ) -> None:
        scale_value = _positive("scale", scale)
        if isinstance(period, bool) or not isinstance(period, int | np.integer) or period < 1:
            raise ValueError(f"DynamicLossScale: `period` must be a positive int; got {period!r}.")
        if (
            isinstance(factor, bool | np.bool_)
            or not isinstance(factor, int | float | np.integer | np.floating)
            or not 1 < factor < math.inf
        ):
            raise ValueError(
                f"DynamicLossScale: `factor` must be above 1 and finite; got {factor!r}."
            )
        min_value = _positive("min_scale", min_scale)
        if scale_value is not None and np.float32(min_value) > np.float32(scale_value):
            raise ValueError(
                f"DynamicLossScale: `min_scale` ({min_scale!r}) is above the initial `scale` "
                f"({scale!r}); the scale never goes below min_scale, so pass a min_scale at most "
                "the scale (1.0 is usual)."
            )
        period = int(period)
        self.scale = jnp.asarray(scale, jnp.float32)
        self.counter = jnp.asarray(counter, jnp.int32)
        self.period = period
        self.factor = float(factor)
        self.min_scale = float(min_scale)

    def scale_loss(self, loss: Any) -> Any:
        """`loss * scale` (differentiate this).

        Arguments:
            loss: the float32 loss (or a pytree of them).

        Returns:
            The scaled loss.
        """
        return jtu.tree_map(lambda x: x * self.scale.astype(x.dtype), loss)

    def unscale(self, grads: Any) -> Any:
        """`grads / scale`, computed in float32 and returned in each gradient's dtype.

        Arguments:
            grads: the gradients of the scaled loss.

        Returns:
            The true gradients (inf or NaN where the scaled ones overflowed).
        """

        def one(g: Any) -> Any:
            if not is_inexact_array(g):
                return g
            return (g.astype(jnp.float32) / self.scale).astype(g.dtype)

        return jtu.tree_map(one, grads)

    def adjust(self, grads_finite: Any) -> DynamicLossScale:
        """The scale for the next step.

        Arguments:
            grads_finite: `all_finite(grads)` of this step.

        Returns:
            A new `DynamicLossScale`: halved (by `factor`) after a non-finite step, doubled
            after `period` finite steps in a row.
        """
        grow = grads_finite & (self.counter + 1 >= self.period)
        scale = jnp.where(
            grads_finite,
            # Growth stops at float32's largest finite value: an infinite scale would make
            # every later step non-finite, and halving infinity would never recover.
            jnp.where(grow, jnp.minimum(self.scale * self.factor, _MAX), self.scale),
            jnp.maximum(self.scale / self.factor, self.min_scale),
        )
        counter = jnp.where(grads_finite & ~grow, self.counter + 1, 0)
        return DynamicLossScale(
            scale, period=self.period, factor=self.factor, min_scale=self.min_scale, counter=counter
        )
