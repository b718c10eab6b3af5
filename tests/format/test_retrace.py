"""Trace counting, assert_max_traces and the retrace explainer."""

from __future__ import annotations

import logging
import types
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import treemod as tm


class Net(tm.Module):
    layers: list
    step: Any
    act: Any = tm.field(static=True, default=jnp.tanh)

    def __call__(self, x: jax.Array) -> jax.Array:
        for w in self.layers:
            x = self.act(w @ x)
        return x


def _net(*shapes: tuple[int, int], step: Any = 3, dtype: Any = jnp.float32) -> Net:
    return Net([jnp.ones(s, dtype) for s in shapes], step)


def _train_step(model: Net, x: jax.Array) -> jax.Array:
    return jnp.sum(model(x))


def _fresh(fn: Any) -> Any:
    """A new function object with `fn`'s code: wrappers of one function share their traces
    (and the explainer's memory of the last one), so each test explains its own copy."""
    return types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__)


def _explained(caplog: pytest.LogCaptureFixture, f: Any, *calls: tuple) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="treemod"):
        for args in calls:
            f(*args)
    return [r.getMessage() for r in caplog.records if r.name == "treemod"]


def test_shape_change(caplog: pytest.LogCaptureFixture) -> None:
    f = tm.filter_jit(_fresh(_train_step), explain_retraces=True)
    x = jnp.ones(4)
    lines = _explained(
        caplog, f, (_net((4, 4), (4, 4), (4, 4)), x), (_net((4, 4), (4, 4), (3, 4)), x)
    )
    assert lines == ["retrace of _train_step: args[0].layers[2]: f32[4,4] -> f32[3,4]"]
    assert f.retrace_explanations == lines


def test_dtype_and_weak_type_change(caplog: pytest.LogCaptureFixture) -> None:
    f = tm.filter_jit(lambda m, x: x, explain_retraces=True)
    m = _net((2,))
    lines = _explained(
        caplog, f, (m, jnp.ones(2)), (m, jnp.ones(2, jnp.int32)), (m, jnp.asarray(1.0))
    )
    assert lines == [
        "retrace of <lambda>: args[1]: f32[2] -> i32[2]",
        "retrace of <lambda>: args[1]: i32[2] -> f32[] (weak type)",
    ]


def test_static_value_change(caplog: pytest.LogCaptureFixture) -> None:
    f = tm.filter_jit(_fresh(_train_step), explain_retraces=True)
    x = jnp.ones(2)
    lines = _explained(caplog, f, (_net((2, 2), step=3), x), (_net((2, 2), step=4), x))
    assert lines == ["retrace of _train_step: args[0].step: static value 3 -> 4"]


def test_array_becomes_static(caplog: pytest.LogCaptureFixture) -> None:
    f = tm.filter_jit(_fresh(_train_step), explain_retraces=True)
    x = jnp.ones(2)
    lines = _explained(
        caplog, f, (_net((2, 2), step=jnp.array(3, jnp.int32)), x), (_net((2, 2), step=3), x)
    )
    assert lines == ["retrace of _train_step: args[0].step: i32[] -> static value 3"]


def test_tree_structure_changes(caplog: pytest.LogCaptureFixture) -> None:
    f = tm.filter_jit(lambda m, x: x, explain_retraces=True)
    x = jnp.ones(2)
    tanh, relu = _net((2, 2)), Net([jnp.ones((2, 2))], 3, jax.nn.relu)
    lines = _explained(
        caplog,
        f,
        (tanh, x),
        (_net((2, 2), (2, 2)), x),  # list length
        (relu, x),  # static field
        ({"layers": [jnp.ones((2, 2))]}, x),  # a different node type
    )
    assert lines == [
        "retrace of <lambda>: tree structure changed: args[0].layers: list of length 1 -> 2",
        "retrace of <lambda>: tree structure changed: args[0].act: static field Net.act "
        "<function tanh> -> <function relu>",
        "retrace of <lambda>: tree structure changed: args[0].layers: list of length 2 -> 1",
        "retrace of <lambda>: tree structure changed: args[0]: Net -> dict",
    ]


def test_keyword_change(caplog: pytest.LogCaptureFixture) -> None:
    f = tm.filter_jit(lambda x, *rest: x, explain_retraces=True)
    lines = _explained(caplog, f, (jnp.ones(1),), (jnp.ones(1), 0))
    assert lines[0].endswith("positional arguments: tuple of length 1 -> 2")


