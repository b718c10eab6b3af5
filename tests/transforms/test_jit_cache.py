"""filter_jit's compiled versions: static keys, re-wrapping, closures, threads, the bound."""

from __future__ import annotations

import cmath
import gc
import math
import threading
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm
from treemod._transforms import jit_cache


def _traced(log: list[Any]) -> Any:
    """A function that records each trace (a Python side effect, seen only while tracing)."""

    def f(x: jax.Array, s: Any) -> jax.Array:
        log.append(s)
        return x * math.copysign(1.0, s.real if isinstance(s, complex) else s)

    return f


def test_minus_zero_and_zero_are_different_static_values() -> None:
    log: list[Any] = []
    f = tm.filter_jit(_traced(log))
    x = jnp.ones(2)
    np.testing.assert_array_equal(f(x, 0.0), np.ones(2))
    np.testing.assert_array_equal(f(x, -0.0), -np.ones(2))  # math.copysign(1, -0.0) == -1
    np.testing.assert_array_equal(f(x, 0.0), np.ones(2))
    assert len(log) == 2


def test_complex_signed_zeros_are_different_static_values() -> None:
    log: list[Any] = []
    f = tm.filter_jit(lambda x, s: (log.append(s), x * cmath.phase(s))[1])
    x = jnp.ones(1)
    assert float(f(x, complex(-1.0, 0.0))[0]) == pytest.approx(cmath.phase(complex(-1.0, 0.0)))
    assert float(f(x, complex(-1.0, -0.0))[0]) == pytest.approx(cmath.phase(complex(-1.0, -0.0)))
    assert len(log) == 2


def test_nan_static_values_compile_once() -> None:
    log: list[Any] = []
    f = tm.filter_jit(lambda x, s: (log.append(s), x + s)[1])
    x = jnp.zeros(2)
    for _ in range(5):
        out = f(x, float("nan"))  # a new NaN object each call
        assert np.isnan(np.asarray(out)).all()
    assert len(log) == 1


@settings(max_examples=30, deadline=None)
@given(st.floats(allow_nan=True), st.floats(allow_nan=True))
def test_float_keys_follow_the_bits(a: float, b: float) -> None:
    """Two static floats share a version exactly when their bits are equal."""
    log: list[Any] = []
    f = tm.filter_jit(lambda x, s: (log.append(s), x)[1])
    f(jnp.zeros(()), a)
    f(jnp.zeros(()), b)
    same = np.float64(a).tobytes() == np.float64(b).tobytes()
    assert len(log) == (1 if same else 2)


_FLOATS = st.sampled_from([0.0, -0.0, 1.0, -2.5, float("nan"), float("inf")]) | st.floats()


@settings(max_examples=30, deadline=None)
@given(st.tuples(_FLOATS, _FLOATS), st.tuples(_FLOATS, _FLOATS))
def test_several_float_keys_follow_the_bits(a: tuple[float, float], b: tuple[float, float]) -> None:
    """Two calls with two static floats each share a version exactly when both floats' bits
    are equal (plain nonzero floats are keyed by value, zeros and NaNs by their bits)."""
    log: list[Any] = []
    f = tm.filter_jit(lambda x, s, t: (log.append((s, t)), x)[1])
    f(jnp.zeros(()), *a)
    f(jnp.zeros(()), *b)
    bits = [np.float64(v).tobytes() for v in (*a, *b)]
    assert len(log) == (1 if bits[:2] == bits[2:] else 2)


def test_rewrapping_the_same_function_does_not_retrace() -> None:
    log: list[Any] = []

    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        log.append(1)
        return jnp.sum(jnp.tanh(w @ x))

    w, x = jnp.ones((3, 3)), jnp.arange(3.0)
    expected = np.sum(np.tanh(np.ones((3, 3)) @ np.arange(3.0)))
    for _ in range(4):
        assert float(tm.filter_jit(loss)(w, x)) == pytest.approx(expected)
    assert len(log) == 1
    assert tm.debug.get_num_traces(tm.filter_jit(loss)) == 1


