"""tree_pformat's struct_as_array and truncate_leaf options (treemod's array format)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import treemod as tm


def test_struct_as_array() -> None:
    tree = {"s": jax.ShapeDtypeStruct((2, 3), jnp.float32)}
    assert tm.tree_pformat(tree) == "{'s': f32[2,3]}"
    assert tm.tree_pformat(tree, struct_as_array=False) == repr(tree)


class _Block(tm.Module):
    w: jax.Array


def test_truncate_leaf_elides_chosen_nodes() -> None:
    tree = {"block": _Block(jnp.ones(3)), "n": 1}
    text = tm.tree_pformat(tree, truncate_leaf=lambda x: isinstance(x, _Block))
    assert text == "{'block': _Block(...), 'n': 1}"
