"""Hypothesis laws over randomly generated module trees.

Trees mix arrays (float and int), Python scalars, strings, `None`, lists, dicts and three
Module classes with static fields, nested up to a few levels.
"""

import copy
import pickle
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import treemod as tm

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Leafy(tm.Module):
    x: jax.Array
    s: Any
    n: None
    tag: str = tm.field(static=True)


class Branchy(tm.Module):
    items: list
    table: dict
    child: Any
    cfg: tuple = tm.field(static=True, default=(0,))


class Custom(tm.Module):
    a: Any
    b: Any
    size: int = tm.field(static=True)

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b
        self.size = len(jtu.tree_leaves((a, b)))


def _array(shape: tuple[int, ...], seed: int, dtype: type) -> jax.Array:
    values = np.random.default_rng(seed).standard_normal(shape) * 10
    return jnp.asarray(values.astype(dtype))


arrays = st.builds(
    _array,
    st.lists(st.integers(0, 3), max_size=2).map(tuple),
    st.integers(0, 2**16),
    st.sampled_from([np.float32, np.int32]),
)
leaves = st.one_of(
    arrays,
    st.integers(-5, 5),
    st.floats(-10, 10, width=32),
    st.none(),
    st.text("ab", max_size=2),
)


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.sampled_from("abc"), children, max_size=3),
        st.builds(Leafy, x=arrays, s=children, n=st.none(), tag=st.sampled_from(["p", "q"])),
        st.builds(
            Branchy,
            items=st.lists(children, max_size=2),
            table=st.dictionaries(st.sampled_from("xy"), children, max_size=2),
            child=children,
            cfg=st.tuples(st.integers(0, 2)),
        ),
        st.builds(Custom, children, children),
    )


trees = st.recursive(leaves, _extend, max_leaves=10)


def _is_none(x: object) -> bool:
    return x is None


class _Was:
    """A replacement that is a leaf (not a pytree), remembering the value it replaced."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _at(tree: Any, path: tuple[Any, ...]) -> Any:
    """The node of `tree` at a `jax.tree_util` key path, reached by indexing and attributes."""
    for key in path:
        if isinstance(key, jtu.GetAttrKey):
            tree = getattr(tree, key.name)
        elif isinstance(key, jtu.DictKey):
            tree = tree[key.key]
        elif isinstance(key, jtu.SequenceKey):
            tree = tree[key.idx]
        else:
            raise TypeError(f"unexpected key {key!r}")
    return tree


def _slots(tree: Any) -> list[Any]:
    """Leaves with `None` counted as a leaf: one entry per position that tree_at can select."""
    return jtu.tree_leaves(tree, is_leaf=_is_none)


@SETTINGS
@given(trees)
def test_flatten_unflatten_round_trip(tree: Any) -> None:
    leaves_, treedef = jtu.tree_flatten(tree)
    back = jtu.tree_unflatten(treedef, leaves_)
    assert jtu.tree_structure(back) == treedef
    assert all(a is b for a, b in zip(jtu.tree_leaves(back), leaves_, strict=True))
    assert tm.tree_equal(back, tree) is True
    keyed = jtu.tree_flatten_with_path(tree)[0]
    assert all(a is b for (_, a), b in zip(keyed, leaves_, strict=True))


FILTERS: list[Callable[[Any], bool]] = [
    tm.is_array,
    tm.is_inexact_array,
    tm.is_array_like,
    lambda x: isinstance(x, str),
]


@SETTINGS
@given(trees, st.sampled_from(FILTERS), st.data())
def test_partition_combine_inverse_and_disjoint(
    tree: Any, predicate: Callable[[Any], bool], data: st.DataObject
) -> None:
    leaves_, treedef = jtu.tree_flatten(tree)
    mask = data.draw(st.lists(st.booleans(), min_size=len(leaves_), max_size=len(leaves_)))
    for spec in (predicate, jtu.tree_unflatten(treedef, mask)):
        left, right = tm.partition(tree, spec)
        assert tm.tree_equal(tm.combine(left, right), tree) is True
        assert tm.tree_equal(tm.combine(right, left), tree) is True
        for orig, a, b in zip(_slots(tree), _slots(left), _slots(right), strict=True):
            if orig is None:
                assert a is None and b is None
            else:
                assert (a is orig and b is None) or (b is orig and a is None)
        assert tm.tree_equal(tm.filter(tree, spec), left) is True
        assert tm.tree_equal(tm.filter(tree, spec, inverse=True), right) is True


@SETTINGS
@given(trees, st.data())
def test_tree_at_laws(tree: Any, data: st.DataObject) -> None:
    slots = _slots(tree)
    if not slots:
        return
    paths = [p for p, _ in jtu.tree_flatten_with_path(tree, is_leaf=_is_none)[0]]
    idxs = data.draw(st.lists(st.integers(0, len(slots) - 1), min_size=1, max_size=3, unique=True))
    values = [f"new{i}" for i in idxs]

    def where(t: Any) -> list[Any]:
        # Inside tree_at every position is a marker; a `None` is an empty subtree, as outside,
        # so it is reached by its path (here: the same path in the marked tree) and never
        # collected as a leaf.
        marked = [_at(t, p) for p in paths]
        return [marked[i] for i in idxs]

    new = tm.tree_at(where, tree, values)
    new_slots = _slots(new)
    assert len(new_slots) == len(slots)
    for j, (old, now) in enumerate(zip(slots, new_slots, strict=True)):
        if j in idxs:
            assert now == values[idxs.index(j)]
        else:
            assert now is old  # untouched leaves keep their identity
    # setting one position twice: one value is fine, two different ones are refused
    i = idxs[0]
    twice = tm.tree_at(lambda t: [_at(t, paths[i])] * 2, tree, ["same"] * 2)
    assert _slots(twice)[i] == "same"
    with pytest.raises(ValueError, match="twice"):
        tm.tree_at(lambda t: [_at(t, paths[i])] * 2, tree, ["first", "last"])
    # collecting leaves never selects a None (an empty subtree, as in Equinox)
    leaves_only = tm.tree_at(lambda t: jtu.tree_leaves(t), tree, replace_fn=_Was)
    for old, now in zip(slots, _slots(leaves_only), strict=True):
        if old is None:
            assert now is None
        else:
            assert isinstance(now, _Was) and now.value is old
    # replace_fn with the identity changes nothing
    same = tm.tree_at(where, tree, replace_fn=lambda x: x)
    assert tm.tree_equal(same, tree) is True
    # static fields survive
    assert jtu.tree_structure(tm.tree_at(where, tree, replace_fn=lambda x: x)) == (
        jtu.tree_structure(tree)
    )


@SETTINGS
@given(trees)
def test_pickle_and_copy_round_trip(tree: Any) -> None:
    for back in (pickle.loads(pickle.dumps(tree)), copy.deepcopy(tree), copy.copy(tree)):
        assert jtu.tree_structure(back) == jtu.tree_structure(tree)
        assert tm.tree_equal(back, tree) is True
        assert type(back) is type(tree)


@SETTINGS
@given(trees)
def test_module_equality_is_tree_equal_and_reflexive(tree: Any) -> None:
    module = Branchy([tree], {}, None)
    twin = jtu.tree_map(lambda x: x, module)
    assert (module == twin) is True
    assert (module == twin) is tm.tree_equal(module, twin)
    if any(tm.is_array(x) for x in jtu.tree_leaves(module)):
        return
    assert hash(module) == hash(twin)  # hashable leaves only: equal modules hash equal
