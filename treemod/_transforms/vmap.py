"""`filter_vmap` and `if_array`: `jax.vmap` over the arrays of arbitrary pytrees."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Hashable
from typing import Any, overload

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from treemod._format.paths import function_name, render_path
from treemod._transforms.leaves import merge_leaves, split_leaves
from treemod._transforms.wrapper import P, R, TransformedFunction
from treemod._tree.filters import IS_ARRAY_TYPE, is_array_like

__all__ = ["filter_vmap", "if_array"]


class if_array:  # noqa: N801 (Equinox's name)
    """An axis spec for `filter_vmap`: `axis` for arrays, `None` (broadcast) for anything else.

    Arguments:
        axis: the axis to map over for array leaves.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> spec = tm.if_array(0)
        >>> spec(jnp.zeros(3)), spec("relu")
        (0, None)
    """

    def __init__(self, axis: int) -> None:
        self.axis = axis

    def __call__(self, x: Any) -> int | None:
        return self.axis if IS_ARRAY_TYPE[type(x)] else None

    def __repr__(self) -> str:
        return f"if_array({self.axis})"

    def __eq__(self, other: object) -> bool:
        return type(other) is if_array and other.axis == self.axis

    def __hash__(self) -> int:
        return hash((if_array, self.axis))


def _is_spec(x: Any) -> bool:
    return x is None or isinstance(x, int) or (callable(x) and not isinstance(x, list | tuple))


def _expand_axes(
    spec: Any,
    tree: Any,
    what: str,
    name: str,
    root: tuple[Any, ...],
    transform: str = "filter_vmap",
) -> list[int | None]:
    """One axis (or None) per leaf of `tree`, from a prefix `spec` of it (`transform`: the
    public transform the errors name)."""
    axes: list[int | None] = []
    if _is_spec(spec):
        pairs = [(spec, tree, ())]
    else:
        try:
            pairs = []
            jtu.tree_map_with_path(
                lambda p, s, sub: pairs.append((s, sub, p)), spec, tree, is_leaf=_is_spec
            )
        except ValueError as e:
            raise ValueError(
                f"{transform}({name}): {what} must be a pytree prefix of the "
                f"{'arguments' if what == 'in_axes' else 'output'}: {e}"
            ) from None

    def where(path: tuple[Any, ...]) -> str:
        if what == "out_axes":
            return "the output" + jtu.keystr(path)
        return render_path(root + path)

    for s, sub, prefix in pairs:
        for path, leaf in jtu.tree_flatten_with_path(sub)[0]:
            axis = s(leaf) if callable(s) and not isinstance(s, int) else s
            if axis is not None and not isinstance(axis, int):
                raise TypeError(
                    f"{transform}({name}): {what} gave {axis!r} for "
                    f"{where(tuple(prefix) + tuple(path))}; axes are ints or None."
                )
            if axis is not None and not IS_ARRAY_TYPE[type(leaf)]:
                if what == "out_axes":
                    if not is_array_like(leaf):
                        axis = None  # non-array outputs are returned unbatched
                else:
                    raise ValueError(
                        f"{transform}({name}): in_axes maps axis {axis} of "
                        f"{where(tuple(prefix) + tuple(path))}, which is a "
                        f"{type(leaf).__name__}, not an array. Only arrays can be batched: give "
                        "it None (or use tm.if_array(0))."
                    )
            axes.append(axis)
    return axes


def _named_axes(
    fun: Callable[..., Any],
    in_axes: dict[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[Any, Any],
    name: str,
    transform: str = "filter_vmap",
) -> list[int | None]:
    """Per-leaf axes from a dict `in_axes` keyed by parameter name (Equinox's form).

    Positional arguments are named by the function's signature, keyword arguments by their
    keyword; arguments the dict does not name get `if_array(0)`.
    """
    import inspect  # only this path needs it

    remaining = dict(in_axes)
    try:
        params = list(inspect.signature(fun).parameters)
    except (TypeError, ValueError):
        params = []
    positional = tuple(remaining.pop(p, if_array(0)) for p, _ in zip(params, args, strict=False))
    positional += (if_array(0),) * (len(args) - len(positional))
    keyword = {k: remaining.pop(k, if_array(0)) for k in kwargs}
    if remaining:
        raise ValueError(
            f"{transform}({name}): in_axes names {sorted(remaining)}, which are not arguments "
            f"of this call (positional parameters given: {params[: len(args)]}, keywords: "
            f"{sorted(kwargs)}). Pass every named argument (defaults are not mapped)."
        )
    axes = _expand_axes(positional, args, "in_axes", name, (jtu.SequenceKey(1),), transform)
    return axes + _expand_axes(keyword, kwargs, "in_axes", name, (jtu.SequenceKey(2),), transform)


def _argument_paths(fun: Callable[..., Any], tree: Any, mask: tuple[bool, ...]) -> list[str]:
    """The argument path of each leaf of `tree` = `(args, kwargs)` that `mask` selects
    (`args[1]['w'] (parameter 'b')`, `kwargs['c']`). Error path only."""
    try:
        params = [
            p.name
            for p in inspect.signature(fun).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    paths = []
    for (path, _), is_mapped in zip(jtu.tree_flatten_with_path(tree)[0], mask, strict=True):
        if is_mapped:
            text = render_path((jtu.SequenceKey(path[0].idx + 1), *path[1:]))
            if path[0].idx == 0 and len(path) > 1 and path[1].idx < len(params):
                text += f" (parameter {params[path[1].idx]!r})"
            paths.append(text)
    return paths


def _name_arguments(
    error: ValueError,
    fun: Callable[..., Any],
    name: str,
    tree: Any,
    mask: tuple[bool, ...],
    mapped: list[tuple[Any, int]],
    transform: str = "filter_vmap",
) -> ValueError:
    """JAX's error with `dyn[i]` (treemod's list of mapped arrays) replaced by each array's
    argument path (`args[1]`, `kwargs['x']`, with the parameter's name); for an axis an array
    does not have, the arrays at fault named first. `mapped`: `(array, axis)` of each mapped
    array; `transform`: the public transform (`filter_pmap` says `pmap got inconsistent
    sizes`). Error path only."""
    paths = _argument_paths(fun, tree, mask)

    def rename(match: re.Match[str]) -> str:
        i = int(match.group(1))
        return paths[i] if i < len(paths) else match.group(0)

    message = re.sub(r"dyn\[(\d+)\]", rename, str(error))
    if transform != "filter_vmap":  # JAX's message is vmap's (see _mapped_size_error)
        message = re.sub(r"^vmap ", f"{transform.removeprefix('filter_')} ", message)
    no_axis = [
        f"{path}, of shape {jnp.shape(x)}, has no axis {axis}"
        for path, (x, axis) in zip(paths, mapped, strict=True)
        if not -jnp.ndim(x) <= axis < jnp.ndim(x)
    ]
    if no_axis:
        message = f"in_axes maps an axis an argument lacks: {'; '.join(no_axis)} ({message})"
    return ValueError(f"{transform}({name}): {message}")


def _is_size_error(error: Exception) -> bool:
    text = str(error)
    return "dyn[" in text or "requested to map its argument along axis" in text


def _mapped_size_error(
    transform: str,
    fun: Callable[..., Any],
    name: str,
    tree: Any,
    mask: tuple[bool, ...],
    mapped: list[tuple[Any, int]],
    axis_size: int | None,
) -> ValueError | None:
    """The error naming the arguments whose mapped axes disagree in size (or that lack their
    axis), as `filter_vmap` gives it, or `None` if they agree. JAX's own size check (that of
    `jax.vmap`, on shapes only) makes the message. For transforms whose JAX error names no
    argument (`filter_pmap`: `jax.pmap` fails while placing the arrays). Error path only.

    Arguments:
        transform: the public transform, for the message.
        fun: the mapped function (its parameter names go into the message).
        name: its name.
        tree: `(args, kwargs)` of the call.
        mask: which leaves of `tree` are mapped.
        mapped: `(array, axis)` of each mapped leaf.
        axis_size: the size given, if any.

    Returns:
        The error, or `None`.
    """
    axes = [a for _, a in mapped]
    check = jax.vmap(lambda dyn: dyn, in_axes=(axes,), axis_size=axis_size)
    try:
        jax.eval_shape(check, [x for x, _ in mapped])
    except ValueError as e:
        if _is_size_error(e):
            return _name_arguments(e, fun, name, tree, mask, mapped, transform)
    return None


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
    (`_expand_axes` gave the other non-array leaves `None`)."""
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
            axes = _named_axes(self._fun, in_axes, args, kwargs, name)
        elif _is_spec(in_axes):
            axes = _expand_axes(in_axes, args, "in_axes", name, (jtu.SequenceKey(1),))
            axes += _expand_axes(in_axes, kwargs, "in_axes", name, (jtu.SequenceKey(2),))
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
            axes = _expand_axes(in_axes, args, "in_axes", name, (jtu.SequenceKey(1),))
            axes += _expand_axes(if_array(0), kwargs, "in_axes", name, (jtu.SequenceKey(2),))
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
            out_ax = _expand_axes(out_axes, out, "out_axes", name, ())
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
            if not _is_size_error(e):
                raise
            mapped_axes = list(zip(dynamic, dyn_axes, strict=True))
            raise _name_arguments(e, self._fun, name, (args, kwargs), mask, mapped_axes) from None
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
