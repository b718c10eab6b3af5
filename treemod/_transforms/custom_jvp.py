"""`filter_custom_jvp`: a custom forward-mode derivative for a function of any pytrees."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax.custom_derivatives import SymbolicZero

from treemod._format.paths import function_name
from treemod._transforms.jit_sharing import SharedByIdentity
from treemod._transforms.leaves import split_tree
from treemod._transforms.wrapper import P, R, TransformedFunction
from treemod._tree.filters import is_inexact_traceable_array

__all__ = ["filter_custom_jvp"]


class filter_custom_jvp(TransformedFunction[P, R], SharedByIdentity):  # noqa: N801 (Equinox's name)
    """Define a custom JVP (forward-mode derivative) for a function of any pytrees.

    Equinox's API. Decorate `fn(*args, **kwargs)`, then define
    `fn_jvp(primals, tangents, **kwargs) -> (out, tangent_out)` with `.def_jvp`: `primals` is
    the tuple of positional arguments, and `tangents` has its structure with a tangent at each
    floating-point array and `None` everywhere else: at non-array leaves, integer arrays, and
    arrays whose tangent is known to be zero (those not being differentiated), so `fn_jvp` can
    skip their work. Keyword arguments are not differentiated. In `tangent_out`, `None` stands
    for a zero tangent. Reverse mode (`filter_grad`) works too: JAX transposes the JVP, so
    `tangent_out` must be linear in the tangents. The output must be arrays (a pytree of them).

    Arguments:
        fn: the primal function.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> @tm.filter_custom_jvp
        ... def log1pexp(x, activation):  # a static leaf passes through untouched
        ...     return jnp.log1p(jnp.exp(x))
        >>> @log1pexp.def_jvp
        ... def log1pexp_jvp(primals, tangents):
        ...     x, _ = primals
        ...     tx, _ = tangents
        ...     return log1pexp(x, None), jax.nn.sigmoid(x) * tx  # stable for large x
        >>> float(jax.grad(lambda x: log1pexp(x, jax.nn.relu))(jnp.array(100.0)))
        1.0
    """

    def __init__(self, fn: Callable[P, R]) -> None:
        self.fn: Callable[..., Any] = fn
        self.fn_jvp: Callable[..., Any] | None = None
        self._wraps(fn)

    def def_jvp(self, fn_jvp: Callable[..., Any]) -> Callable[..., Any]:
        """Set the JVP rule: `fn_jvp(primals, tangents, **kwargs) -> (out, tangent_out)`."""
        self.fn_jvp = fn_jvp
        return fn_jvp

    def __call__(self, /, *args: P.args, **kwargs: P.kwargs) -> R:
        fn, fn_jvp = self.fn, self.fn_jvp
        if fn_jvp is None:
            name = function_name(fn)
            raise RuntimeError(
                f"filter_custom_jvp({name}): define the JVP with `@{name}.def_jvp` before "
                "calling it."
            )
        arg_arrays, arg_split = split_tree(args)
        kw_arrays, kw_split = split_tree(kwargs)
        differentiable = [is_inexact_traceable_array(a) for a in arg_arrays]

        @jax.custom_jvp
        def call(arg_arrays: list[Any], kw_arrays: list[Any]) -> Any:
            return fn(*arg_split.rebuild(arg_arrays), **kw_split.rebuild(kw_arrays))

        def jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Any, Any]:
            arrays, kw = primals
            kept = [
                None if not d or isinstance(t, SymbolicZero) else t
                for d, t in zip(differentiable, tangents[0], strict=True)
            ]
            args_t = arg_split.rebuild(kept, static_as_none=True)
            out, t_out = fn_jvp(arg_split.rebuild(arrays), args_t, **kw_split.rebuild(kw))
            t_out = jtu.tree_map(  # a None stands for zeros, for a leaf or a whole subtree
                lambda t, o: jtu.tree_map(jnp.zeros_like, o) if t is None else t,
                t_out,
                out,
                is_leaf=lambda t: t is None,
            )
            return out, t_out

        call.defjvp(jvp, symbolic_zeros=True)
        return call(arg_arrays, kw_arrays)  # type: ignore[no-any-return]
