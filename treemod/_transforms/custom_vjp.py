"""`filter_custom_vjp`: a custom backward pass for a function of arbitrary pytrees (Equinox API)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, Concatenate, Generic, TypeVar

import jax
import jax.tree_util as jtu
from jax.custom_derivatives import SymbolicZero

from treemod._format.paths import render_path
from treemod._transforms.jit_sharing import SharedByIdentity
from treemod._transforms.leaves import merge_leaves, split_leaves, split_tree
from treemod._transforms.wrapper import P, R, reduce_by_name
from treemod._tree.filters import (
    IS_ARRAY_TYPE,
    combine,
    is_inexact_traceable_array,
    is_traceable_array,
    partition,
)

__all__ = ["filter_custom_vjp"]


_A = TypeVar("_A")


class filter_custom_vjp(Generic[_A, P, R], SharedByIdentity):  # noqa: N801 (Equinox's name)
    """Define a custom backward pass for a function, differentiating its first argument.

    Equinox's API: decorate `fn(vjp_arg, *args, **kwargs)`, then define
    `fn_fwd(perturbed, vjp_arg, *args, **kwargs) -> (out, residuals)` with `.def_fwd` and
    `fn_bwd(residuals, grad_obj, perturbed, vjp_arg, *args, **kwargs) -> grad_vjp_arg` with
    `.def_bwd`. Floating-point arrays of `vjp_arg` are differentiated; `perturbed` has the
    structure of `vjp_arg`, with `True` at each of its floating-point arrays that is being
    differentiated and `False` everywhere else. `grad_obj` is the cotangent of the output,
    `None` at leaves that are not floating-point arrays or whose cotangent is a symbolic zero
    (an output the result does not depend on). `fn_bwd` returns a gradient with the structure
    of `vjp_arg` (`None` for leaves without one). The other arguments are not differentiated:
    differentiating one of their arrays is a `RuntimeError` naming it. Non-array leaves
    anywhere are static.

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

    def __reduce__(self) -> str:
        """Pickle by reference (module and name), as the other transformed functions do."""
        return reduce_by_name(self)

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
        diff, rest = partition(vjp_arg, is_inexact_traceable_array)
        diff_leaves, diff_def = jtu.tree_flatten(diff)
        dynamic, split = split_tree((rest, args, kwargs))
        fn, fn_fwd, fn_bwd = self.fn, self.fn_fwd, self.fn_bwd
        # What does not travel through JAX: the output's structure and static leaves, which
        # of its arrays are floating point, and the residuals' non-arrays and `perturbed`.
        out_plan: list[Any] = []
        held: list[Any] = []

        def rebuild(
            d_leaves: list[Any], dyn: list[Any]
        ) -> tuple[Any, tuple[Any, ...], dict[Any, Any]]:
            rest_, a, k = split.rebuild(dyn)
            return combine(jtu.tree_unflatten(diff_def, d_leaves), rest_), a, k

        def flat_out(out: Any) -> tuple[list[Any], list[Any]]:
            arrays, out_split = split_tree(out)
            inexact = [is_inexact_traceable_array(a) for a in arrays]
            out_plan[:] = [out_split, inexact]
            return split_leaves(arrays, inexact)  # only floating-point outputs have cotangents

        @jax.custom_vjp
        def primal(d_leaves: list[Any], dyn: list[Any]) -> tuple[list[Any], list[Any]]:
            x, a, k = rebuild(d_leaves, dyn)
            return flat_out(fn(x, *a, **k))

        def fwd(d_leaves: list[Any], dyn: list[Any]) -> tuple[Any, Any]:
            if any(p.perturbed for p in dyn):
                raise _differentiated_error(name, (rest, args, kwargs), dyn)
            d_values, dyn_values = [p.value for p in d_leaves], [p.value for p in dyn]
            perturbed = combine(
                jtu.tree_unflatten(diff_def, [p.perturbed for p in d_leaves]),
                jtu.tree_map(lambda _: False, rest),
            )
            x, a, k = rebuild(d_values, dyn_values)
            out, residuals = fn_fwd(perturbed, x, *a, **k)
            # Residuals may hold non-arrays (Equinox allows it): they wait here, not in JAX.
            res_dynamic, res_static = partition(residuals, is_traceable_array)
            held[:] = [res_static, perturbed]
            return flat_out(out), (res_dynamic, d_values, dyn_values)

        def bwd(saved: tuple[Any, ...], cts: tuple[list[Any], Any]) -> tuple[list[Any], Any]:
            res_dynamic, d_values, dyn_values = saved
            res_static, perturbed = held
            out_split, inexact = out_plan
            x, a, k = rebuild(d_values, dyn_values)
            # A symbolic zero (an output the loss does not use) is None, as a non-float is.
            diff_cts = [None if isinstance(c, SymbolicZero) else c for c in cts[0]]
            others = [None] * (len(inexact) - len(diff_cts))
            grad_obj = out_split.rebuild(
                merge_leaves(inexact, diff_cts, others), static_as_none=True
            )
            residuals = combine(res_dynamic, res_static)
            grads = fn_bwd(residuals, grad_obj, perturbed, x, *a, **k)
            g_leaves = [
                jax.numpy.zeros_like(p) if g is None else jax.numpy.asarray(g, p.dtype)
                for g, p in zip(filter_like(grads, diff, name), d_values, strict=True)
            ]
            return g_leaves, [None] * len(dyn_values)

        primal.defvjp(fwd, bwd, symbolic_zeros=True)
        diff_out, other_out = primal(diff_leaves, dynamic)
        out_split, inexact = out_plan
        return out_split.rebuild(merge_leaves(inexact, diff_out, other_out))  # type: ignore[no-any-return]


def _differentiated_error(name: str, tree: Any, dyn: list[Any]) -> RuntimeError:
    """The error for differentiating an argument other than `vjp_arg` (error path only)."""
    leaves = jtu.tree_flatten_with_path(tree)[0]
    arrays = [path for path, x in leaves if IS_ARRAY_TYPE[type(x)]]
    where = [render_path(p, "vjp_arg") for p, d in zip(arrays, dyn, strict=True) if d.perturbed]
    return RuntimeError(
        f"filter_custom_vjp({name}): {', '.join(where)} is being differentiated, but only the "
        "floating-point arrays of the first argument (vjp_arg) of a filter_custom_vjp "
        "function have a custom gradient. Move it into the first argument, or wrap it in "
        "jax.lax.stop_gradient if it needs no gradient."
    )


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
