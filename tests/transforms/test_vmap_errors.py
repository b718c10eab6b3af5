"""`filter_vmap`'s size errors name the arguments by their paths (and parameter names), not by
treemod's internal list of mapped arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm


def add(a, b, *, c=0.0):
    return a + b["w"] + c


def test_inconsistent_sizes_name_the_arguments() -> None:
    with pytest.raises(ValueError) as e:
        tm.filter_vmap(add)(jnp.ones(3), {"w": jnp.ones(4)})
    msg = str(e.value)
    assert msg.startswith("filter_vmap(add): vmap got inconsistent sizes")
    assert "argument args[0] (parameter 'a') of type float32[3]" in msg
    assert "argument args[1]['w'] (parameter 'b') of type float32[4]" in msg
    assert "dyn[" not in msg


def test_keyword_arguments_and_axis_size() -> None:
    with pytest.raises(ValueError, match=r"argument kwargs\['c'\] of type float32\[5\]"):
        tm.filter_vmap(add)(jnp.ones(3), {"w": jnp.ones(3)}, c=jnp.ones(5))
    with pytest.raises(ValueError) as e:
        tm.filter_vmap(add, axis_size=2)(jnp.ones(3), {"w": np.ones(3, np.float32)})
    assert "`axis_size` argument was 2" in str(e.value) and "args[0] (parameter 'a')" in str(
        e.value
    )


def test_the_message_matches_jax_vmap_apart_from_the_names() -> None:
    with pytest.raises(ValueError) as ours:
        tm.filter_vmap(lambda x, y: x + y)(jnp.ones(3), jnp.ones(4))
    with pytest.raises(ValueError) as theirs:
        jax.vmap(lambda x, y: x + y)(jnp.ones(3), jnp.ones(4))
    expected = str(theirs.value).replace("argument x ", "argument args[0] (parameter 'x') ")
    expected = expected.replace("argument y ", "argument args[1] (parameter 'y') ")
    assert str(ours.value) == f"filter_vmap(<lambda>): {expected}"
