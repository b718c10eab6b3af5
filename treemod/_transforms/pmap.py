"""`filter_pmap`: `jax.pmap` over the arrays of arbitrary pytrees (Equinox's)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, Literal, overload

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from treemod._format.paths import function_name
from treemod._transforms.axis_specs import (
    argument_paths,
    expand_axes,
    if_array,
    is_axis_spec,
    mapped_size_error,
    named_axes,
)
from treemod._transforms.leaves import merge_leaves, split_leaves
from treemod._transforms.unhashable import unhashable_error
from treemod._transforms.wrapper import P, R, TransformedFunction
from treemod._tree.filters import IS_ARRAY_TYPE

__all__ = ["filter_pmap"]

_DONATE = ("all", "warn", "none")
_PMAP = "filter_pmap"  # named in the errors of the axis specs shared with filter_vmap


class _PmapWrapper(TransformedFunction[P, R]):
    def __init__(
        self,
        fun: Callable[P, R],
        in_axes: Any,
        out_axes: Any,
        axis_name: Hashable | None,
        axis_size: int | None,
        donate: str,
        pmap_kwargs: dict[str, Any],
    ) -> None:
        self._fun: Callable[..., Any] = fun
        self._in_axes = in_axes
        self._out_axes = out_axes
        self._axis_name = axis_name
        self._axis_size = axis_size
        self._donate = donate
        self._pmap_kwargs = pmap_kwargs
        self._name = function_name(fun)
        # (treedef, axes, static leaves) -> (the pmapped function, its output plan)
        self._cache: dict[tuple[Any, ...], tuple[Callable[..., Any], dict[str, Any]]] = {}
        self._wraps(fun)

    def _axes(self, args: tuple[Any, ...], kwargs: dict[Any, Any]) -> list[int | None]:
        name, in_axes = self._name, self._in_axes
        args_root, kwargs_root = (jtu.SequenceKey(1),), (jtu.SequenceKey(2),)
        if isinstance(in_axes, dict):
            return named_axes(self._fun, in_axes, args, kwargs, name, _PMAP)
        if is_axis_spec(in_axes):
            return expand_axes(in_axes, args, "in_axes", name, args_root, _PMAP) + expand_axes(
                in_axes, kwargs, "in_axes", name, kwargs_root, _PMAP
            )
        if not isinstance(in_axes, tuple) or len(in_axes) != len(args):
            raise ValueError(
                f"filter_pmap({name}): in_axes must be an axis spec, a dict of parameter names, "
                f"or a tuple with one entry per positional argument ({len(args)} given); got "
                f"{in_axes!r}."
            )
        return expand_axes(in_axes, args, "in_axes", name, args_root, _PMAP) + expand_axes(
            if_array(0), kwargs, "in_axes", name, kwargs_root, _PMAP
        )

    def _compile(
        self,
        treedef: Any,
        mask: tuple[bool, ...],
        axes: tuple[int | None, ...],
        static: list[Any],
    ) -> tuple[Callable[..., Any], dict[str, Any]]:
        plan: dict[str, Any] = {}
        fun, out_axes, name = self._fun, self._out_axes, self._name

        def inner(dynamic: list[Any], dummy: Any) -> list[Any]:
            del dummy
            args, kwargs = jtu.tree_unflatten(treedef, merge_leaves(mask, dynamic, static))
            out = fun(*args, **kwargs)
            leaves, out_def = jtu.tree_flatten(out)
            out_ax = expand_axes(out_axes, out, "out_axes", name, (), _PMAP)
            # A Python number given an axis becomes an array repeated along it (as in vmap).
            leaves = [
                jnp.asarray(x) if a is not None else x for x, a in zip(leaves, out_ax, strict=True)
            ]
            is_array = tuple(IS_ARRAY_TYPE[type(x)] for x in leaves)
            plan.update(treedef=out_def, is_array=is_array)
            plan["axes"] = [a for a, arr in zip(out_ax, is_array, strict=True) if arr]
            plan["static"] = [x for x, arr in zip(leaves, is_array, strict=True) if not arr]
            return [x for x, arr in zip(leaves, is_array, strict=True) if arr]

        dyn_axes = [a for a, m in zip(axes, mask, strict=True) if m]
        # One trace: every array output comes back on axis 0 and is moved (or, for an
        # out_axes of None, its first copy taken) afterwards, so `out_axes` need not be
        # known before tracing. A function of no mapped array gets a dummy mapped argument.
        pmapped = jax.pmap(
            inner,
            in_axes=(dyn_axes, 0),
            out_axes=0,
            axis_name=self._axis_name,
            axis_size=self._axis_size,
            donate_argnums=(0,) if self._donate != "none" else (),
            **self._pmap_kwargs,
        )
        return pmapped, plan

    def _prepare(
        self, args: tuple[Any, ...], kwargs: dict[Any, Any]
    ) -> tuple[tuple[Callable[..., Any], dict[str, Any]], list[Any], Any]:
        """The compiled entry for these arguments, their mapped arrays, and the dummy."""
        axes = self._axes(args, kwargs)
        leaves, treedef = jtu.tree_flatten((args, kwargs))
        mask = tuple(IS_ARRAY_TYPE[type(x)] for x in leaves)
        dynamic, static = split_leaves(leaves, mask)
        if self._axis_size is None and not any(a is not None for a in axes):
            raise ValueError(
                f"filter_pmap({self._name}): no argument is mapped (no array leaf has an "
                "integer in_axes). Pass axis_size=... or check in_axes."
            )
        key = (treedef, tuple(axes), tuple(static))
        try:
            entry = self._cache.get(key)
        except TypeError:
            error = unhashable_error("filter_pmap", self._fun, (args, kwargs))
            if error is not None:
                raise error from None
            raise
        if entry is None:
            entry = self._compile(treedef, mask, tuple(axes), static)
            self._cache[key] = entry
        size = self._axis_size
        for x, a in zip(leaves, axes, strict=True):
            if a is not None and not -jnp.ndim(x) <= a < jnp.ndim(x):
                raise self._size_error(args, kwargs) or ValueError(
                    f"filter_pmap({self._name}): in_axes maps axis {a} of an argument of shape "
                    f"{jnp.shape(x)}, which has no such axis."
                )
        if size is None:  # the dummy's size: that of the first mapped axis
            size = next(jnp.shape(x)[a] for x, a in zip(leaves, axes, strict=True) if a is not None)
        return entry, dynamic, jnp.zeros((size,), jnp.bool_)

    def _size_error(self, args: tuple[Any, ...], kwargs: dict[Any, Any]) -> ValueError | None:
        """Error path: the error naming the arguments whose mapped axes disagree in size, that
        lack their axis, or whose size exceeds the devices (`jax.pmap` names none), or `None`
        if that is not the fault."""
        axes = self._axes(args, kwargs)
        leaves = jtu.tree_leaves((args, kwargs))
        mapped = [(x, a) for x, a in zip(leaves, axes, strict=True) if a is not None]
        mask = tuple(a is not None for a in axes)
        tree = (args, kwargs)
        error = mapped_size_error(_PMAP, self._fun, self._name, tree, mask, mapped, self._axis_size)
        if error is not None or not mapped:
            return error
        size = jnp.shape(mapped[0][0])[mapped[0][1]]
        devices = self._pmap_kwargs.get("devices") or jax.local_devices(
            backend=self._pmap_kwargs.get("backend")
        )
        if size <= len(devices):
            return None
        where = argument_paths(self._fun, tree, mask)[0]
        return ValueError(
            f"filter_pmap({self._name}): the mapped axes have size {size} (axis "
            f"{mapped[0][1]} of {where}, of shape {jnp.shape(mapped[0][0])}), but only "
            f"{len(devices)} devices are available: pmap puts one slice on each device. Map at "
            f"most {len(devices)} slices (reshape the batch to ({len(devices)}, -1, ...)), or "
            "shard the batch with filter_jit and filter_shard."
        )

    def _run(
        self, fn: Callable[..., Any], dynamic: list[Any], dummy: Any, args: Any, kwargs: Any
    ) -> Any:
        """`fn(dynamic, dummy)`; a failure caused by the arguments' sizes names them."""
        try:
            return fn(dynamic, dummy)
        except Exception:
            error = self._size_error(args, kwargs)
            if error is not None:
                raise error from None
            raise

    def __call__(self, /, *args: P.args, **kwargs: P.kwargs) -> R:
        (pmapped, plan), dynamic, dummy = self._prepare(args, kwargs)
        return _unpack(self._run(pmapped, dynamic, dummy, args, kwargs), plan)  # type: ignore[no-any-return]

    def lower(self, /, *args: P.args, **kwargs: P.kwargs) -> PmapLowered[P, R]:
        """Trace and lower for these arguments, for ahead-of-time compilation.

        Returns:
            A `PmapLowered` whose `.compile()` gives a callable taking arguments of the same
            structure, array shapes and non-array values; `.as_text()` shows the program.
        """
        (pmapped, plan), dynamic, dummy = self._prepare(args, kwargs)
        lowered = self._run(pmapped.lower, dynamic, dummy, args, kwargs)  # type: ignore[attr-defined]
        return PmapLowered(lowered, self, plan)


