"""`filter_closure_convert`: a function whose closed-over arrays become pytree leaves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu

from treemod._format.describe import describe_value
from treemod._format.paths import function_name
from treemod._module.module import Module, field
from treemod._private_apis import eval_jaxpr
from treemod._transforms.leaves import merge_leaves, split_leaves
from treemod._tree.filters import IS_ARRAY_TYPE

__all__ = ["filter_closure_convert"]


class _ClosureConverted(Module):
    """`fn` traced for one argument structure; its closed-over arrays are the leaves `consts`."""

    consts: list[Any]
    jaxpr: Any = field(static=True)
    name: str = field(static=True)
    in_treedef: Any = field(static=True)
    in_mask: tuple[bool, ...] = field(static=True)
    in_static: tuple[Any, ...] = field(static=True)
    in_avals: tuple[Any, ...] = field(static=True)
    out_treedef: Any = field(static=True)
    out_mask: tuple[bool, ...] = field(static=True)
    out_static: tuple[Any, ...] = field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, treedef = jtu.tree_flatten((args, kwargs))
        mask = tuple(IS_ARRAY_TYPE[type(x)] for x in leaves)
        dynamic, static = split_leaves(leaves, mask)
        avals = tuple((jax.numpy.shape(x), jax.numpy.result_type(x)) for x in dynamic)
        if (treedef, mask, tuple(static), avals) != (
            self.in_treedef,
            self.in_mask,
            self.in_static,
            self.in_avals,
        ):
            raise ValueError(
                f"filter_closure_convert({self.name}): called with arguments "
                f"{describe_value((args, kwargs))}, whose structure, non-array values or array "
                "shapes and dtypes differ from the example arguments it was converted with. "
                "Convert it again with these arguments."
            )
        out_dynamic = eval_jaxpr(self.jaxpr, self.consts, *dynamic)
        out = merge_leaves(self.out_mask, out_dynamic, self.out_static)
        return self.out_treedef.unflatten(out)


def filter_closure_convert(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`jax.closure_convert` for any pytrees: closed-over arrays become the result's leaves.

    `fn` is traced once with the example arguments. The returned callable is a module whose
    leaves are every array `fn` closes over (tracers of an enclosing transform included), so
    it can be passed through `jax.custom_vjp`, `lax` control flow or `filter_jit` as an
    ordinary pytree. Call it with arguments of the same structure, non-array values, shapes
    and dtypes.

    Arguments:
        fn: the function.
        *args: example positional arguments.
        **kwargs: example keyword arguments.

    Returns:
        A callable pytree computing `fn`.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> w = jnp.array([1.0, 2.0])
        >>> g = tm.filter_closure_convert(lambda x: w * x, jnp.ones(2))
        >>> jax.tree_util.tree_leaves(g)
        [Array([1., 2.], dtype=float32)]
        >>> g(jnp.array([3.0, 3.0]))
        Array([3., 6.], dtype=float32)
    """
    leaves, in_treedef = jtu.tree_flatten((args, kwargs))
    in_mask = tuple(IS_ARRAY_TYPE[type(x)] for x in leaves)
    dynamic, static = split_leaves(leaves, in_mask)
    out_info: dict[str, Any] = {}

    def flat(*dyn: Any) -> list[Any]:
        call_args, call_kwargs = jtu.tree_unflatten(in_treedef, merge_leaves(in_mask, dyn, static))
        out_leaves, out_info["treedef"] = jtu.tree_flatten(fn(*call_args, **call_kwargs))
        out_info["mask"] = tuple(IS_ARRAY_TYPE[type(x)] for x in out_leaves)
        out_dynamic, out_info["static"] = split_leaves(out_leaves, out_info["mask"])
        return out_dynamic

    closed = jax.make_jaxpr(flat)(*dynamic)
    avals = tuple((jax.numpy.shape(x), jax.numpy.result_type(x)) for x in dynamic)
    return _ClosureConverted(
        list(closed.consts),
        closed.jaxpr,
        function_name(fn),
        in_treedef,
        in_mask,
        tuple(static),
        avals,
        out_info["treedef"],
        out_info["mask"],
        tuple(out_info["static"]),
    )
