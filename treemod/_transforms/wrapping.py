"""Helpers shared by the filtered transforms: leaf kinds, key-path names, output packing.

Nothing here is public. The transforms split the leaves of `(fn, args, kwargs)` into arrays
(traced) and everything else (static), and rebuild outputs that may hold non-array leaves.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.tree_util as jtu

from treemod._tree.filters import IS_ARRAY_TYPE


class _Kinds(dict):
    """Maps a tuple of leaf types to `(sig_id, mask, negated_mask)`.

    `sig_id` names the tuple with array types erased, so two calls share a compiled version
    exactly when their static leaves have the same types (1 and 1.0 are different) while NumPy
    and JAX arrays are interchangeable.
    """

    def __init__(self) -> None:
        super().__init__()
        self.sig_ids: dict[tuple[Any, ...], int] = {}

    def __missing__(self, leaf_types: tuple[type, ...]) -> tuple[int, tuple[bool, ...], tuple]:
        mask = tuple(IS_ARRAY_TYPE[t] for t in leaf_types)
        sig = tuple(None if m else t for m, t in zip(mask, leaf_types, strict=True))
        sig_id = self.sig_ids.setdefault(sig, len(self.sig_ids))
        value = (sig_id, mask, tuple(not m for m in mask))
        self[leaf_types] = value
        return value


KINDS = _Kinds()


def is_abstract_array(x: Any) -> bool:
    """Whether `x` is an array or a `jax.ShapeDtypeStruct` standing for one."""
    return IS_ARRAY_TYPE[type(x)] or isinstance(x, jax.ShapeDtypeStruct)


def merge_leaves(mask: Sequence[bool], dynamic: Iterable[Any], static: Iterable[Any]) -> list[Any]:
    """Interleave dynamic and static leaves back into one list, following `mask`."""
    dyn, sta = iter(dynamic), iter(static)
    return [next(dyn) if m else next(sta) for m in mask]


def split_leaves(leaves: Iterable[Any], mask: Sequence[bool]) -> tuple[list[Any], list[Any]]:
    """The leaves where `mask` is true, and the others; `merge_leaves` undoes it."""
    kept: list[Any] = []
    others: list[Any] = []
    for x, m in zip(leaves, mask, strict=True):
        (kept if m else others).append(x)
    return kept, others


def _is_array_leaf(x: Any) -> bool:
    return IS_ARRAY_TYPE[type(x)]


def split_tree(
    tree: Any, keep: Callable[[Any], bool] = _is_array_leaf, is_leaf: Callable | None = None
) -> tuple[list[Any], Split]:
    """The leaves of `tree` that `keep` selects (arrays by default), and the `Split` holding the
    rest, which rebuilds the tree from new kept leaves: the filtered transforms' one mechanism."""
    leaves, treedef = jtu.tree_flatten(tree, is_leaf=is_leaf)
    mask = tuple(keep(x) for x in leaves)
    kept, others = split_leaves(leaves, mask)
    return kept, Split(treedef, mask, tuple(others))


def function_name(fn: Any) -> str:
    """A readable name for error messages and logs."""
    if isinstance(fn, types.MethodType):
        return getattr(fn, "__qualname__", None) or function_name(fn.__func__)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if isinstance(name, str):
        return name.rsplit("<locals>.", 1)[-1]
    return type(fn).__qualname__


def split_fn(fn: Any) -> tuple[Any, Callable[..., Any] | None]:
    """Normalise a callable into `(fn_tree, call)` once, at wrap time.

    `fn_tree` is the part of the callable that is a pytree (a Module, or the module of a bound
    method), whose arrays are traced like arguments; `None` for plain functions. `call` is the
    function to call as `call(fn_tree, *args, **kwargs)`, or `None` to call `fn_tree` itself.
    """
    if isinstance(fn, types.MethodType):
        owner = fn.__self__
        if jtu.treedef_is_leaf(jtu.tree_structure(owner)):
            return None, None
        return owner, fn.__func__
    if jtu.treedef_is_leaf(jtu.tree_structure(fn)):
        return None, None
    return fn, None


def render_path(path: Sequence[Any], fn_label: str = "self") -> str:
    """Render a key path into `(fn_tree, args, kwargs)` as `args[0].layers[2].weight`."""
    if not path:
        return "(arguments)"
    top = path[0].idx if isinstance(path[0], jtu.SequenceKey) else None
    rest = list(path[1:])
    if top == 0:
        return fn_label + jtu.keystr(tuple(rest))
    if top == 1 and not rest:
        return "positional arguments"
    if top == 2 and not rest:
        return "keyword arguments"
    if top == 1 and rest and isinstance(rest[0], jtu.SequenceKey):
        return f"args[{rest[0].idx}]" + jtu.keystr(tuple(rest[1:]))
    if top == 2 and rest and isinstance(rest[0], jtu.DictKey):
        return f"kwargs[{rest[0].key!r}]" + jtu.keystr(tuple(rest[1:]))
    return jtu.keystr(tuple(path))


