"""A module is a tree: storing a module whose `__init__` has not finished (itself, or one that
is building it) would make a cycle, so construction refuses it, naming the field."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import pytest

import treemod as tm


class Holder(tm.Module):
    child: Any


class Parent(tm.Module):
    child: Any

    def __init__(self, how: str) -> None:
        if how == "self":
            self.child = self
        elif how == "list":
            self.child = [jnp.ones(1), {"x": (1, self)}]
        else:  # a child module built with a reference to its parent
            self.child = Holder(self)


@pytest.mark.parametrize(
    ("how", "where"),
    [
        ("self", r"Parent\.child "),
        ("list", r"Parent\.child\[1\]\['x'\]\[1\] "),
        ("child", r"Holder\.child "),
    ],
)
def test_storing_an_unfinished_module_is_refused_naming_the_field(how: str, where: str) -> None:
    with pytest.raises(ValueError, match=where + r"holds a module whose __init__ has not finished"):
        Parent(how)


def test_the_refusal_leaves_nothing_half_built() -> None:
    # A failed construction must not leave the module marked as being built: a later module
    # holding an equal-looking value is fine.
    with pytest.raises(ValueError):
        Parent("self")
    finished = Holder(jnp.ones(2))
    assert Holder(finished).child is finished


def test_finished_modules_and_shared_ones_are_still_accepted() -> None:
    shared = Holder(jnp.ones(2))
    pair = Holder([shared, shared, {"again": shared}])
    assert pair.child[0] is pair.child[1] is pair.child[2]["again"]
    # A tree built bottom-up can still be saved (no recursion).
    import io

    buf = io.BytesIO()
    tm.save(buf, pair)
    buf.seek(0)
    assert tm.tree_equal(tm.load(buf, pair), pair)