def test_rewrapping_retraces_for_a_new_static_value_and_new_options() -> None:
    log: list[Any] = []

    def scaled(x: jax.Array, scale: int) -> jax.Array:
        log.append(scale)
        return x * scale

    x = jnp.ones(2)
    assert tm.filter_jit(scaled)(x, 2).tolist() == [2.0, 2.0]
    assert tm.filter_jit(scaled)(x, 3).tolist() == [3.0, 3.0]
    assert tm.filter_jit(scaled)(x, 2).tolist() == [2.0, 2.0]
    assert log == [2, 3]
    tm.filter_jit(scaled, donate="all")(jnp.ones(2), 2)  # other options: other versions
    assert log == [2, 3, 2]


def test_new_closures_retrace() -> None:
    def make(scale: float) -> Any:
        return lambda x: x * scale

    x = jnp.ones(2)
    for scale in (1.0, 2.0, 3.0):
        assert tm.filter_jit(make(scale))(x).tolist() == [scale, scale]


def test_changed_closure_cell_retraces_when_rewrapped() -> None:
    scale = 2.0

    def f(x: jax.Array) -> jax.Array:
        return x * scale

    x = jnp.ones(2)
    assert tm.filter_jit(f)(x).tolist() == [2.0, 2.0]
    scale = 5.0  # the same function object, its cell now holds another value
    assert tm.filter_jit(f)(x).tolist() == [5.0, 5.0]
    assert tm.filter_jit(f)(x).tolist() == [5.0, 5.0]
    assert tm.debug.get_num_traces(tm.filter_jit(f)) == 1


def test_cells_the_function_assigns_do_not_retrace_when_rewrapped() -> None:
    """A `nonlocal` counter is the function's state: re-wrapping behaves as reusing one
    wrapper (and as `jax.jit` of the same function), tracing once."""
    num_traces = 0
    offset = 1.0

    def f(x: jax.Array) -> jax.Array:
        nonlocal num_traces
        num_traces += 1
        return x + offset

    x = jnp.ones(2)
    for transform in (lambda g: g, tm.filter_grad, tm.filter_vmap):
        num_traces = 0
        for _ in range(3):
            tm.filter_jit(transform(f))(x if transform is not tm.filter_grad else x.sum())
        assert num_traces == 1
    offset = 2.0  # a cell it only reads: a change still retraces
    assert tm.filter_jit(f)(x).tolist() == [3.0, 3.0]
    assert num_traces == 2


def test_closure_over_arrays_rewrapped_in_a_loop() -> None:
    x = jnp.arange(3.0)
    for i in range(3):
        w = jnp.full((3,), float(i))
        f = lambda x: x * w  # noqa: B023, E731 - a new closure each time, called at once
        assert tm.filter_jit(f)(x).tolist() == (np.arange(3.0) * i).tolist()


def test_shared_versions_do_not_keep_a_function_alive() -> None:
    def make() -> Any:
        big = jnp.ones(1000)
        return lambda x: x + big[0]

    f = make()
    ref = weakref.ref(f)
    tm.filter_jit(f)(jnp.ones(2))
    del f
    gc.collect()
    assert ref() is None


def test_threads_missing_together_trace_once() -> None:
    log: list[Any] = []

    def slow(x: jax.Array) -> jax.Array:
        log.append(1)
        return jnp.sin(x) * 2

    f = tm.filter_jit(slow).with_max_traces(1)
    barrier = threading.Barrier(8)
    results: list[Any] = [None] * 8
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = np.asarray(f(jnp.full(3, float(i))))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(log) == 1 and tm.debug.get_num_traces(f) == 1
    for i, r in enumerate(results):
        np.testing.assert_allclose(r, np.sin(np.full(3, float(i))) * 2, rtol=1e-6)


def test_many_versions_warn_and_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jit_cache, "WARN_VERSIONS", 4)
    monkeypatch.setattr(jit_cache, "MAX_VERSIONS", 6)
    f = tm.filter_jit(lambda x, n: x + n)
    f.cache.warn_at = jit_cache.WARN_VERSIONS  # a fresh cache reads it when created
    x = jnp.zeros(())
    for n in range(3):
        f(x, n)
    with pytest.warns(jit_cache.RecompileWarning, match=r"filter_jit\(<lambda>\) has now com"):
        f(x, 3)
    for n in range(4, 10):
        assert float(f(x, n)) == n  # no second warning: warnings are errors in the tests
    assert len(f.cache.versions) == 6
    traces = tm.debug.get_num_traces(f)
    assert float(f(x, 0)) == 0  # dropped: compiled again
    assert tm.debug.get_num_traces(f) == traces + 1


