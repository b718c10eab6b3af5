"""`filter_custom_vjp`: a custom backward pass for a function of arbitrary pytrees (Equinox API)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, Concatenate, Generic, TypeVar

import jax
import jax.tree_util as jtu

from treemod._transforms.leaves import split_tree
from treemod._transforms.wrapper import P, R
from treemod._tree.filters import combine, is_array, is_inexact_array, partition

__all__ = ["filter_custom_vjp"]


_A = TypeVar("_A")


class filter_custom_vjp(Generic[_A, P, R]):  # noqa: N801 (Equinox's name)
    """Define a custom backward pass for a function, differentiating its first argument.

    Equinox's API: decorate `fn(vjp_arg, *args, **kwargs)`, then define
    `fn_fwd(perturbed, vjp_arg, *args, **kwargs) -> (out, residuals)` with `.def_fwd` and
    `fn_bwd(residuals, grad_obj, perturbed, vjp_arg, *args, **kwargs) -> grad_vjp_arg` with
    `.def_bwd`. Floating-point arrays of `vjp_arg` are differentiated; `perturbed` is a tree of
    bools with the structure of their partition (`True` at each of them: JAX's `custom_vjp` does
    not say which inputs are symbolically zero); `grad_obj` is the cotangent
    of the output; `fn_bwd` returns a gradient with the structure of `vjp_arg` (`None` for
    leaves without one). The other arguments are not differentiated (their arrays get zero
    gradient). Non-array leaves anywhere are static.

    Arguments:
        fn: the primal function.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> @tm.filter_custom_vjp
        ... def clip_gradient(x, bound):
        ...     return x
        >>> @clip_gradient.def_fwd
        ... def fwd(perturbed, x, bound):
        ...     return x, None
        >>> @clip_gradient.def_bwd
        ... def bwd(residuals, grad, perturbed, x, bound):
        ...     return jnp.clip(grad, -bound, bound)
        >>> jax.grad(lambda x: 3.0 * clip_gradient(x, 1.0))(jnp.array(2.0))
        Array(1., dtype=float32)
    """

    def __init__(self, fn: Callable[Concatenate[_A, P], R]) -> None:
        self.fn: Callable[..., Any] = fn
        self.fn_fwd: Callable[..., Any] | None = None
        self.fn_bwd: Callable[..., Any] | None = None
        functools.update_wrapper(self, fn, updated=())

    def def_fwd(self, fn_fwd: Callable[..., Any]) -> Callable[..., Any]:
        """Set the forward pass: `fn_fwd(perturbed, vjp_arg, *args, **kwargs) -> (out, res)`."""
        self.fn_fwd = fn_fwd
        return fn_fwd

    def def_bwd(self, fn_bwd: Callable[..., Any]) -> Callable[..., Any]:
        """Set the backward pass: `fn_bwd(res, grad_obj, perturbed, vjp_arg, *args, **kwargs)`."""
        self.fn_bwd = fn_bwd
        return fn_bwd

    def defvjp(self, fn_fwd: Callable[..., Any], fn_bwd: Callable[..., Any]) -> None:
        """Equinox's older API, deprecated there: both passes at once, without `perturbed`.

        `fn_fwd(vjp_arg, *args, **kwargs) -> (out, residuals)` and
        `fn_bwd(residuals, grad_obj, vjp_arg, *args, **kwargs) -> grad_vjp_arg`.
        """
        warnings.warn(
            "filter_custom_vjp.defvjp is Equinox's deprecated API: use `.def_fwd` and "
            "`.def_bwd`, whose functions also receive `perturbed` (which inputs need a "
            "gradient) after the residuals and output cotangent.",
            DeprecationWarning,
            stacklevel=2,
        )

        def fwd(perturbed: Any, vjp_arg: Any, *args: Any, **kwargs: Any) -> Any:
            return fn_fwd(vjp_arg, *args, **kwargs)

        def bwd(res: Any, grad_obj: Any, perturbed: Any, vjp_arg: Any, *a: Any, **k: Any) -> Any:
            return fn_bwd(res, grad_obj, vjp_arg, *a, **k)

        self.fn_fwd, self.fn_bwd = fwd, bwd

    def __call__(self, vjp_arg: _A, /, *args: P.args, **kwargs: P.kwargs) -> R:
        name = getattr(self.fn, "__name__", "function")
        if self.fn_fwd is None or self.fn_bwd is None:
            raise RuntimeError(
                f"filter_custom_vjp({name}): define both passes with `@{name}.def_fwd` and "
                f"`@{name}.def_bwd` before calling it."
            )
        diff, rest = partition(vjp_arg, is_inexact_array)
        diff_leaves, diff_def = jtu.tree_flatten(diff)
        dynamic, split = split_tree((rest, args, kwargs))
        fn, fn_fwd, fn_bwd = self.fn, self.fn_fwd, self.fn_bwd
        out_def: list[Any] = []
        res_static: list[Any] = []

        def rebuild(
            d_leaves: list[Any], dyn: list[Any]
        ) -> tuple[Any, tuple[Any, ...], dict[Any, Any]]:
            rest_, a, k = split.rebuild(dyn)
            return combine(jtu.tree_unflatten(diff_def, d_leaves), rest_), a, k

        def flat_out(out: Any) -> list[Any]:
            out_leaves, out_treedef = jtu.tree_flatten(out)
            out_def[:] = [out_treedef]
            return out_leaves

        @jax.custom_vjp
        def primal(d_leaves: list[Any], dyn: list[Any]) -> list[Any]:
            x, a, k = rebuild(d_leaves, dyn)
            return flat_out(fn(x, *a, **k))

        def fwd(d_leaves: list[Any], dyn: list[Any]) -> tuple[list[Any], Any]:
            perturbed = jtu.tree_unflatten(diff_def, [True] * len(d_leaves))
            x, a, k = rebuild(d_leaves, dyn)
            out, residuals = fn_fwd(perturbed, x, *a, **k)
            # Residuals may hold non-arrays (Equinox allows it): they wait here, not in JAX.
            res_dynamic, static_part = partition(residuals, is_array)
            res_static[:] = [static_part]
            return flat_out(out), (res_dynamic, d_leaves, dyn)

        def bwd(saved: tuple[Any, ...], cotangents: list[Any]) -> tuple[list[Any], list[Any]]:
            res_dynamic, d_leaves, dyn = saved
            residuals = combine(res_dynamic, res_static[0])
            perturbed = jtu.tree_unflatten(diff_def, [True] * len(d_leaves))
            x, a, k = rebuild(d_leaves, dyn)
            grad_obj = jtu.tree_unflatten(out_def[0], cotangents)
            grads = fn_bwd(residuals, grad_obj, perturbed, x, *a, **k)
            grad_diff = filter_like(grads, diff, name)
            g_leaves = [
                jax.numpy.zeros_like(p) if g is None else jax.numpy.asarray(g, p.dtype)
                for g, p in zip(grad_diff, d_leaves, strict=True)
            ]
            return g_leaves, [None] * len(dyn)

        primal.defvjp(fwd, bwd)
        out_leaves = primal(diff_leaves, dynamic)
        return jtu.tree_unflatten(out_def[0], out_leaves)  # type: ignore[no-any-return]


def filter_like(grads: Any, diff: Any, name: str) -> list[Any]:
    """The gradient leaves at the differentiated positions of `diff` (`None` for missing)."""
    found: list[Any] = []

    def collect(d: Any, g: Any) -> None:
        if d is not None:
            found.append(g)

    try:
        jtu.tree_map(collect, diff, grads, is_leaf=lambda x: x is None)
    except ValueError as e:
        raise ValueError(
            f"filter_custom_vjp({name}): fn_bwd must return a gradient with the structure of "
            f"vjp_arg (None where there is none): {e}"
        ) from None
    return found