def _unpack(arrays: list[Any], plan: dict[str, Any]) -> Any:
    """The caller's output from the pmapped arrays: each moved to its out_axes (or, for
    `None`, its first copy taken), the static leaves put back."""
    arrays = [
        x[0] if axis is None else (x if axis == 0 else jnp.moveaxis(x, 0, axis))
        for x, axis in zip(arrays, plan["axes"], strict=True)
    ]
    it_a, it_s = iter(arrays), iter(plan["static"])
    out = [next(it_a) if arr else next(it_s) for arr in plan["is_array"]]
    return plan["treedef"].unflatten(out)


class PmapLowered(Generic[P, R]):
    """`filter_pmap(f).lower(*args)`: `.compile()` it; `.as_text()` shows the program."""

    def __init__(self, lowered: Any, wrapper: _PmapWrapper[P, R], plan: dict[str, Any]) -> None:
        self._lowered = lowered
        self._wrapper = wrapper
        self._plan = plan

    def as_text(self) -> str:
        """The lowered program's text (StableHLO)."""
        return self._lowered.as_text()  # type: ignore[no-any-return]

    def compile(self) -> Callable[P, R]:
        """Compile; the result takes arguments like those `lower` was given."""
        compiled, wrapper, plan = self._lowered.compile(), self._wrapper, self._plan

        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            _, dynamic, dummy = wrapper._prepare(args, kwargs)
            out = wrapper._run(compiled, dynamic, dummy, args, kwargs)
            return _unpack(out, plan)  # type: ignore[no-any-return]

        return run


