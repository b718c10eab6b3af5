"""error_if's `on_error` modes and RuntimeCheckError, against Equinox where it is installed."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm

from fresh_interpreter import run_printing


def _modes_fn(on_error: str):  # type: ignore[no-untyped-def]
    def f(x: jax.Array, pred: jax.Array) -> jax.Array:
        return tm.error_if(x, pred, "bad", on_error=on_error)  # type: ignore[arg-type]

    return f


def test_nan_mode_fills_every_dtype_as_equinox_does() -> None:
    tree = {"f": jnp.ones(2), "i": jnp.arange(3, dtype=jnp.int32), "b": jnp.zeros(2, bool)}
    out = jax.jit(lambda t, p: tm.error_if(t, p, "bad", on_error="nan"))(tree, jnp.array(True))
    assert np.isnan(out["f"]).all()
    assert (out["i"] == np.iinfo(np.int32).max).all()
    assert out["b"].all()
    same = jax.jit(lambda t, p: tm.error_if(t, p, "bad", on_error="nan"))(tree, jnp.array(False))
    assert tm.tree_equal(same, tree)
    eqx = pytest.importorskip("equinox")
    ref = jax.jit(lambda t, p: eqx.error_if(t, p, "bad", on_error="nan"))(tree, jnp.array(True))
    np.testing.assert_array_equal(out["i"], ref["i"])
    np.testing.assert_array_equal(out["b"], ref["b"])
    assert np.isnan(ref["f"]).all()


def test_nan_mode_with_a_known_predicate() -> None:
    out = tm.error_if(jnp.ones(2), True, "bad", on_error="nan")
    assert np.isnan(out).all()


def test_off_mode_compiles_no_check() -> None:
    f = _modes_fn("off")
    assert jax.jit(f)(jnp.ones(()), jnp.array(True)) == 1
    assert "callback" not in str(jax.make_jaxpr(f)(jnp.ones(()), jnp.array(True)))


def test_a_known_predicate_is_decided_at_once() -> None:
    with pytest.raises(tm.RuntimeCheckError, match="^hi"):
        jax.jit(lambda x: tm.error_if(x, True, "hi"))(1.0)
    jaxpr = jax.make_jaxpr(lambda x: tm.error_if(x, False, "hi"))(1.0)
    assert "callback" not in str(jaxpr)  # a false predicate costs nothing
    assert issubclass(tm.RuntimeCheckError, RuntimeError)


def test_branched_message_of_a_known_predicate() -> None:
    with pytest.raises(tm.RuntimeCheckError, match="^second"):
        tm.branched_error_if(
            jnp.ones(3), jnp.array([False, True, True]), jnp.array([0, 1, 0]), ["first", "second"]
        )


def test_runtime_error_holds_the_message() -> None:
    f = jax.jit(_modes_fn("raise"))
    f(jnp.ones(()), jnp.array(False))
    with pytest.raises(RuntimeError, match="bad"):
        jax.block_until_ready(f(jnp.ones(()), jnp.array(True)))


_BREAKPOINT_UNDER_VMAP = """
import jax, jax.numpy as jnp, treemod as tm
f = lambda x, pred: tm.error_if(x, pred, "bad", on_error="breakpoint")
print(jax.make_jaxpr(jax.vmap(f))(jnp.ones(2), jnp.ones(2, bool)))
"""


@pytest.mark.heavy
def test_breakpoint_mode_opens_the_debugger(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stops: list[int] = []
    monkeypatch.setattr(sys, "breakpointhook", lambda *a, **k: stops.append(1))
    out = tm.error_if(jnp.ones(()), True, "look here", on_error="breakpoint")
    assert out == 1 and stops == [1]
    assert "error_if: look here" in capsys.readouterr().out
    jaxpr = run_printing(_BREAKPOINT_UNDER_VMAP)  # traced in a fresh interpreter: see its docstring
    assert "cond[" in jaxpr  # the debugger is a branch, even batched


def test_bad_on_error_names_the_choices() -> None:
    with pytest.raises(ValueError, match="error_if: on_error must be one of"):
        tm.error_if(jnp.ones(()), jnp.array(True), "x", on_error="explode")  # type: ignore[arg-type]


def test_filter_jit_raises_runtime_check_error_from_compiled_code() -> None:
    @tm.filter_jit
    def f(x: jax.Array) -> jax.Array:
        return tm.error_if(x, x > 0, "positive input")

    f(jnp.array(-1.0))  # a success first: the error is still this call's
    with pytest.raises(tm.RuntimeCheckError, match="^positive input$") as info:
        jax.block_until_ready(f(jnp.array(1.0)))
    assert info.value.__cause__ is None

    @tm.filter_jit
    def g(x: jax.Array) -> jax.Array:
        return jax.pure_callback(_raise_value_error, jax.ShapeDtypeStruct((), jnp.float32), x)

    with pytest.raises(RuntimeError, match="not a check") as other:
        jax.block_until_ready(g(jnp.array(1.0)))
    assert not isinstance(other.value, tm.RuntimeCheckError)  # other errors pass unchanged


def _raise_value_error(x: object) -> object:
    raise ValueError("not a check")
