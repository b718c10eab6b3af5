"""`filter_pure_callback`: call host Python code on arrays from inside transformed code."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np

from treemod._transforms.leaves import split_tree

__all__ = ["filter_pure_callback"]


def _is_struct(x: Any) -> bool:
    return isinstance(x, jax.ShapeDtypeStruct)


def filter_pure_callback(
    callback: Callable[..., Any],
    /,
    *args: Any,
    result_shape_dtypes: Any,
    vmap_method: str | None = None,
    **kwargs: Any,
) -> Any:
    """`jax.pure_callback` for arguments and results that are arbitrary pytrees.

    Array leaves of the arguments reach `callback` as NumPy arrays; other leaves are passed
    through unchanged. The result must match `result_shape_dtypes`: a pytree whose
    `jax.ShapeDtypeStruct` leaves say which outputs are arrays (and their shapes and dtypes);
    its other leaves are returned as they are, and the callback must return equal values there
    (a mismatch is an error, as in Equinox).

    Arguments:
        callback: a pure Python function (no side effects: JAX may skip or repeat calls).
        *args: its positional arguments.
        result_shape_dtypes: the structure of the result, with `jax.ShapeDtypeStruct` leaves.
        vmap_method: as in `jax.pure_callback` (for example `"sequential"` or
            `"broadcast_all"`); `None` makes `vmap` of the callback an error.
        **kwargs: its keyword arguments.

    Returns:
        The callback's result, with arrays as JAX arrays.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np, treemod as tm
        >>> def host_fn(x, how):
        ...     return {"y": np.sort(x) if how == "sort" else x, "note": "done"}
        >>> @jax.jit
        ... def f(x):
        ...     shape = {"y": jax.ShapeDtypeStruct(x.shape, x.dtype), "note": "done"}
        ...     return tm.filter_pure_callback(host_fn, x, "sort", result_shape_dtypes=shape)["y"]
        >>> f(jnp.array([3.0, 1.0, 2.0]))
        Array([1., 2., 3.], dtype=float32)
    """
    dynamic, split = split_tree((args, kwargs))
    structs, res_split = split_tree(result_shape_dtypes, _is_struct, is_leaf=_is_struct)
    res_mask = res_split.mask
    res_with_paths = jtu.tree_flatten_with_path(result_shape_dtypes, is_leaf=_is_struct)[0]
    res_paths = [p for p, _ in res_with_paths]
    res_leaves = [leaf for _, leaf in res_with_paths]
    name = getattr(callback, "__name__", type(callback).__name__)

    def host(*dyn: Any) -> list[np.ndarray]:
        host_arrays = [np.asarray(x) for x in dyn]
        a, k = split.rebuild(host_arrays)
        out = callback(*a, **k)
        out_leaves = jtu.tree_leaves(out)
        if len(out_leaves) != len(res_mask):
            raise ValueError(
                f"filter_pure_callback({name}): the callback returned a tree with "
                f"{len(out_leaves)} leaves but result_shape_dtypes describes "
                f"{len(res_mask)}; they must have the same structure."
            )
        for path_leaf, x, expected, m in zip(
            res_paths, out_leaves, res_leaves, res_mask, strict=True
        ):
            if not m and x is not expected and not _same(x, expected):
                raise ValueError(
                    f"filter_pure_callback({name}): the callback returned {x!r} at "
                    f"{jtu.keystr(path_leaf)}, where result_shape_dtypes has the non-array value "
                    f"{expected!r}; non-array outputs must equal the ones declared."
                )
        arrays = [x for x, m in zip(out_leaves, res_mask, strict=True) if m]
        return [np.asarray(x, dtype=s.dtype) for x, s in zip(arrays, structs, strict=True)]

    flat = jax.pure_callback(host, structs, *dynamic, vmap_method=vmap_method)
    return res_split.rebuild(flat)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an `==` that does not give a bool (arrays): not the declared value
        return False
