"""Equinox's `tree_pformat`/`tree_pprint`: its defaults and its array text.

treemod's own printer writes arrays one way everywhere (`f32[3]`, in messages too), elides long
containers, and summarises `ShapeDtypeStruct`s. Equinox's writes weakly typed arrays as
`weak_f32[]`, NumPy arrays as `f32[3](numpy)`, keeps every container entry, prints structs as
they are unless `struct_as_array=True`, and defaults to 80 columns. Code written for Equinox
compares those strings, so the compat namespace gives them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu
import wadler_lindig as wl

from ._bound_method import BoundMethod

__all__ = ["tree_pformat", "tree_pprint"]


@dataclasses.dataclass
class _Partial:
    func: Callable[..., Any]
    args: tuple[Any, ...]
    keywords: dict[str, Any]


_Partial.__name__ = _Partial.__qualname__ = "Partial"


@dataclasses.dataclass
class _BoundMethod:
    __func__: Callable[..., Any]
    __self__: Any


_BoundMethod.__name__ = _BoundMethod.__qualname__ = "BoundMethod"


def _never(_: Any) -> bool:
    return False


def _hook(
    short_arrays: bool, struct_as_array: bool, truncate_leaf: Callable[[Any], bool]
) -> Callable[[Any], Any]:
    def custom(obj: Any) -> Any:
        if truncate_leaf(obj):
            return wl.TextDoc(f"{type(obj).__name__}(...)")
        if short_arrays and (
            isinstance(obj, jax.Array)
            or (struct_as_array and isinstance(obj, jax.ShapeDtypeStruct))
        ):
            dtype = obj.dtype.name
            if getattr(obj, "weak_type", False):
                dtype = f"weak_{dtype}"
            return wl.array_summary(obj.shape, dtype, kind=None)
        if isinstance(obj, jax.custom_jvp | jax.custom_vjp):
            wrapped = getattr(obj, "__wrapped__", obj.fun)
            return wl.pdoc(wrapped, custom=custom, short_arrays=short_arrays)
        if isinstance(obj, jtu.Partial):  # as a dataclass `Partial(func=, args=, keywords=)`
            return wl.pdoc(_Partial(obj.func, obj.args, obj.keywords))
        if type(obj) is BoundMethod:  # a module in Equinox: `BoundMethod(__func__=, __self__=)`
            bound = _BoundMethod(obj.__func__, obj.__self__)
            return wl.pdoc(bound, custom=custom, short_arrays=short_arrays)
        return None

    return custom


def tree_pformat(
    pytree: Any,
    *,
    width: int = 80,
    indent: int = 2,
    short_arrays: bool = True,
    struct_as_array: bool = False,
    truncate_leaf: Callable[[Any], bool] = _never,
) -> str:
    """Format a pytree as Equinox does.

    Arguments:
        pytree: anything.
        width: the line width to fit.
        indent: how far each nesting level is indented.
        short_arrays: print arrays as `f32[2,3]` (weakly typed: `weak_f32[]`; NumPy:
            `f32[2](numpy)`), else with their values.
        struct_as_array: print `jax.ShapeDtypeStruct`s like arrays.
        truncate_leaf: nodes it holds for print as `TypeName(...)`.

    Returns:
        The formatted string.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> import treemod.compat.equinox as eqx
        >>> print(eqx.tree_pformat({"w": jnp.zeros(3), "n": np.arange(2)}))
        {'w': f32[3], 'n': i64[2](numpy)}
    """
    custom = _hook(short_arrays, struct_as_array, truncate_leaf)
    return wl.pformat(pytree, width=width, indent=indent, short_arrays=short_arrays, custom=custom)


def tree_pprint(
    pytree: Any,
    *,
    width: int = 80,
    indent: int = 2,
    short_arrays: bool = True,
    struct_as_array: bool = False,
    truncate_leaf: Callable[[Any], bool] = _never,
) -> None:
    """Print `tree_pformat(pytree, ...)` (Equinox's defaults and array text).

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> eqx.tree_pprint([jnp.ones((2, 2)), "relu"])
        [f32[2,2], 'relu']
    """
    print(
        tree_pformat(
            pytree,
            width=width,
            indent=indent,
            short_arrays=short_arrays,
            struct_as_array=struct_as_array,
            truncate_leaf=truncate_leaf,
        )
    )
