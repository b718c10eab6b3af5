"""Axis specs of the mapping transforms (`filter_vmap`, `filter_pmap`): `if_array`, expanding a
spec over the arguments' leaves, and the errors that name the arguments involved.

Shared by `vmap.py` and `pmap.py`; the messages name the public transform they serve.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from treemod._format.paths import render_path
from treemod._tree.filters import IS_ARRAY_TYPE, is_array_like

__all__ = [
    "argument_paths",
    "expand_axes",
    "if_array",
    "is_axis_spec",
    "is_size_error",
    "mapped_size_error",
    "name_arguments",
    "named_axes",
]


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


def is_axis_spec(x: Any) -> bool:
    return x is None or isinstance(x, int) or (callable(x) and not isinstance(x, list | tuple))


def expand_axes(
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
    if is_axis_spec(spec):
        pairs = [(spec, tree, ())]
    else:
        try:
            pairs = []
            jtu.tree_map_with_path(
                lambda p, s, sub: pairs.append((s, sub, p)), spec, tree, is_leaf=is_axis_spec
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


def named_axes(
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
    axes = expand_axes(positional, args, "in_axes", name, (jtu.SequenceKey(1),), transform)
    return axes + expand_axes(keyword, kwargs, "in_axes", name, (jtu.SequenceKey(2),), transform)


def argument_paths(fun: Callable[..., Any], tree: Any, mask: tuple[bool, ...]) -> list[str]:
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


def name_arguments(
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
    paths = argument_paths(fun, tree, mask)

    def rename(match: re.Match[str]) -> str:
        i = int(match.group(1))
        return paths[i] if i < len(paths) else match.group(0)

    message = re.sub(r"dyn\[(\d+)\]", rename, str(error))
    if transform != "filter_vmap":  # JAX's message is vmap's (see mapped_size_error)
        message = re.sub(r"^vmap ", f"{transform.removeprefix('filter_')} ", message)
    no_axis = [
        f"{path}, of shape {jnp.shape(x)}, has no axis {axis}"
        for path, (x, axis) in zip(paths, mapped, strict=True)
        if not -jnp.ndim(x) <= axis < jnp.ndim(x)
    ]
    if no_axis:
        message = f"in_axes maps an axis an argument lacks: {'; '.join(no_axis)} ({message})"
    return ValueError(f"{transform}({name}): {message}")


def is_size_error(error: Exception) -> bool:
    text = str(error)
    return "dyn[" in text or "requested to map its argument along axis" in text


def mapped_size_error(
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
        if is_size_error(e):
            return name_arguments(e, fun, name, tree, mask, mapped, transform)
    return None
