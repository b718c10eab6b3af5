"""Equinox's state API: `StateIndex`, `State`, `make_with_state`, `delete_init_state`.

Equinox keeps a model's state (BatchNorm statistics, SpectralNorm vectors) outside the model: a
layer holds a `StateIndex` (a marker and the initial value), and a separate `State` object maps
markers to current values. Layers take the state and return a new one,
`y, state = layer(x, state)`. treemod's own design keeps state in the tree (`treemod.State`,
`treemod.stateful`); this module is the compat namespace's adapter for code written Equinox's way.

`State` flattens to its values in the order the indices appear in the model, and
`make_with_state` names each marker by the index's key path, so `(model, state)` saves with
`tree_serialise_leaves` exactly as Equinox's does and two builds of the same model give states
with the same tree structure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from treemod import Module, field, tree_at
from treemod._compat_api import describe_value

__all__ = ["StateIndex", "State", "make_with_state", "delete_init_state", "StatefulLayer"]

_Value = TypeVar("_Value")
_P = ParamSpec("_P")
_T = TypeVar("_T")


class _Deleted(Module, shapecheck=False):
    """Stands for an initial value removed by `delete_init_state` (a node without leaves)."""


_DELETED = _Deleted()


class StateIndex(Module, Generic[_Value], shapecheck=False):
    """A layer's handle on one entry of a `State`: a unique marker and the initial value.

    A stateful layer stores a `StateIndex` as a field and reads or writes its value through the
    `State` passed to its call (`state.get(self.index)`, `state = state.set(self.index, v)`).

    Arguments:
        init: the initial value (an array, or a pytree of arrays).

    Example:
        >>> import jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> class Counter(eqx.Module):
        ...     index: eqx.nn.StateIndex
        ...     def __init__(self):
        ...         self.index = eqx.nn.StateIndex(jnp.array(0))
        ...     def __call__(self, x, state):
        ...         count = state.get(self.index)
        ...         return x + count, state.set(self.index, count + 1)
        >>> counter, state = eqx.nn.make_with_state(Counter)()
        >>> y, state = counter(1, state)
        >>> y, state = counter(1, state)
        >>> int(y), int(state.get(counter.index))
        (2, 2)
    """

    marker: object = field(static=True)
    init: Any

    def __init__(self, init: _Value) -> None:
        if callable(init) and not isinstance(init, jax.Array | Module):
            raise ValueError(
                "StateIndex accepts the value of the initial state directly (an array or a "
                f"pytree of arrays), not a function that makes it; got {init!r}. Call the "
                "function first."
            )
        self.marker = object()
        self.init = init


def _is_index(x: Any) -> bool:
    return isinstance(x, StateIndex)


_REUSED = (
    "Attempted to use old state: this State was already used: `state.set(...)` and "
    "`state.update(...)` return a new State and retire this one, so that reusing an old "
    "state (`y, s2 = layer(x, s1)` then `layer(x, s1)` again) fails loudly rather than "
    "silently dropping an update. Use the State returned by the last call; to keep an old "
    "one on purpose, copy it first with `jax.tree_util.tree_map(lambda v: v, state)`."
)


def _describe_tree(tree: Any) -> str:
    leaves = jtu.tree_leaves(tree)
    if len(leaves) == 1 and jtu.treedef_is_leaf(jtu.tree_structure(tree)):
        return describe_value(leaves[0])
    return str(jtu.tree_map(describe_value, tree))


@jtu.register_pytree_with_keys_class
class State:
    """The state of a model, kept apart from it: a mapping from `StateIndex` markers to values.

    Build it with `make_with_state` (or `State(model)`, from a model whose indices still hold
    their initial values). Updating returns a new `State` and retires the old one.

    Arguments:
        model: any pytree; each `StateIndex` in it contributes its initial value.

    Example:
        >>> import treemod.compat.equinox as eqx
        >>> bn, state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, "batch", mode="batch")
        >>> sorted(v.shape for v in jax.tree_util.tree_leaves(state))
        [(), (3,), (3,)]
    """

    __slots__ = ("_values",)
    _values: dict[Any, Any] | None

    def __init__(self, model: Any) -> None:
        values: dict[Any, Any] = {}
        for leaf in jtu.tree_leaves(model, is_leaf=_is_index):
            if _is_index(leaf):
                if isinstance(leaf.init, _Deleted):
                    raise ValueError(
                        "Do not call `eqx.nn.State(model)` directly on a built model: a "
                        "StateIndex in this model has no initial value (it was removed by "
                        "make_with_state or delete_init_state). Build the model and its "
                        "state together with `eqx.nn.make_with_state(ModelClass)(...)`."
                    )
                values[leaf.marker] = jtu.tree_map(jnp.asarray, leaf.init)
        self._values = values

    @classmethod
    def _new(cls, values: dict[Any, Any]) -> State:
        new = object.__new__(cls)
        new._values = values
        return new

    def _live(self) -> dict[Any, Any]:
        if self._values is None:
            raise ValueError(_REUSED)
        return self._values

    def _lookup(self, item: Any) -> Any:
        values = self._live()
        if type(item) is not StateIndex:
            raise ValueError(
                "Can only use `eqx.nn.StateIndex`s as state keys (a layer's index field); "
                f"got {type(item).__name__}."
            )
        try:
            return values[item.marker]
        except KeyError:
            raise KeyError(
                f"State has no entry for the StateIndex {item.marker!r}: was the model built by "
                "a different make_with_state call than this state, or is this a substate that "
                "leaves the layer out?"
            ) from None

    def get(self, item: StateIndex[_Value]) -> _Value:
        """The current value for `item`.

        Arguments:
            item: a `StateIndex` of the model this state belongs to.

        Returns:
            Its value.
        """
        value: _Value = self._lookup(item)  # what `set` or `make_with_state` stored for it
        return value

    def set(self, item: StateIndex[_Value], value: _Value) -> State:
        """A new `State` with `item`'s value replaced; this one is retired.

        Arguments:
            item: a `StateIndex`.
            value: the new value, of the same structure, shapes and dtypes as the old one.

        Returns:
            The updated `State`.
        """
        old = self._lookup(item)
        value = jtu.tree_map(jnp.asarray, value)
        old_struct, new_struct = jax.eval_shape(lambda: old), jax.eval_shape(lambda: value)
        old_def: Any = jtu.tree_structure(old_struct)
        same_structure = old_def == jtu.tree_structure(new_struct)
        if not same_structure or any(
            (a.shape, a.dtype) != (b.shape, b.dtype)
            for a, b in zip(jtu.tree_leaves(old_struct), jtu.tree_leaves(new_struct), strict=True)
        ):
            raise ValueError(
                "Old and new values have different structures/shapes/dtypes: "
                f"State.set({item.marker!r}) got {_describe_tree(value)} but the state holds "
                f"{_describe_tree(old)}; a state keeps its structure, shapes and dtypes (cast "
                "or reshape the new value)."
            )
        values = dict(self._live())
        values[item.marker] = value
        self._values = None
        return State._new(values)

    def substate(self, pytree: Any) -> State:
        """A smaller `State` holding only the entries of the indices found in `pytree`.

        Arguments:
            pytree: part of the model (a sublayer, say).

        Returns:
            A `State` for that part; merge its updates back with `update`.
        """
        values = self._live()
        markers = [x.marker for x in jtu.tree_leaves(pytree, is_leaf=_is_index) if _is_index(x)]
        return State._new({m: values[m] for m in markers})

    def update(self, substate: State) -> State:
        """A new `State` with the entries of `substate` (from `substate(...)`) written in.

        Arguments:
            substate: a `State` whose entries all belong to this one.

        Returns:
            The updated `State`; this one is retired.
        """
        if type(substate) is not State:
            raise ValueError(
                f"Can only use `eqx.nn.State`s in `update`; got {type(substate).__name__}."
            )
        values = dict(self._live())
        for marker, value in substate._live().items():
            if marker not in values:
                raise ValueError(
                    "Cannot call `state1.update(state2)` unless `state2` is a substate of "
                    f"`state1`: the entry {marker!r} is not part of this State; make the "
                    "substate with `state.substate(...)`."
                )
            values[marker] = value
        self._values = None
        return State._new(values)

    def tree_flatten_with_keys(self) -> tuple[list[tuple[Any, Any]], tuple[Any, ...]]:
        values = self._live()
        keys = tuple(values)
        return [(jtu.DictKey(k), values[k]) for k in keys], keys

    def tree_flatten(self) -> tuple[list[Any], tuple[Any, ...]]:
        values = self._live()
        keys = tuple(values)
        return [values[k] for k in keys], keys

    @classmethod
    def tree_unflatten(cls, keys: tuple[Any, ...], children: Any) -> State:
        return cls._new(dict(zip(keys, children, strict=True)))

    def __repr__(self) -> str:
        if self._values is None:
            return "State(~retired~)"
        items = ", ".join(f"{k!r}: {_describe_tree(v)}" for k, v in self._values.items())
        return f"State({items})"


def _strip(x: Any) -> Any:
    return tree_at(lambda i: i.init, x, _DELETED) if _is_index(x) else x


def delete_init_state(model: _T) -> _T:
    """A copy of `model` whose `StateIndex`es no longer hold their initial values.

    `make_with_state` does this after building the `State`, so the model does not keep a
    second copy of the initial state.

    Arguments:
        model: any pytree.

    Returns:
        The model without initial states.
    """
    stripped: _T = jtu.tree_map(_strip, model, is_leaf=_is_index)  # indexes keep their types
    return stripped


def make_with_state(make_model: Callable[_P, _T]) -> Callable[_P, tuple[_T, State]]:
    """Build a model and its `State`: `model, state = make_with_state(Model)(*args, **kwargs)`.

    Each `StateIndex` gets a marker named by its key path in the model (so that separate builds
    are compatible), the `State` collects the initial values, and the returned model has them
    removed.

    Arguments:
        make_model: a callable returning the model (usually its class).

    Returns:
        A callable with `make_model`'s arguments, returning `(model, state)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> model, state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(2, "batch", mode="batch")
        >>> x = jnp.array([[0.0, 1.0], [2.0, 5.0]])
        >>> y, state = jax.vmap(model, axis_name="batch", in_axes=(0, None),
        ...                     out_axes=(0, None))(x, state)
        >>> jnp.round(y, 3)
        Array([[-1., -1.],
               [ 1.,  1.]], dtype=float32)
    """

    def build(*args: _P.args, **kwargs: _P.kwargs) -> tuple[_T, State]:
        model = make_model(*args, **kwargs)
        with_paths, treedef = jtu.tree_flatten_with_path(model, is_leaf=_is_index)
        prefix = type(model).__name__
        leaves = []
        for path, leaf in with_paths:
            if _is_index(leaf):
                renamed = StateIndex.__new__(StateIndex)
                object.__setattr__(renamed, "marker", prefix + jtu.keystr(path))
                object.__setattr__(renamed, "init", leaf.init)
                leaf = renamed
            leaves.append(leaf)
        model = jtu.tree_unflatten(treedef, leaves)
        state = State(model)
        return delete_init_state(model), state

    return build


class StatefulLayer(Module, shapecheck=False):
    """Marks a layer that `Sequential` calls as `x, state = layer(x, state)`.

    Subclasses may override `is_stateful` when they are stateful only sometimes (a container
    of possibly stateful layers, say).
    """

    def is_stateful(self) -> bool:
        """Whether `Sequential` should pass this layer the state (default `True`)."""
        return True
