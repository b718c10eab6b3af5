"""`filter_pmap`'s size errors name the arguments by their paths (and parameter names), as
`filter_vmap`'s do: `jax.pmap` (JAX 0.10) fails while placing the arrays and names none."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

import treemod as tm


def add(a, b, *, c=0.0):
    return a + b["w"] + c


def _jax_sizes_message(f, *args, **kwargs) -> str:
    """JAX's own message for mapped axes of inconsistent sizes (jax.vmap's check: jax.pmap
    has none of its own in JAX 0.10), as `pmap` would say it."""
    with pytest.raises(ValueError, match="inconsistent sizes") as theirs:
        f(*args, **kwargs)
    return re.sub(r"^vmap ", "pmap ", str(theirs.value))


def test_jax_pmap_names_no_argument() -> None:
    # the reason for the error path: JAX's message says nothing of which argument it is
    with pytest.raises(Exception) as e:  # noqa: PT011 (IndivisibleError or ValueError)
        jax.pmap(lambda x, y: x + y)(jnp.ones(2), jnp.ones(4))
    assert "argument" not in str(e.value)


def test_inconsistent_sizes_match_jax_apart_from_the_names() -> None:
    ours = pytest.raises(ValueError)
    with ours:
        tm.filter_pmap(lambda x, y: x + y)(jnp.ones(2), jnp.ones(4))
    expected = _jax_sizes_message(jax.vmap(lambda x, y: x + y), jnp.ones(2), jnp.ones(4))
    expected = expected.replace("argument x ", "argument args[0] (parameter 'x') ")
    expected = expected.replace("argument y ", "argument args[1] (parameter 'y') ")
    assert str(ours.excinfo.value) == f"filter_pmap(<lambda>): {expected}"


def test_paths_into_arguments_keywords_and_axis_size() -> None:
    with pytest.raises(ValueError) as e:
        tm.filter_pmap(add)(jnp.ones(2), {"w": jnp.ones((4, 3))})
    msg = str(e.value)
    assert msg.startswith("filter_pmap(add): pmap got inconsistent sizes")
    assert "axis 0 of argument args[0] (parameter 'a') of type float32[2]" in msg
    assert "axis 0 of argument args[1]['w'] (parameter 'b') of type float32[4,3]" in msg
    with pytest.raises(ValueError, match=r"argument kwargs\['c'\] of type float32\[4\]"):
        tm.filter_pmap(add)(jnp.ones(2), {"w": jnp.ones(2)}, c=jnp.ones(4))
    with pytest.raises(ValueError, match=r"axis 1 of argument args\[1\]\['w'\] \(parameter 'b'"):
        tm.filter_pmap(add, in_axes=(0, {"w": 1}))(jnp.ones(2), {"w": jnp.ones((2, 3))})
    with pytest.raises(ValueError) as e:
        tm.filter_pmap(add, axis_size=4)(jnp.ones(2), {"w": jnp.ones(2)})
    assert "* the `axis_size` argument was 4" in str(e.value)
    assert "argument args[0] (parameter 'a') of type float32[2]" in str(e.value)


def test_an_axis_an_argument_lacks_is_named() -> None:
    with pytest.raises(
        ValueError,
        match=r"filter_pmap\(add\): in_axes maps an axis an argument lacks: args\[1\]\['w'\] "
        r"\(parameter 'b'\), of shape \(2,\), has no axis 1",
    ):
        tm.filter_pmap(add, in_axes=(0, {"w": 1}))(jnp.ones(2), {"w": jnp.ones(2)})
    with pytest.raises(ValueError, match=r"args\[0\] \(parameter 'x'\), of shape \(\), has no"):
        tm.filter_pmap(lambda x: x)(jnp.array(3.0))


def test_lowering_and_compiled_calls_name_them_too() -> None:
    f = tm.filter_pmap(lambda x, y: x + y)
    with pytest.raises(ValueError, match=r"args\[1\] \(parameter 'y'\) of type float32\[4\]"):
        f.lower(jnp.ones(2), jnp.ones(4))
    compiled = f.lower(jnp.ones(2), jnp.ones(2)).compile()
    with pytest.raises(ValueError, match=r"args\[1\] \(parameter 'y'\) of type float32\[4\]"):
        compiled(jnp.ones(2), jnp.ones(4))


def test_spec_errors_name_filter_pmap() -> None:
    with pytest.raises(ValueError, match=r"^filter_pmap\(<lambda>\): in_axes maps axis 0 of args"):
        tm.filter_pmap(lambda x, n: x, in_axes=(0, 0))(jnp.ones((2, 1)), 3)
    with pytest.raises(ValueError, match=r"^filter_pmap\(<lambda>\): in_axes names \['z'\]"):
        tm.filter_pmap(lambda x: x, in_axes={"z": 0})(jnp.ones(2))


def test_more_slices_than_devices_names_the_argument() -> None:
    n = len(jax.local_devices())  # 8 fake CPU devices (tests/conftest.py)
    with pytest.raises(Exception) as theirs:  # noqa: PT011 (JAX's error names no argument)
        jax.pmap(lambda x: x * 2)(jnp.arange(2.0 * n))
    assert "argument" not in str(theirs.value)
    with pytest.raises(
        ValueError,
        match=rf"filter_pmap\(<lambda>\): the mapped axes have size {2 * n} \(axis 0 of args\[1\]"
        rf"\['w'\] \(parameter 'b'\), of shape \({2 * n},\)\), but only {n} devices are available",
    ):
        tm.filter_pmap(lambda a, b: b["w"], in_axes=(None, 0))(jnp.ones(()), {"w": jnp.ones(2 * n)})
    two = jax.local_devices()[:2]
    with pytest.raises(ValueError, match=r"size 3 .* but only 2 devices are available"):
        tm.filter_pmap(lambda x: x, devices=two)(jnp.ones(3))
    assert tm.filter_pmap(lambda x: x * 2, devices=two)(jnp.ones(2)).shape == (2,)