def leaf_paths(tree: Any, fn_label: str = "self") -> list[str]:
    """Rendered key paths of every leaf of `(fn_tree, args, kwargs)` (slow; error paths only)."""
    return [render_path(p, fn_label) for p, _ in jtu.tree_flatten_with_path(tree)[0]]


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def unhashable_error(
    transform: str, fn: Any, tree: Any, fn_label: str = "self"
) -> TypeError | None:
    """Explain which static leaf or static field of `(fn_tree, args, kwargs)` is unhashable."""
    name = function_name(fn)
    for path, leaf in jtu.tree_flatten_with_path(tree)[0]:
        if not IS_ARRAY_TYPE[type(leaf)] and not _hashable(leaf):
            where = render_path(path, fn_label)
            return TypeError(
                f"{transform}({name}): the argument {where} is a {type(leaf).__name__}, which is "
                "not hashable. Non-array arguments are static: they are hashed to choose a "
                "compiled version. Make it hashable (a tuple, a frozen dataclass), pass it as "
                "an array, or close over it."
            )
    bad = _unhashable_node(tree, ())
    if bad is not None:
        path, node = bad
        fields = getattr(type(node), "__tm_static_fields__", ())
        culprits = [f for f in fields if not _hashable(getattr(node, f, None))]
        what = (
            f"the static field {type(node).__qualname__}.{culprits[0]}"
            if culprits
            else f"the tree node {type(node).__qualname__}"
        )
        return TypeError(
            f"{transform}({name}): at {render_path(path, fn_label)}, {what} holds an unhashable "
            "value. Static fields are part of the tree structure and must be hashable; use a "
            "tuple instead of a list, or make the field a normal (non-static) field."
        )
    return None


def _unhashable_node(node: Any, path: tuple) -> tuple[tuple, Any] | None:
    leaves, treedef = jtu.tree_flatten(node, is_leaf=lambda x: x is not node)
    if jtu.treedef_is_leaf(treedef):
        return None
    if not _hashable(treedef):
        # Look deeper first: the culprit is the innermost node whose structure does not hash.
        for child_path, child in jtu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)[
            0
        ]:
            found = _unhashable_node(child, path + tuple(child_path))
            if found is not None:
                return found
        return path, node
    return None


class TransformedFunction:
    """Base of the filtered transforms' wrappers (`filter_jit(f)`, `filter_grad(f)`, ...).

    A wrapper takes the name, docstring and `__wrapped__` of the function it wraps, so that
    `inspect` and the docs see that function, and binds like a function: set as a class
    attribute (a decorated method), it receives the instance as its first argument.
    """

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _wraps(self, fun: Any) -> None:
        if isinstance(fun, types.FunctionType | types.MethodType | functools.partial):
            functools.update_wrapper(self, fun, updated=())
        else:
            self.__wrapped__ = fun

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return types.MethodType(self, instance)


class Split:
    """A pytree with its kept leaves taken out (see `split_tree`); compared and hashed by identity.

    Attributes:
        treedef: the tree's structure.
        mask: for each leaf, whether it was kept.
        static: the other leaves, in order.
    """

    __slots__ = ("treedef", "mask", "static")

    def __init__(self, treedef: Any, mask: tuple[bool, ...], static: tuple[Any, ...]) -> None:
        self.treedef = treedef
        self.mask = mask
        self.static = static

    def rebuild(self, kept: Iterable[Any], *, static_as_none: bool = False) -> Any:
        """The tree with `kept` in place of the kept leaves, and its other leaves (or `None`
        in their place, as in a tangent or a shape description)."""
        static = [None] * len(self.static) if static_as_none else self.static
        return self.treedef.unflatten(merge_leaves(self.mask, kept, static))


class Packed:
    """A traced function's output with its non-array leaves moved into the tree structure.

    Its unflatten rebuilds the caller's output directly, so `jax.eval_shape` or
    `jax.checkpoint` hands back the user's tree with no further Python in the wrapper.
    """

    __slots__ = ("arrays", "plan")

    def __init__(self, arrays: list[Any], plan: Split) -> None:
        self.arrays = arrays
        self.plan = plan


class HeldPacked(Packed):
    """A `Packed` that stays packed through unflatten, for compiled calls: JAX's C++ dispatch
    only takes outputs whose leaves are all arrays, and one float or function leaf sends every
    call down its Python path (about ten times slower). `unpack_output` rebuilds the tree after
    the call."""

    __slots__ = ()


def _flatten_packed(p: Packed) -> tuple[list[Any], Split]:
    return p.arrays, p.plan


jtu.register_pytree_node(Packed, _flatten_packed, lambda plan, arrays: plan.rebuild(arrays))
jtu.register_pytree_node(HeldPacked, _flatten_packed, lambda plan, a: HeldPacked(list(a), plan))


def pack_output(out: Any, *, held: bool = False) -> Any:
    """Return `out` unchanged if all its leaves are arrays, else a `Packed` (or, if `held`, a
    `HeldPacked`) stand-in for it."""
    arrays, plan = split_tree(out)
    if all(plan.mask):
        return out
    return HeldPacked(arrays, plan) if held else Packed(arrays, plan)


def unpack_output(out: Any) -> Any:
    """The caller's output from what a compiled call returned (see `HeldPacked`)."""
    return out.plan.rebuild(out.arrays) if type(out) is HeldPacked else out
