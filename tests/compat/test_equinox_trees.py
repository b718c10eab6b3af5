"""Tree utilities in treemod.compat.equinox raise and answer as Equinox's do, against Equinox."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm
import treemod.compat.equinox as teqx

eqx = pytest.importorskip("equinox")


class _Layer(eqx.Module):
    weight: Any
    size: int = eqx.field(static=True, default=3)


class _TmLayer(teqx.Module):
    weight: Any
    size: int = teqx.field(static=True, default=3)


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the outcome is the error's type
        return type(e)


_TREE = {"a": 1, "b": [2, 3], "c": None}
# (where, replace): every way `where`/`replace` can be wrong, and some right ones.
_CASES: list[tuple[Callable[[Any], Any], Any]] = [
    (lambda t: (t["a"], t["b"][0]), 5),  # several nodes, one value: TypeError
    (lambda t: (t["a"], t["b"][0]), (5,)),  # wrong number of values: ValueError
    (lambda t: t["a"] + 1, 5),  # computes with a leaf: TypeError
    (lambda t: t["b"][0].real, 5),  # attribute of a leaf: AttributeError in Equinox
    (lambda t: t["b"][0][0], 5),  # indexes a leaf: TypeError
    (lambda t: 7, 5),  # not a node: TypeError in Equinox
    (lambda t: t["c"], 5),  # the one None: replaced
    (lambda t: [t["a"], t["b"]], [0, 0]),
]


@pytest.mark.parametrize(("where", "replace"), _CASES)
def test_tree_at_errors_are_equinox_errors(where: Callable[[Any], Any], replace: Any) -> None:
    theirs = _outcome(lambda: eqx.tree_at(where, _TREE, replace))
    ours = _outcome(lambda: teqx.tree_at(where, _TREE, replace))
    if isinstance(theirs, type):
        assert isinstance(ours, type) and issubclass(ours, theirs), (ours, theirs)
    else:
        assert ours == theirs


def test_tree_at_static_field_is_a_type_error_as_in_equinox() -> None:
    with pytest.raises(TypeError):
        eqx.tree_at(lambda m: m.size, _Layer(jnp.ones(2)), 4)
    with pytest.raises(TypeError, match=r"selected _TmLayer\.size, a static field"):
        teqx.tree_at(lambda m: m.size, _TmLayer(jnp.ones(2)), 4)
    with pytest.raises(ValueError, match="a static field"):  # treemod's own class still works
        tm.tree_at(lambda m: m.size, _TmLayer(jnp.ones(2)), 4)


@pytest.mark.parametrize(
    ("tree", "where"),
    [
        ((None, None, 0), lambda t: t[0]),
        ({"a": [None, None], "b": None}, lambda t: (t["b"], t["a"][0])),
        ((None, 1), lambda t: t[0]),
        ({"a": [None, None], "b": 1}, lambda t: t["a"]),  # the list is one node
    ],
)
def test_tree_at_selecting_one_of_several_nones(tree: Any, where: Callable[[Any], Any]) -> None:
    selected = where(tree)
    replace = (5, 6) if isinstance(selected, tuple) else 5
    theirs = _outcome(lambda: eqx.tree_at(where, tree, replace))
    ours = _outcome(lambda: teqx.tree_at(where, tree, replace))
    assert ours == theirs
    # With `is_leaf`, each None is its own leaf in both; treemod proper replaces by position.
    is_none = lambda x: x is None  # noqa: E731
    expected = eqx.tree_at(where, tree, replace, is_leaf=is_none)
    assert teqx.tree_at(where, tree, replace, is_leaf=is_none) == expected
    assert tm.tree_at(where, tree, replace) == expected


def test_tree_at_none_error_names_the_places_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"at 2 places \(\[0\], \[1\]\).*is_leaf=lambda x"):
        teqx.tree_at(lambda t: t[0], (None, None, 0), True)


class _Convertible:
    def __init__(self, value: Any) -> None:
        self.value = value

    def __jax_array__(self) -> Any:
        return jnp.asarray(self.value)


_LEAVES = [
    jnp.ones(2),
    jnp.arange(2),
    np.ones(2, np.float32),
    np.int32(1),
    np.float64(1.0),
    jax.ShapeDtypeStruct((2,), jnp.float32),
    _Convertible(1.0),
    _Convertible(1),
    1,
    1.0,
    1j,
    True,
    "s",
    None,
    [1.0],
]
_PREDICATES = ["is_array", "is_inexact_array", "is_array_like", "is_inexact_array_like"]


@pytest.mark.parametrize("name", _PREDICATES)
@pytest.mark.parametrize("leaf", _LEAVES, ids=lambda x: type(x).__name__)
def test_leaf_predicates_are_equinox_predicates(name: str, leaf: Any) -> None:
    assert getattr(teqx, name)(leaf) == getattr(eqx, name)(leaf)
    if not isinstance(leaf, jax.ShapeDtypeStruct):  # treemod proper agrees except on structs
        assert getattr(tm, name)(leaf) == getattr(eqx, name)(leaf)


@pytest.mark.parametrize("name", _PREDICATES)
def test_leaf_predicates_on_tracers(name: str) -> None:
    out: dict[Any, Any] = {}
    if name == "is_inexact_array_like":  # Equinox's calls a tracer's `__jax_array__` (None)
        out[eqx] = (True, False)  # a float tracer is inexact, an integer one is not
    for lib in (teqx,) if name == "is_inexact_array_like" else (eqx, teqx):

        def record(x: Any, y: Any, lib: Any = lib) -> None:
            out[lib] = (getattr(lib, name)(x), getattr(lib, name)(y))

        jax.jit(record)(1.0, jnp.arange(2))
    assert out[teqx] == out[eqx]


@pytest.mark.parametrize("spec", ["a", 3, object()])
def test_filter_spec_that_is_not_a_bool_or_predicate(spec: Any) -> None:
    with pytest.raises(ValueError):  # Equinox's type
        eqx.filter([1, 2], spec)
    with pytest.raises(ValueError, match="filter_spec leaves must be bools or predicates"):
        teqx.filter([1, 2], spec)
    with pytest.raises(TypeError, match="filter_spec leaves must be bools or predicates"):
        tm.partition([1, 2], spec)


def test_filter_spec_that_is_traced() -> None:
    def spec_from(lib: Any) -> Any:
        return jax.jit(lambda flag: lib.filter([1, 2], [flag, True]))

    with pytest.raises(ValueError):
        spec_from(eqx)(True)
    with pytest.raises(ValueError, match="got a traced array.*cannot depend on traced values"):
        spec_from(teqx)(True)


@pytest.mark.parametrize(
    ("param", "update"),
    [
        (np.ones(2), np.full(2, 0.5)),  # float64 NumPy stays float64 NumPy (x64 off)
        (np.float32(1), np.float32(2)),
        (jnp.ones(2), np.ones(2, np.float32)),
        (jnp.ones(2), 1),
        (1.0, jnp.ones(2)),
        (jnp.ones(2, jnp.bfloat16), 0.5),
    ],
    ids=lambda x: type(x).__name__,
)
def test_apply_updates_types_as_in_equinox(param: Any, update: Any) -> None:
    expected = eqx.apply_updates([param, None], [update, None])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no dtype-truncation warning
        ours = tm.apply_updates([param, None], [update, None])
    assert type(ours[0]) is type(expected[0]) and ours[1] is None
    assert ours[0].dtype == expected[0].dtype and np.array_equal(ours[0], expected[0])