@overload
def filter_pmap(
    fun: Callable[P, R],
    *,
    in_axes: Any = ...,
    out_axes: Any = ...,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
    donate: Literal["all", "warn", "none"] = "none",
    **pmap_kwargs: Any,
) -> Callable[P, R]: ...


@overload
def filter_pmap(
    fun: None = None,
    *,
    in_axes: Any = ...,
    out_axes: Any = ...,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
    donate: Literal["all", "warn", "none"] = "none",
    **pmap_kwargs: Any,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def filter_pmap(
    fun: Callable[P, R] | None = None,
    *,
    in_axes: Any = if_array(0),
    out_axes: Any = if_array(0),
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
    donate: Literal["all", "warn", "none"] = "none",
    **pmap_kwargs: Any,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """`jax.pmap` for functions of any pytrees: arrays are split across devices, the rest static.

    Axis specs are as for `filter_vmap` (an int, `None`, a callable of a leaf, a tuple per
    positional argument, or a dict keyed by parameter name); arrays given `None` are sent whole
    to every device. Non-array leaves are static: a new value compiles a new version. Outputs
    may hold non-array leaves. Prefer `filter_jit` with sharding (`filter_shard`) in new code,
    as JAX does for `jax.pmap`.

    Arguments:
        fun: the function; omit it to use `filter_pmap(...)` as a decorator.
        in_axes: which axis of each input array is split over devices.
        out_axes: where the device axis goes in each output array.
        axis_name: a name for the device axis, for collectives such as `jax.lax.psum`.
        axis_size: the number of devices, needed when no argument is mapped.
        donate: `"all"` or `"warn"` lets XLA reuse the argument arrays' buffers.
        **pmap_kwargs: passed on to `jax.pmap` (`devices=`, `backend=`).

    Returns:
        The parallelised function; its `.lower(*args)` traces and lowers it for these
        arguments (ahead-of-time compilation: `.compile()` on the result).

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> f = tm.filter_pmap(lambda x, name: (x * 2, name), axis_size=1,
        ...                    devices=jax.devices()[:1])
        >>> f(jnp.ones((1, 3)), "twice")
        (Array([[2., 2., 2.]], dtype=float32), 'twice')
    """
    if donate not in _DONATE:
        raise ValueError(f"filter_pmap: donate must be one of {_DONATE}; got {donate!r}.")
    for reserved in ("static_broadcasted_argnums", "donate_argnums"):
        if reserved in pmap_kwargs:
            raise ValueError(
                f"filter_pmap: {reserved} is not accepted; non-array leaves are static already "
                "and donation is chosen with donate=."
            )
    if fun is None:
        return lambda f: filter_pmap(
            f,
            in_axes=in_axes,
            out_axes=out_axes,
            axis_name=axis_name,
            axis_size=axis_size,
            donate=donate,
            **pmap_kwargs,
        )
    return _PmapWrapper(fun, in_axes, out_axes, axis_name, axis_size, donate, pmap_kwargs)
