"""`eqx.tree_at` in treemod.compat.equinox: `None`s and repeated selections, against Equinox.

A `None` in the tree is an empty subtree (collecting leaves never selects it, a path may
select it); a node selected twice keeps its last replacement and `replace_fn` runs on it once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

import treemod as tm
import treemod.compat.equinox as teqx

K = jax.random.key(0)


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the outcome is the error's type
        return type(e)


def _same(ours: Any, theirs: Any) -> None:
    assert jtu.tree_structure(ours) == jtu.tree_structure(theirs), (ours, theirs)
    for a, b in zip(jtu.tree_leaves(ours), jtu.tree_leaves(theirs), strict=True):
        if isinstance(b, jax.Array):
            np.testing.assert_array_equal(a, b)
        else:
            assert a == b and type(a) is type(b), (a, b)


def _gradient(lib: Any) -> Any:
    # A filtered gradient: the non-array fields of the model become `None`.
    class Updates(lib.Module):
        initial: Any
        name: str = "model"

    model = Updates((lib.nn.Linear(2, 3, key=K), 3.0, "s", lib.nn.Linear(3, 1, key=K)))
    return lib.filter_grad(lambda m: jnp.sum(m.initial[3](m.initial[0](jnp.ones(2)))))(model)


def test_scaling_the_leaves_of_a_filtered_gradient() -> None:
    def edit(lib: Any) -> Any:
        updates = _gradient(lib)
        where = lambda u: jtu.tree_leaves(u.initial)  # noqa: E731
        return lib.tree_at(where, updates, replace_fn=lambda x: x * 10)

    theirs, ours = edit(eqx), edit(teqx)
    assert ours.initial[1] is None and ours.name is None
    _same(jtu.tree_leaves(ours), jtu.tree_leaves(theirs))
    _same(
        jtu.tree_leaves(
            tm.tree_at(
                lambda u: jtu.tree_leaves(u.initial), _gradient(teqx), replace_fn=lambda x: x * 10
            )
        ),
        jtu.tree_leaves(theirs),
    )


_TREE = [1, None, (None, 2), {"a": None, "b": [None, 3.0]}]
_CASES: list[tuple[Callable[[Any], Any], dict[str, Any]]] = [
    (lambda t: jtu.tree_leaves(t), {"replace_fn": lambda x: x * 10}),
    (lambda t: jtu.tree_leaves(t[3]), {"replace": ["y"]}),
    # `is_leaf` makes each None a leaf: then they are selected, as in Equinox.
    (
        lambda t: jtu.tree_leaves(t, is_leaf=lambda x: x is None),
        {"replace_fn": lambda x: "none" if x is None else -x, "is_leaf": lambda x: x is None},
    ),
    (lambda t: t[2][0], {"replace": 5, "is_leaf": lambda x: x is None}),
    (lambda t: t[3]["a"], {"replace": "empty", "is_leaf": lambda x: x is None}),
    (lambda t: t[3]["b"], {"replace_fn": lambda x: len(x)}),  # a list holding a None
    (lambda t: (t[0], t[3]["b"][1]), {"replace": (7, 8)}),
]


@pytest.mark.parametrize(("where", "kwargs"), _CASES)
def test_none_and_empty_subtrees_as_in_equinox(
    where: Callable[[Any], Any], kwargs: dict[str, Any]
) -> None:
    theirs = _outcome(lambda: eqx.tree_at(where, _TREE, **kwargs))
    ours = _outcome(lambda: teqx.tree_at(where, _TREE, **kwargs))
    if isinstance(theirs, type):
        assert ours is theirs
    else:
        _same(ours, theirs)


def test_selecting_the_only_none_or_an_empty_tuple_by_path() -> None:
    tree = {"w": jnp.ones(2), "b": None, "c": ()}
    for lib in (eqx, teqx):
        out = lib.tree_at(lambda t: (t["b"], t["c"]), tree, (jnp.zeros(2), "c"))
        np.testing.assert_array_equal(out["b"], jnp.zeros(2))
        assert out["c"] == "c"


def test_an_empty_tuple_is_an_empty_subtree_when_collecting_leaves() -> None:
    # A deliberate difference (docs/migrating-from-equinox.md): Equinox's `tree_at` turns each
    # `()` into a private leaf object, which leaf-collecting `where`s then pass to `replace_fn`.
    tree = [1, (), (None, 2)]
    where = lambda t: jtu.tree_leaves(t)  # noqa: E731
    with pytest.raises(TypeError, match="_DistinctTuple"):
        eqx.tree_at(where, tree, replace_fn=lambda x: -x)
    assert teqx.tree_at(where, tree, replace_fn=lambda x: -x) == [-1, (), (None, -2)]


_REPEATS: list[tuple[Callable[[Any], Any], Any, dict[str, Any]]] = [
    (lambda t: (t[0], t[0]), [1, 2], {"replace": ("first", "last")}),
    (lambda t: [t[0], t[1], t[0]], [1, 2], {"replace": ("a", "b", "c")}),
    (lambda t: (t[0], t[1], t[1], t[0]), [1, 1], {"replace": ("a", "b", "c", "d")}),
    (lambda t: (t[0], t[0]), [jnp.ones(2), 2], {"replace_fn": lambda x: x * 2}),
    (lambda t: (t["w"], t["b"], t["w"]), {"w": 1, "b": None}, {"replace": (1, 2, 3)}),
    (lambda t: (t[0], t[0]), [1, 2], {"replace": ("a", "b", "c")}),  # wrong length
]


@pytest.mark.parametrize(("where", "tree", "kwargs"), _REPEATS)
def test_a_node_selected_twice_keeps_the_last_replacement(
    where: Callable[[Any], Any], tree: Any, kwargs: dict[str, Any]
) -> None:
    theirs = _outcome(lambda: eqx.tree_at(where, tree, **kwargs))
    ours = _outcome(lambda: teqx.tree_at(where, tree, **kwargs))
    if isinstance(theirs, type):
        assert isinstance(ours, type) and issubclass(ours, theirs), (ours, theirs)
    else:
        _same(ours, theirs)


def test_replace_fn_runs_once_per_node_selected_twice() -> None:
    for lib in (eqx, teqx):
        calls: list[Any] = []
        out = lib.tree_at(lambda t: (t[1], t[1], t[0]), [1, 2], replace_fn=calls.append)
        assert sorted(calls) == [1, 2] and out == [None, None]


def test_treemod_tree_at_refuses_two_replacements_for_one_node() -> None:
    # The deliberate difference (listed in docs/migrating-from-equinox.md).
    with pytest.raises(ValueError, match=r"selected \[0\] twice"):
        tm.tree_at(lambda t: (t[0], t[0]), [1, 2], ("first", "last"))
    assert teqx.tree_at(lambda t: (t[0], t[0]), [1, 2], ("first", "last")) == ["last", 2]
