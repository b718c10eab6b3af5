"""`filter_vmap`: `jax.vmap` over the arrays of arbitrary pytrees (axis specs: `axis_specs.py`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, overload

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from treemod._format.paths import function_name
from treemod._transforms.axis_specs import (
    expand_axes,
    if_array,
    is_axis_spec,
    is_size_error,
    name_arguments,
    named_axes,
)
from treemod._transforms.leaves import merge_leaves, split_leaves
from treemod._transforms.wrapper import P, R, TransformedFunction
from treemod._tree.filters import IS_ARRAY_TYPE

__all__ = ["filter_vmap"]


def _out_axis_error(name: str, treedef: Any, i: int, x: Any, axis: int, e: Exception) -> Any:
    """The error for an `out_axes` entry outside an output's axes, naming the output's path."""
    paths = jtu.tree_flatten_with_path(treedef.unflatten(range(treedef.num_leaves)))[0]
    path = jtu.keystr(paths[i][0])
    where = f"the output at {path}" if path else "the output"
    return ValueError(
        f"filter_vmap({name}): out_axes puts the mapped axis of {where} at axis "
        f"{axis}, but with it that output has only {x.ndim} axes (shape {tuple(x.shape)}, the "
        f"mapped axis first), so out_axes there must be in [-{x.ndim}, {x.ndim - 1}] ({e})."
    )


def _out_kind(x: Any, axis: int | None) -> str:
    """How an output leaf leaves the map: `mapped` along `axis`, `bcast` (an array given
    `None`), or `static`. A Python number given an axis becomes an array repeated along it
    (`expand_axes` gave the other non-array leaves `None`)."""
    if axis is not None:
        return "mapped"
    return "bcast" if IS_ARRAY_TYPE[type(x)] else "static"


class _VmapWrapper(TransformedFunction[P, R]):
    _tm_share_fields = ("_fun", ("_in_axes", "_out_axes", "_axis_name", "_axis_size"))

    def __init__(
        self,
        fun: Callable[P, R],
        in_axes: Any,
        out_axes: Any,
        axis_name: Hashable | None,
        axis_size: int | None,
    ) -> None:
        self._fun = fun
        self._in_axes = in_axes
        self._out_axes = out_axes
        self._axis_name = axis_name
        self._axis_size = axis_size
        self._name = function_name(fun)
        self._wraps(fun)

    def __call__(self, /, *args: P.args, **kwargs: P.kwargs) -> R:
        name, in_axes = self._name, self._in_axes
        if isinstance(in_axes, dict):
            axes = named_axes(self._fun, in_axes, args, kwargs, name)
        elif is_axis_spec(in_axes):
            axes = expand_axes(in_axes, args, "in_axes", name, (jtu.SequenceKey(1),))
            axes += expand_axes(in_axes, kwargs, "in_axes", name, (jtu.SequenceKey(2),))
        else:
            if not isinstance(in_axes, tuple):
                raise TypeError(
                    f"filter_vmap({name}): in_axes must be an int, None, a callable such as "
                    f"tm.if_array(0), or a tuple with one entry per positional argument; got "
                    f"{type(in_axes).__name__}."
                )
            if len(in_axes) != len(args):
                raise ValueError(
                    f"filter_vmap({name}): in_axes has {len(in_axes)} entries but the function "
                    f"was called with {len(args)} positional arguments."
                )
            axes = expand_axes(in_axes, args, "in_axes", name, (jtu.SequenceKey(1),))
            axes += expand_axes(if_array(0), kwargs, "in_axes", name, (jtu.SequenceKey(2),))
        leaves, treedef = jtu.tree_flatten((args, kwargs))
        mask = tuple(a is not None for a in axes)
        dynamic, static = split_leaves(leaves, mask)
        dyn_axes = [a for a in axes if a is not None]
        if not dynamic and self._axis_size is None:
            raise ValueError(
                f"filter_vmap({name}): no argument is batched (no array leaf has an integer "
                "in_axes). Pass axis_size=... to map a function of no batched inputs (for "
                "example to build an ensemble), or check in_axes."
            )
        plan: dict[str, Any] = {}
        fun, out_axes = self._fun, self._out_axes

        def inner(dyn: list[Any]) -> tuple[list[Any], list[Any]]:
            call_args, call_kwargs = jtu.tree_unflatten(treedef, merge_leaves(mask, dyn, static))
            out = fun(*call_args, **call_kwargs)
            out_leaves, out_def = jtu.tree_flatten(out)
            out_ax = expand_axes(out_axes, out, "out_axes", name, ())
            kinds = tuple(_out_kind(x, a) for x, a in zip(out_leaves, out_ax, strict=True))
            plan.update(treedef=out_def, kinds=kinds, axes=out_ax)
            plan["static"] = [x for x, k in zip(out_leaves, kinds, strict=True) if k == "static"]
            mapped = [
                jnp.asarray(x) for x, k in zip(out_leaves, kinds, strict=True) if k == "mapped"
            ]
            bcast = [x for x, k in zip(out_leaves, kinds, strict=True) if k == "bcast"]
            return mapped, bcast

        vmapped = jax.vmap(
            inner,
            in_axes=(dyn_axes,),
            out_axes=(0, None),
            axis_name=self._axis_name,
            axis_size=self._axis_size,
        )
        try:
            mapped, bcast = vmapped(dynamic)
        except ValueError as e:
            if not is_size_error(e):
                raise
            mapped_axes = list(zip(dynamic, dyn_axes, strict=True))
            raise name_arguments(e, self._fun, name, (args, kwargs), mask, mapped_axes) from None
        it_m, it_b, it_s = iter(mapped), iter(bcast), iter(plan["static"])
        out_leaves = []
        for i, (kind, axis) in enumerate(zip(plan["kinds"], plan["axes"], strict=True)):
            if kind == "mapped":
                x = next(it_m)
                if axis != 0:
                    try:
                        x = jnp.moveaxis(x, 0, axis)
                    except ValueError as e:
                        raise _out_axis_error(name, plan["treedef"], i, x, axis, e) from None
                out_leaves.append(x)
            elif kind == "bcast":
                out_leaves.append(next(it_b))
            else:
                out_leaves.append(next(it_s))
        return plan["treedef"].unflatten(out_leaves)  # type: ignore[no-any-return]


@overload
def filter_vmap(
    fun: Callable[P, R],
    *,
    in_axes: Any = ...,
    out_axes: Any = ...,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
) -> Callable[P, R]: ...


@overload
def filter_vmap(
    fun: None = None,
    *,
    in_axes: Any = ...,
    out_axes: Any = ...,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def filter_vmap(
    fun: Callable[P, R] | None = None,
    *,
    in_axes: Any = if_array(0),
    out_axes: Any = if_array(0),
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Vectorise a function over the arrays of arbitrary pytrees, like `jax.vmap`.

    By default every array argument is mapped over its axis 0 and everything else (Python
    values, functions, strings) is broadcast; array outputs are stacked on axis 0 and
    non-array outputs are returned as they are. A `Module` may be the function (its arrays are
    broadcast). Mapping a model constructor over keys builds an ensemble.

    Arguments:
        fun: the function; omit it to use `filter_vmap(in_axes=...)` as a decorator.
        in_axes: an int, `None`, a callable of a leaf (such as `tm.if_array(1)`) for all
            arguments, or a tuple with one pytree prefix per positional argument, whose leaves
            are such specs. Keyword arguments use `if_array(0)`. Or a dict from parameter
            names to such specs (Equinox's form; it names keyword arguments too); arguments
            it does not name use `if_array(0)`.
        out_axes: the same for the output (a pytree prefix of it). A Python number output
            given an int axis becomes an array repeated along it (as in Equinox).
        axis_name: a name for the mapped axis, for collectives such as `jax.lax.psum`.
        axis_size: the batch size, needed when no argument is mapped.

    Returns:
        The vectorised function.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> class Linear(tm.Module):
        ...     w: jax.Array
        ...     act: object
        >>> def make(key):
        ...     return Linear(jax.random.normal(key, (3,)), jnp.tanh)
        >>> ensemble = tm.filter_vmap(make)(jax.random.split(jax.random.key(0), 4))
        >>> ensemble.w.shape, ensemble.act is jnp.tanh
        ((4, 3), True)
        >>> run = tm.filter_vmap(lambda m, x: m.act(m.w @ x), in_axes=(tm.if_array(0), None))
        >>> run(ensemble, jnp.ones(3)).shape
        (4,)
    """
    if fun is None:
        return functools.partial(
            filter_vmap,
            in_axes=in_axes,
            out_axes=out_axes,
            axis_name=axis_name,
            axis_size=axis_size,
        )
    if not callable(fun):
        raise TypeError(f"filter_vmap expects a callable; got {type(fun).__name__}.")
    return _VmapWrapper(fun, in_axes, out_axes, axis_name, axis_size)