def test_explainer_is_off_by_default_and_env_switches_it_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TREEMOD_EXPLAIN_RETRACES", raising=False)
    f = tm.filter_jit(lambda x: x)
    assert _explained(caplog, f, (jnp.ones(1),), (jnp.ones(2),)) == []
    monkeypatch.setenv("TREEMOD_EXPLAIN_RETRACES", "1")
    g = tm.filter_jit(lambda x: x)
    lines = _explained(caplog, g, (jnp.ones(1),), (jnp.ones(2),))
    assert lines == ["retrace of <lambda>: args[0]: f32[1] -> f32[2]"]


def test_get_num_traces_counts_shapes_and_statics() -> None:
    f = tm.filter_jit(lambda x, n: x * n)
    for x, n in [(jnp.ones(2), 2.0), (jnp.ones(2), 2.0), (jnp.ones(3), 2.0), (jnp.ones(2), 3.0)]:
        f(x, n)
    assert tm.debug.get_num_traces(f) == 3


def test_assert_max_traces_under_filter_jit() -> None:
    @tm.filter_jit
    @tm.debug.assert_max_traces(max_traces=1)
    def f(x: jax.Array) -> jax.Array:
        return x + 1

    f(jnp.ones(2))
    f(jnp.zeros(2))
    assert tm.debug.get_num_traces(f.__wrapped__) == 1
    with pytest.raises(RuntimeError, match="f can only be traced 1 times.*traced 2 times"):
        f(jnp.ones(3))


def test_assert_max_traces_on_a_filter_jit_function() -> None:
    f = tm.debug.assert_max_traces(tm.filter_jit(lambda x: x), max_traces=2)
    f(jnp.ones(1))
    f(jnp.ones(2))
    with pytest.raises(RuntimeError, match="TREEMOD_EXPLAIN_RETRACES"):
        f(jnp.ones(3))
    counting = tm.debug.assert_max_traces(tm.filter_jit(lambda x: x), max_traces=None)
    counting(jnp.ones(1))
    assert tm.debug.get_num_traces(counting) == 1


def test_debug_errors() -> None:
    with pytest.raises(ValueError, match="neither a filter_jit function"):
        tm.debug.get_num_traces(lambda x: x)
    with pytest.raises(ValueError, match="max_traces must be an int"):
        tm.debug.assert_max_traces(lambda x: x, max_traces=-1)


class _NoRepr:
    """A hashable static value whose `repr` raises (issue 37)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __hash__(self) -> int:
        return hash(self.n)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NoRepr) and other.n == self.n

    def __repr__(self) -> str:
        raise RuntimeError("repr is broken")


@pytest.mark.parametrize("switch", ["argument", "environment"])
def test_a_static_value_whose_repr_raises_does_not_fail_the_retrace(
    switch: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The explainer is a diagnostic: the calls return what they return without it."""
    if switch == "environment":
        monkeypatch.setenv("TREEMOD_EXPLAIN_RETRACES", "1")
        f = tm.filter_jit(lambda x, s: x * s.n)
    else:
        f = tm.filter_jit(lambda x, s: x * s.n, explain_retraces=True)
    lines = _explained(caplog, f, (jnp.ones(2), _NoRepr(1)), (jnp.ones(2), _NoRepr(3)))
    assert f(jnp.ones(2), _NoRepr(3)).tolist() == [3.0, 3.0]  # numpy: np.ones(2) * 3
    assert lines == [
        "retrace of <lambda>: args[1]: static value <_NoRepr object; its repr raised "
        "RuntimeError> -> <_NoRepr object; its repr raised RuntimeError>"
    ]


def test_an_explainer_failure_is_logged_and_the_call_goes_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from treemod._transforms import jit_cache

    def broken(old: Any, new: Any) -> list[str]:
        raise ValueError("explainer bug")

    monkeypatch.setattr(jit_cache, "explain", broken)
    f = tm.filter_jit(lambda x: x + 1, explain_retraces=True)
    lines = _explained(caplog, f, (jnp.ones(1),), (jnp.ones(2),))
    assert f(jnp.ones(2)).tolist() == [2.0, 2.0]
    assert lines == ["retrace of <lambda>: (cannot explain it: ValueError: explainer bug)"]
