"""The one format for arrays and values in reprs and error messages (`treemod._format.describe`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import wadler_lindig as wl

import treemod as tm
from treemod._format.describe import describe_array, describe_value, short_dtype

DTYPES = [
    jnp.bool_, jnp.int4, jnp.int8, jnp.int16, jnp.int32, jnp.uint8, jnp.uint32, jnp.bfloat16,
    jnp.float16, jnp.float32, jnp.float8_e4m3fn, jnp.complex64,
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_arrays_are_written_as_wadler_lindig_writes_them(dtype):
    shape = (2, 0, 3)
    want = wl.pformat(wl.array_summary(shape, np.dtype(dtype).name, kind=None))
    assert describe_array(shape, dtype) == want
    assert describe_value(jnp.zeros(shape, dtype)) == want
    assert short_dtype(np.dtype(dtype).name) == short_dtype(dtype)


def test_by_hand():
    assert describe_array((), jnp.float32, weak_type=True) == "f32[] (weak type)"
    assert describe_value(jax.ShapeDtypeStruct((4,), jnp.int32)) == (
        "i32[4] (jax.ShapeDtypeStruct)"
    )
    assert describe_value({"a": [1.5, "s", None]}) == "{'a': [float 1.5, str 's', None]}"
    assert describe_value(tuple(range(8))).endswith(", int 5, ...)")
    assert describe_value((jnp.ones(1),)) == "(f32[1],)"
    assert describe_value(tm.nn.Identity()) == "Identity"


def test_prng_keys_are_described_and_printed():
    key = jax.random.key(0)
    assert describe_value(key) == "key<fry>[]"
    assert describe_value(jax.random.split(key, 3)) == "key<fry>[3]"
    assert tm.tree_pformat({"k": key}) == "{'k': key<fry>[]}"

    class Sampler(tm.Module):
        key: jax.Array

    assert repr(Sampler(key)).endswith("Sampler(key=key<fry>[])")


def test_summary_counts_prng_keys_by_their_bytes():
    keys = jax.random.split(jax.random.key(0), 3)
    rows = [line.split() for line in str(tm.tree_summary({"k": keys})).splitlines()]
    assert ["['k']", "key<fry>[3]", "3", f"{jax.random.key_data(keys).nbytes}"] in rows
