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


@pytest.mark.parametrize(
    ("in_axes", "kwargs", "where"),
    [
        ((0, {"w": 1}), {}, r"args\[1\]\['w'\] \(parameter 'b'\), of shape \(3,\), has no axis 1"),
        (
            {"c": -2, "b": None},
            {"c": jnp.ones(3)},
            r"kwargs\['c'\], of shape .* has no axis -2",
        ),
    ],
)
def test_an_axis_an_argument_lacks_is_named(in_axes: object, kwargs: dict, where: str) -> None:
    # JAX's own error says which axis and shape, but not which argument
    with pytest.raises(ValueError, match="requested to map its argument along axis"):
        jax.vmap(lambda x: x, in_axes=1)(jnp.ones(3))
    f = tm.filter_vmap(add, in_axes=in_axes)
    with pytest.raises(ValueError, match=r"filter_vmap\(add\): in_axes maps an axis an argument "):
        f(jnp.ones(3), {"w": jnp.ones(3)}, **kwargs)
    with pytest.raises(ValueError, match=where):
        f(jnp.ones(3), {"w": jnp.ones(3)}, **kwargs)


def test_an_out_axis_an_output_lacks_is_named() -> None:
    def f(a: jax.Array) -> dict:
        return {"o": a, "p": [a, a]}

    x = jnp.ones(3)
    with pytest.raises(ValueError, match="out of bounds"):  # jax.vmap refuses it too
        jax.vmap(f, out_axes={"o": 0, "p": [0, 2]})(x)
    with pytest.raises(
        ValueError,
        match=r"filter_vmap\(f\): out_axes puts the mapped axis of the output at \['p'\]\[1\] at "
        r"axis 2, .*shape \(3,\).* must be in \[-1, 0\]",
    ):
        tm.filter_vmap(f, out_axes={"o": 0, "p": [0, 2]})(x)
    with pytest.raises(ValueError, match=r"mapped axis of the output at axis -3"):
        tm.filter_vmap(lambda a: a, out_axes=-3)(x)
    y = jnp.arange(6.0).reshape(3, 2)  # a valid out_axes still gives jax.vmap's result
    np.testing.assert_array_equal(
        tm.filter_vmap(lambda a: a * 2, out_axes=1)(y), jax.vmap(lambda a: a * 2, out_axes=1)(y)
    )