def test_warning_says_how_to_bound_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jit_cache, "WARN_VERSIONS", 2)
    f = tm.filter_jit(lambda x, n: x * n)
    f.cache.warn_at = 2
    f(jnp.ones(()), 1)
    with pytest.warns(jit_cache.RecompileWarning) as record:
        f(jnp.ones(()), 2)
    message = str(record[0].message)
    assert "with_max_traces" in message and "jnp.asarray" in message
    assert str(jit_cache.MAX_VERSIONS) in message


class _Act(tm.Module):
    """A module whose static field chooses its program (each trace logs the field)."""

    w: jax.Array
    act: str = tm.field(static=True)

    def __call__(self, x: jax.Array) -> jax.Array:
        _ACT_LOG.append(self.act)
        return self.w * x if self.act == "linear" else jnp.tanh(self.w * x)

    def double(self, x: jax.Array) -> jax.Array:
        return 2 * self(x)


_ACT_LOG: list[str] = []


def test_modules_with_other_static_fields_have_their_own_traces_and_programs() -> None:
    """Counted as plain `jax.jit` with the static field as a static argument counts them."""
    jax_log: list[str] = []

    def plain(w: jax.Array, x: jax.Array, act: str) -> jax.Array:
        jax_log.append(act)
        return w * x if act == "linear" else jnp.tanh(w * x)

    plain_jit = jax.jit(plain, static_argnames="act")
    _ACT_LOG.clear()
    x = jnp.arange(3.0)
    calls = [("linear", 1.0), ("tanh", 1.0), ("linear", 2.0), ("tanh", 3.0), ("linear", 1.0)]
    for act, scale in calls:
        w = jnp.full(3, scale)
        expected = plain_jit(w, x, act=act)
        np.testing.assert_allclose(tm.filter_jit(_Act(w, act))(x), expected, rtol=1e-6)
    assert _ACT_LOG == jax_log == ["linear", "tanh"]
    for act in ("linear", "tanh"):  # each static configuration counts its own trace
        assert tm.debug.get_num_traces(tm.filter_jit(_Act(x, act))) == 1
    assert tm.debug.get_num_traces(tm.filter_jit(_Act(x, "never called"))) == 0


def test_methods_of_modules_with_other_static_fields_have_their_own_traces() -> None:
    _ACT_LOG.clear()
    x = jnp.arange(3.0)
    for act in ("linear", "tanh", "linear"):
        out = tm.filter_jit(_Act(jnp.ones(3), act).double)(x)
        reference = 2 * (np.arange(3.0) if act == "linear" else np.tanh(np.arange(3.0)))
        np.testing.assert_allclose(out, reference, rtol=1e-6)
    assert _ACT_LOG == ["linear", "tanh"]
    assert tm.debug.get_num_traces(tm.filter_jit(_Act(x, "tanh").double)) == 1


def test_a_failed_first_trace_is_not_kept() -> None:
    """As with `jax.jit`, a trace that raised is tried again on the next call."""
    log: list[int] = []

    def f(x: jax.Array, fail: list[bool]) -> jax.Array:
        log.append(1)
        if fail[0]:
            raise ValueError("fails while tracing")
        return x + 1

    g = tm.filter_jit(lambda x: f(x, flag))
    flag = [True]
    with pytest.raises(ValueError, match="fails while tracing"):
        g(jnp.zeros(2))
    flag[0] = False
    assert g(jnp.zeros(2)).tolist() == [1.0, 1.0]
    assert g(jnp.zeros(2)).tolist() == [1.0, 1.0]
    assert len(log) == 2 and len(g.cache.versions) == 1


