"""Enumeration: items through jit/vmap/where, inheritance and promote, errors; vs Equinox."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm


class Result(tm.Enumeration):
    ok = "success"
    diverged = "the solver diverged"


class Other(tm.Enumeration):
    ok = "fine"


class More(Result):
    stalled = "no progress"


def test_items_compare_within_their_enumeration_only() -> None:
    assert bool(Result.ok == Result.ok) and bool(Result.ok != Result.diverged)
    with pytest.raises(ValueError, match="Result items can only be compared"):
        _ = Result.ok == Other.ok
    with pytest.raises(ValueError, match="Result items can only be compared"):
        _ = Result.ok == 0
    assert isinstance(Result.ok, Result) and not isinstance(Other.ok, Result)


def test_items_pass_through_jit_and_vmap() -> None:
    @jax.jit
    def pick(x: jax.Array) -> tm.EnumerationItem:  # type: ignore[name-defined]
        return Result.where(jnp.isfinite(x), Result.ok, Result.diverged)

    assert Result[pick(jnp.array(1.0))] == "success"
    assert Result[pick(jnp.array(jnp.inf))] == "the solver diverged"
    batched = jax.vmap(lambda x: Result.where(x > 0, Result.ok, Result.diverged))(
        jnp.array([1.0, -1.0])
    )
    assert Result[batched] == "['success' 'the solver diverged']"
    assert repr(Result.ok).endswith("test_enumeration.Result<success>")


def test_where_with_a_known_predicate_stays_static() -> None:
    @jax.jit
    def f(x: jax.Array) -> jax.Array:
        item = Result.where(True, Result.ok, Result.diverged)
        assert not item.is_traced() and bool(item == Result.ok)
        return x

    f(jnp.ones(()))


def test_inheritance_len_and_promote() -> None:
    assert len(Result) == 2 and len(More) == 3
    assert bool(More.promote(Result.diverged) == More.diverged)
    with pytest.raises(ValueError, match="More.promote takes an item"):
        More.promote(More.ok)
    with pytest.raises(ValueError, match="More items can only be compared.*promote"):
        _ = More.ok == Result.ok


def test_reserved_and_bad_items() -> None:
    with pytest.raises(ValueError, match="cannot have an item named 'where'"):

        class Bad(tm.Enumeration):
            where = "x"

    with pytest.raises(TypeError, match="must be a message string"):

        class Bad2(tm.Enumeration):
            n = 3

    with pytest.warns(UserWarning, match="is replaced by"):

        class Changed(Result):
            ok = "changed"

    assert Changed[Changed.ok] == "changed"


def test_error_if_raises_the_item_message() -> None:
    token = jnp.ones(())
    Result.diverged.error_if(token, False)
    with pytest.raises(RuntimeError, match="the solver diverged"):
        Result.diverged.error_if(token, True)
    f = tm.filter_jit(lambda t, p: Result.diverged.error_if(t, p))
    with pytest.raises(RuntimeError, match="the solver diverged"):
        jax.block_until_ready(f(token, jnp.array(True)))


def test_same_indices_as_equinox() -> None:
    eqxi = pytest.importorskip("equinox.internal")

    class A(eqxi.Enumeration):  # type: ignore[misc]
        ok = "success"
        diverged = "the solver diverged"

    class B(A):  # type: ignore[misc]
        stalled = "no progress"

    for name in ("ok", "diverged", "stalled"):
        assert int(np.asarray(getattr(More, name)._value)) == int(
            np.asarray(getattr(B, name)._value)
        )
        assert More[getattr(More, name)] == B[getattr(B, name)]
