"""`tree_at`: a copy of a pytree with some of its nodes or leaves replaced."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.tree_util as jtu

from treemod._shapecheck.checker import check_fields
from treemod._tree.module_info import check_descendants, is_module, static_field_names

_SENTINEL = object()


class _Marker:
    """A unique stand-in for one node of the tree, so `where` can point at it by identity."""

    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # protocol probes (`__array__`, ...): plainly absent
            raise AttributeError(name)
        raise _LeafUsed(self.path, f"`.{name}`")

    def __getitem__(self, key: Any) -> Any:
        raise _LeafUsed(self.path, f"`[{key!r}]`")

    def __bool__(self) -> bool:  # true, as any object (and not `len()`, which raises)
        return True


class _EmptyMarker(_Marker):
    """The stand-in for an empty subtree (`None`, `()`): a pytree node without children, so
    collecting leaves (`jax.tree_util.tree_leaves(m)`) never picks it, as it never picks
    `None`, while `where` can still select it by attribute or index (`lambda m: m.bias`)."""

    __slots__ = ()


jtu.register_pytree_node(_EmptyMarker, lambda m: ((), m.path), lambda path, _: _EmptyMarker(path))


def _operator(symbol: str) -> Callable[..., Any]:
    def use(self: _Marker, *_: Any) -> Any:
        raise _LeafUsed(self.path, symbol)

    return use


# Arithmetic, comparisons and conversions on a leaf name it too (`m.weight + 1`, `-m.bias`).
# `==`, `hash` and `bool` keep their defaults: nodes are found by identity.
for _names, _symbol in (
    (("add", "radd"), "`+`"),
    (("sub", "rsub"), "`-`"),
    (("mul", "rmul"), "`*`"),
    (("truediv", "rtruediv"), "`/`"),
    (("floordiv", "rfloordiv"), "`//`"),
    (("mod", "rmod"), "`%`"),
    (("pow", "rpow"), "`**`"),
    (("matmul", "rmatmul"), "`@`"),
    (("lt", "le", "gt", "ge"), "a comparison"),
    (("neg",), "unary `-`"),
    (("pos",), "unary `+`"),
    (("abs",), "`abs()`"),
    (("invert",), "`~`"),
    (("len",), "`len()`"),
    (("iter",), "iteration"),
    (("float",), "`float()`"),
    (("int",), "`int()`"),
    (("index",), "`int()`"),
    (("complex",), "`complex()`"),
    (("array",), "a NumPy function (np.asarray, ...)"),
):
    for _name in _names:
        setattr(_Marker, f"__{_name}__", _operator(_symbol))
del _names, _symbol, _name


class _LeafUsed(AttributeError):
    """`where` computed with a leaf instead of returning it."""

    def __init__(self, path: str, what: str):
        super().__init__(path, what)
        self.path, self.what = path, what


class WhereComputedError(TypeError):
    """`where` computed with a leaf of the tree instead of selecting nodes."""


class NotANodeError(ValueError):
    """`where` returned something that is not a node of the tree (a static field, a constant)."""


def _computing(what: str) -> TypeError:
    return WhereComputedError(
        f"tree_at: `where` {what}. `where` must return nodes of the tree, reached by attribute "
        "and index access (e.g. `lambda m: m.weight`), without computing with them "
        "(`.T`, arithmetic, method calls). Select the node and compute the new value in "
        "`replace` or `replace_fn` (e.g. `replace_fn=lambda w: w.T`)."
    )


def _one_level(node: Any) -> tuple[list[Any], Any]:
    """Flatten `node` by one level: its immediate children and its treedef."""
    return jtu.tree_flatten(node, is_leaf=lambda x: x is not node)


def _one_level_keys(node: Any) -> tuple[list[str], list[Any], Any]:
    """Like `_one_level`, with each child's key as a string (`.weight`, `[0]`, `['a']`)."""
    pairs, treedef = jtu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    return [jtu.keystr(p) for p, _ in pairs], [c for _, c in pairs], treedef


def _static_owner(node: Any) -> dict[int, str]:
    """Map ids of static-field values of a module to 'Class.field', for error messages."""
    names = static_field_names(type(node))
    return {id(getattr(node, n)): f"{type(node).__qualname__}.{n}" for n in names}