def _run_both_in_threads(first: Any, second: Any, arg: jax.Array) -> list[Any]:
    """Call `first(arg)` and `second(arg)` at once in two threads; fail on a 60 s hang."""
    barrier = threading.Barrier(2)
    results: list[Any] = [None, None]

    def run(i: int, fn: Any) -> None:
        barrier.wait()
        results[i] = np.asarray(fn(arg))

    threads = [
        threading.Thread(target=run, args=(i, fn), daemon=True)
        for i, fn in enumerate((first, second))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "the two traces deadlocked"
    return results


def test_threads_tracing_mutually_recursive_functions_do_not_deadlock() -> None:
    """Each thread traces one function, which calls the other while the other is traced."""
    started = threading.Barrier(2)

    def even(x: jax.Array) -> jax.Array:
        if x.shape[0] == 4:
            started.wait(timeout=60)  # both threads are now inside a trace
        return x if x.shape[0] == 1 else jnp.concatenate([tm_odd(x[1:]) + 1, x[:1]])

    def odd(x: jax.Array) -> jax.Array:
        if x.shape[0] == 4:
            started.wait(timeout=60)
        return x if x.shape[0] == 1 else jnp.concatenate([tm_even(x[1:]) * 2, x[:1]])

    tm_even, tm_odd = tm.filter_jit(even), tm.filter_jit(odd)
    results = _run_both_in_threads(tm_even, tm_odd, jnp.arange(4.0))

    def np_even(x: np.ndarray) -> np.ndarray:
        return x if len(x) == 1 else np.concatenate([np_odd(x[1:]) + 1, x[:1]])

    def np_odd(x: np.ndarray) -> np.ndarray:
        return x if len(x) == 1 else np.concatenate([np_even(x[1:]) * 2, x[:1]])

    np.testing.assert_allclose(results[0], np_even(np.arange(4.0)))
    np.testing.assert_allclose(results[1], np_odd(np.arange(4.0)))


class _Metres(float):
    pass


@pytest.mark.parametrize(
    "call",
    [
        lambda f, x, z: f(x, s=z),  # a keyword argument
        lambda f, x, z: f(x, ({"deep": [z]},)),  # nested in containers
        lambda f, x, z: f(x, _Metres(z)),  # a float subclass
    ],
    ids=["keyword", "nested", "subclass"],
)
def test_signed_zeros_differ_wherever_the_static_float_is(call: Any) -> None:
    def sign(x: jax.Array, s: Any) -> jax.Array:
        while not isinstance(s, float):
            s = s[0]["deep"][0] if isinstance(s, tuple) else s
        return x * math.copysign(1.0, s)

    f = tm.filter_jit(sign)
    x = jnp.ones(1)
    assert float(call(f, x, 0.0)[0]) == math.copysign(1.0, 0.0)
    assert float(call(f, x, -0.0)[0]) == math.copysign(1.0, -0.0)
    assert tm.debug.get_num_traces(f) == 2


def test_a_nan_static_field_reused_compiles_once() -> None:
    class Shift(tm.Module):
        by: float = tm.field(static=True)

    nan = float("nan")
    f = tm.filter_jit(lambda m, x: x + m.by)
    for _ in range(3):  # the same NaN object: the tree structures compare equal
        assert np.isnan(np.asarray(f(Shift(nan), jnp.zeros(2)))).all()
    assert tm.debug.get_num_traces(f) == 1


class _Scaled(tm.Module):
    """A module whose static dict field configures its program (issue 37)."""

    w: jax.Array
    config: dict = tm.field(static=True)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.w * x * self.config["scale"] + sum(self.config.get("shifts", []))


@pytest.mark.parametrize("as_fn", [False, True], ids=["argument", "callable"])
def test_a_mutated_static_dict_compiles_the_new_value(as_fn: bool) -> None:
    """The user edits the same dict object to build the next model: each model runs the
    program for the values its dict held at the call (NumPy computes the reference)."""
    config: dict[str, Any] = {"scale": 1.0, "shifts": [0.0]}
    call = (lambda m, x: tm.filter_jit(m)(x)) if as_fn else tm.filter_jit(lambda m, x: m(x))
    x = jnp.arange(3.0)
    for scale, shift in [(1.0, 0.0), (5.0, 0.0), (5.0, 2.0), (1.0, 0.0)]:
        config["scale"] = scale
        config["shifts"][0] = shift  # nested in the dict: copied too
        model = _Scaled(jnp.ones(3), config)
        np.testing.assert_allclose(call(model, x), np.arange(3.0) * scale + shift)


def test_an_unchanged_static_dict_compiles_once() -> None:
    log: list[Any] = []
    f = tm.filter_jit(lambda m, x: (log.append(1), m(x))[1])
    config = {"scale": 2.0}
    for _ in range(3):
        np.testing.assert_allclose(f(_Scaled(jnp.ones(2), config), jnp.ones(2)), [2.0, 2.0])
    f(_Scaled(jnp.ones(2), {"scale": 2.0}), jnp.ones(2))  # an equal dict: the same version
    assert len(log) == 1 and tm.debug.get_num_traces(f) == 1
