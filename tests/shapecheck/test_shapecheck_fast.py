"""The fast array check agrees with jaxtyping's own check (verdict and bound dimensions)."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxtyping import Array, Float, Int, Shaped
from jaxtyping._storage import get_shape_memo, pop_shape_memo, push_shape_memo

from treemod._shapecheck.array_checker import compile_array_check, fast_array_check

TOKENS = ["a", "b", "c", "_", "1", "2", "3", "#a", "#b", "#2"]
DTYPES = [jnp.float32, jnp.int32, jnp.bfloat16, jnp.bool_]
KINDS = [Float, Int, Shaped]

# Created once: jnp arrays of every shape and dtype the strategy can draw.
_ARRAYS: dict = {}


def _array(shape: tuple[int, ...], dtype) -> jnp.ndarray:
    key = (shape, jnp.dtype(dtype).name)
    if key not in _ARRAYS:
        _ARRAYS[key] = jax.device_put(np.zeros(shape, dtype))  # no compile
    return _ARRAYS[key]


def _run(check, prebound: dict[str, int]):
    push_shape_memo({})
    try:
        get_shape_memo()[0].update(prebound)
        verdict = check()
        return verdict, dict(get_shape_memo()[0])
    finally:
        pop_shape_memo()


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.sampled_from(TOKENS), max_size=3),
    shape=st.lists(st.integers(1, 3), max_size=3),
    dtype=st.sampled_from(DTYPES),
    kind=st.sampled_from(KINDS),
    prebound=st.dictionaries(st.sampled_from(["a", "b"]), st.integers(1, 3)),
)
def test_fast_check_agrees_with_jaxtyping(tokens, shape, dtype, kind, prebound):
    annotation = kind[Array, " ".join(tokens)]
    spec = compile_array_check(annotation)
    assert spec is not None
    value = _array(tuple(shape), dtype)
    fast, fast_memo = _run(lambda: fast_array_check(spec, value), prebound)
    reference, ref_memo = _run(lambda: isinstance(value, annotation), prebound)
    assert fast == reference, (annotation, value.shape, value.dtype, prebound)
    if reference:
        assert fast_memo == ref_memo


def test_general_annotations_use_jaxtyping():
    assert compile_array_check(Float[Array, "*batch n"]) is None
    assert compile_array_check(Float[Array, "n+1"]) is None
    assert compile_array_check(Float[np.ndarray, "n"]) is None
    assert compile_array_check(int) is None


def test_non_jax_values_are_left_to_jaxtyping():
    spec = compile_array_check(Float[Array, "n"])
    assert spec is not None
    assert not _run(lambda: fast_array_check(spec, np.zeros(3, np.float32)), {})[0]
    assert not _run(lambda: fast_array_check(spec, None), {})[0]
