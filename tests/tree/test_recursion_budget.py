"""Errors raised about a tree leave Python's recursion budget intact.

jaxlib's C++ flattening loses one level of the budget per enclosing node when a callback
raises through it (jaxlib 0.10.2; fixed by jaxlib 0.12); `sys.setrecursionlimit` does not give
it back. treemod's
own refusals are raised after the flattening returns, so they cost nothing however often
they happen (tests/conftest.py's headroom exists for tests that raise through it on purpose).
"""

from __future__ import annotations

import jax.tree_util as jtu
import jaxlib
import pytest

import treemod as tm

from helpers import recursion_budget_lost


def _self_reference() -> list:
    loop: list = []
    loop.append(loop)
    return loop


def test_raising_through_jaxlib_flattening_loses_budget_before_jaxlib_0_12() -> None:
    # The premise, with plain JAX: an is_leaf that raises at depth 3 loses budget every time on
    # the oldest supported jaxlib, and none on the newest.
    before = recursion_budget_lost()
    for _ in range(5):
        with pytest.raises(ZeroDivisionError):
            jtu.tree_leaves([[[1.0]]], is_leaf=lambda x: 1 / 0 if isinstance(x, float) else False)
    fixed = tuple(int(p) for p in jaxlib.__version__.split(".")[:2]) >= (0, 12)
    assert (recursion_budget_lost() > before) is not fixed


@pytest.mark.parametrize(
    "refuse", [tm.tree_flatten_one_level, tm.tree_check], ids=["flatten_one_level", "tree_check"]
)
def test_refusing_a_self_reference_loses_no_budget(refuse: object) -> None:
    loop = _self_reference()
    before = recursion_budget_lost()
    for _ in range(20):
        with pytest.raises(ValueError, match="contain itself|holds itself"):
            refuse(loop)  # type: ignore[operator]
    assert recursion_budget_lost() == before
