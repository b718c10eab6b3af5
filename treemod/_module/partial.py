"""`Partial`: `functools.partial` as a module, so its bound arrays are pytree leaves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from treemod._module.module import Module

__all__ = ["Partial"]


class Partial(Module):
    """`functools.partial` as a `Module`: the bound arguments are part of the pytree.

    A plain `functools.partial` is a single leaf to JAX, so arrays bound into it are hidden
    from transforms: `filter_jit` hashes it as a static value (recompiling whenever it is
    rebuilt) and gradients cannot reach its arrays. `Partial` is a pytree whose leaves are
    the bound arguments (and the function, if it is a module), so its arrays are traced and
    differentiated like any other, and a rebuilt `Partial` with new arrays reuses the
    compiled program. Equinox's `eqx.Partial`.

    Arguments:
        func: the function (or module) to call.
        *args: positional arguments bound in front of the call's own.
        **kwargs: keyword arguments bound; the call's own override them.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> scale = tm.Partial(jnp.multiply, jnp.float32(3.0))
        >>> scale(jnp.float32(2.0))
        Array(6., dtype=float32)
        >>> tm.filter_grad(lambda f: f(jnp.float32(2.0)))(scale).args
        (Array(2., dtype=float32),)
    """

    func: Callable[..., Any]
    args: tuple[Any, ...]
    keywords: dict[str, Any]

    def __init__(self, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        if not callable(func):
            raise TypeError(f"Partial: `func` must be callable; got {type(func).__name__}.")
        self.func = func
        self.args = args
        self.keywords = kwargs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call `func(*self.args, *args, **{**self.keywords, **kwargs})`."""
        return self.func(*self.args, *args, **{**self.keywords, **kwargs})
