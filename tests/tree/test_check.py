"""tree_check and tree_flatten_one_level, against Equinox's where it is installed."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu
import pytest

import treemod as tm


class _Pair(tm.Module):
    a: Any
    b: Any


class _Empty(tm.Module):
    pass


def _cases() -> list[tuple[str, Any]]:
    shared, loop = [1.0], []
    loop.append(loop)
    layer = _Pair(jnp.ones(2), jnp.zeros(2))
    empty = _Empty()
    return [
        ("leaf repeated", [shared[0], shared[0]]),
        ("empty list repeated", [[], []]),
        ("None repeated", [None, None]),
        ("empty module repeated", [empty, empty]),
        ("equal but distinct", [[1.0], [1.0]]),
        ("list repeated", [shared, shared]),
        ("module repeated", {"x": layer, "y": [layer]}),
        ("self reference", loop),
        ("distinct modules", [_Pair(1, 2), _Pair(1, 2)]),
    ]


@pytest.mark.parametrize(("label", "tree"), _cases())
def test_tree_check_agrees_with_equinox(label: str, tree: Any) -> None:
    eqx = pytest.importorskip("equinox")
    try:
        eqx.tree_check(tree)
        expected = None
    except ValueError:
        expected = ValueError
    if expected is None:
        tm.tree_check(tree)
    else:
        with pytest.raises(ValueError, match="tree_check"):
            tm.tree_check(tree)


def test_tree_check_names_both_paths() -> None:
    layer = _Pair(jnp.ones(2), jnp.zeros(2))
    with pytest.raises(
        ValueError, match=r"same _Pair object appears at \['x'\] and at \['y'\]\[0\]"
    ):
        tm.tree_check({"x": layer, "y": [layer]})
    inner: list[Any] = [1]
    outer = _Pair(inner, 2)
    inner.append(outer)
    with pytest.raises(ValueError, match=r"_Pair at \.a\[1\] contains itself"):
        tm.tree_check(outer)


def test_tree_check_handles_deep_trees() -> None:
    tree: Any = 0.0
    for _ in range(5000):  # deeper than Python's recursion limit
        tree = [tree]
    tm.tree_check(tree)


@pytest.mark.parametrize(
    "tree", [{"a": 3, "b": (1, 2)}, 4, None, [], _Pair(jnp.ones(1), [2, 3]), (1, [2])]
)
def test_tree_flatten_one_level_matches_equinox(tree: Any) -> None:
    eqx = pytest.importorskip("equinox")
    ours, theirs = tm.tree_flatten_one_level(tree), eqx.tree_flatten_one_level(tree)
    assert ours[1] == theirs[1]
    assert len(ours[0]) == len(theirs[0])
    assert all(a is b for a, b in zip(ours[0], theirs[0], strict=True))
    assert tm.tree_equal(jtu.tree_unflatten(ours[1], ours[0]), tree)


def test_tree_flatten_one_level_rejects_a_self_child() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="list node holds itself"):
        tm.tree_flatten_one_level(loop)