def tree_at(
    where: Callable[[Any], Any],
    pytree: Any,
    replace: Any = _SENTINEL,
    replace_fn: Any = _SENTINEL,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """Return a copy of `pytree` with the node(s) that `where` selects replaced.

    Modules are immutable; this is how to "change" one. Untouched leaves keep their identity.

    Arguments:
        where: a function from the tree to one of its nodes (a leaf, a subtree, or `None`), or to
            a tuple/list of nodes, e.g. `lambda m: m.layers[0].weight`. It only selects:
            computing with a leaf there (`m.weight.T`, `m.bias + 1`) is a `TypeError` naming
            the leaf's key path; compute the new value in `replace_fn` instead.
        pytree: the tree to copy.
        replace: the new value (a sequence of values, one per node, if `where` returns several).
        replace_fn: instead of `replace`, a function from the old node to the new one.
        is_leaf: as in `jax.tree_util`: subtrees it accepts are not looked into.

    Returns:
        The changed copy.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> tree = {"w": jnp.zeros(2), "b": None}
        >>> tm.tree_at(lambda t: t["b"], tree, jnp.ones(2))["b"]
        Array([1., 1.], dtype=float32)
        >>> tm.tree_at(lambda t: (t["w"], t["b"]), tree, replace_fn=lambda x: 7)
        {'b': 7, 'w': 7}
    """
    if (replace is _SENTINEL) == (replace_fn is _SENTINEL):
        raise ValueError("tree_at: pass exactly one of `replace` and `replace_fn`.")

    positions: dict[int, tuple[int, ...]] = {}
    paths: dict[tuple[int, ...], str] = {}
    statics: dict[int, str] = {}

    def mark(node: Any, pos: tuple[int, ...], path: str) -> Any:
        paths[pos] = path
        if is_leaf is not None and is_leaf(node):
            marked: Any = _Marker(path)
        else:
            keys, children, treedef = _one_level_keys(node)
            if treedef.num_nodes == 1 and treedef.num_leaves == 1:
                marked = _Marker(path)
            elif node is None or (type(node) is tuple and not node):  # `()`: no unique id
                marked = _EmptyMarker(path)
            else:
                statics.update(_static_owner(node))
                pairs = enumerate(zip(keys, children, strict=True))
                marked = treedef.unflatten([mark(c, pos + (i,), path + k) for i, (k, c) in pairs])
        positions[id(marked)] = pos
        return marked

    marked_tree = mark(pytree, (), "")
    try:
        selected = where(marked_tree)
    except _LeafUsed as e:
        raise _computing(f"used {e.what} on the leaf at {e.path or '(root)'}") from None
    except (TypeError, AttributeError) as e:
        if "_Marker" not in str(e):
            raise
        raise _computing("computed with a leaf of the tree") from None
    if id(selected) in positions:
        nodes, single = [selected], True
    elif isinstance(selected, tuple | list):
        nodes, single = list(selected), False
    else:
        nodes, single = [selected], True
    targets: list[tuple[int, ...]] = []
    for node in nodes:
        if id(node) not in positions:
            owner = statics.get(id(node))
            if owner is not None:
                raise NotANodeError(
                    f"tree_at: `where` selected {owner}, a static field. Static fields are part "
                    "of the tree structure, not nodes; build a new module instead."
                )
            raise NotANodeError(
                "tree_at: `where` returned something that is not a node of the tree "
                f"({type(node).__name__}). Return nodes reached by attribute or index access "
                "from the argument, e.g. `lambda m: m.layer.weight`."
            )
        targets.append(positions[id(node)])

    if single:
        new_values: Sequence[Any] | None = None if replace is _SENTINEL else [replace]
    elif replace is _SENTINEL:
        new_values = None
    else:
        if not isinstance(replace, Sequence):
            raise TypeError(
                f"tree_at: `where` selected {len(targets)} nodes, so `replace` must be a "
                f"sequence of {len(targets)} values; got {type(replace).__name__}."
            )
        if len(replace) != len(targets):
            raise ValueError(
                f"tree_at: `where` selected {len(targets)} nodes, so `replace` must be a "
                f"sequence of {len(targets)} values."
            )
        new_values = list(replace)

    chosen: dict[tuple[int, ...], int] = {}
    for i, t in enumerate(targets):
        if t in chosen:
            # The same node twice: harmless with one replacement, ambiguous with two.
            j = chosen[t]
            if new_values is not None and new_values[i] is not new_values[j]:
                raise ValueError(
                    f"tree_at: `where` selected {paths[t] or 'the whole tree'} twice (items "
                    f"{j} and {i}) with two different replacements. Select each node once."
                )
            continue
        for other in chosen:
            if t != other and (t[: len(other)] == other or other[: len(t)] == t):
                outer, inner = (other, t) if len(other) < len(t) else (t, other)
                raise ValueError(
                    f"tree_at: `where` selected two nodes, one inside the other: "
                    f"{paths[outer] or 'the whole tree'} contains {paths[inner]}. Select only "
                    "one of them."
                )
        chosen[t] = i
    prefixes = {t[:k] for t in targets for k in range(len(t))}

    def rebuild(node: Any, pos: tuple[int, ...], check: bool) -> Any:
        if pos in chosen:
            i = chosen[pos]
            return replace_fn(node) if new_values is None else new_values[i]
        if pos not in prefixes:
            return node
        children, treedef = _one_level(node)
        # A class may say its descendants do not match their annotations (`nn.Stack`: an
        # extra leading axis on every array): rebuilt descendants are then not checked.
        inner_check = check and check_descendants(node)
        new = treedef.unflatten(
            [rebuild(c, pos + (i,), inner_check) for i, c in enumerate(children)]
        )
        if check and is_module(new):
            check_fields(new, constructing=False)
        return new

    return rebuild(pytree, (), True)
