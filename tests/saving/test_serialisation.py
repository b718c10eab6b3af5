"""save/load: round trips (all dtypes, sharding, State, values, PRNG keys, streams), key names."""

from __future__ import annotations

import io
import os
import pathlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from serialisation_models import Block, assert_same, net, saved

import treemod as tm
import treemod.nn  # noqa: F401 (tm.nn)


def _zeros_like(tree):
    return jax.tree_util.tree_map(lambda x: jnp.zeros_like(x) if tm.is_array(x) else x, tree)


def test_round_trip_model(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "model.safetensors"
    model = net()
    tm.save(path, model)
    loaded = tm.load(path, _zeros_like(net(scale=0.0)))
    assert_same(loaded, model)
    assert isinstance(loaded.stats, tm.State) and loaded.step == 7
    assert loaded.backbone.act == "relu"


def test_round_trip_abstract_like_allocates_nothing_twice(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "model.safetensors"
    model = net()
    tm.save(path, model)
    abstract = jax.eval_shape(lambda: net(0.0))
    assert all(
        isinstance(x, jax.ShapeDtypeStruct | int) for x in jax.tree_util.tree_leaves(abstract)
    )
    assert_same(tm.load(path, abstract), model)


def test_python_number_placeholders_from_eval_shape_take_the_file_value() -> None:
    buf = io.BytesIO()
    tm.save(buf, {"step": 12, "lr": 0.5, "w": jnp.ones(2)})
    abstract = jax.eval_shape(lambda: {"step": 0, "lr": 0.1, "w": jnp.zeros(2)})
    assert isinstance(abstract["step"], jax.ShapeDtypeStruct)
    buf.seek(0)
    out = tm.load(buf, abstract)
    assert out["step"] == 12 and type(out["step"]) is int and out["lr"] == 0.5


def test_state_leaves_and_weak_types_are_kept() -> None:
    model = {"count": tm.State(jnp.array(3)), "w": jnp.array(1.5)}
    assert model["count"].value.weak_type
    buf = io.BytesIO()
    tm.save(buf, model)
    buf.seek(0)
    out = tm.load(buf, {"count": tm.State(jnp.array(0)), "w": jnp.array(0.0)})
    assert isinstance(out["count"], tm.State)
    assert int(out["count"].value) == 3 and out["count"].value.weak_type
    assert out["w"].weak_type


ALL_DTYPES = [
    "bool",
    "uint8",
    "int8",
    "uint16",
    "int16",
    "uint32",
    "int32",
    "uint64",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3b11fnuz",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "int2",
    "int4",
    "uint2",
    "uint4",
]


def _dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, None) or name)


def _sample(name: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random values representable in `name` (via float32 for the small float formats)."""
    rng = np.random.default_rng(seed)
    dtype = _dtype(name)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(dtype, np.complexfloating):
        return (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, shape, dtype, endpoint=True)
    if name in ("int2", "int4", "uint2", "uint4"):
        info = ml_dtypes.iinfo(dtype)
        return rng.integers(int(info.min), int(info.max) + 1, shape).astype(dtype)
    return (np.abs(rng.normal(size=shape)) + 0.25).astype(np.float32).astype(dtype)


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_every_dtype_round_trips_bit_exactly_as_numpy(name: str) -> None:
    x = _sample(name, (3, 2))
    buf = io.BytesIO()
    tm.save(buf, {"x": x, "scalar": x[0, 0], "empty": x[:0]})
    buf.seek(0)
    out = tm.load(buf, {"x": np.zeros_like(x), "scalar": x[0, 0], "empty": x[:0]})
    assert type(out["x"]) is np.ndarray and out["x"].dtype == x.dtype
    assert out["x"].tobytes() == x.tobytes()
    assert type(out["scalar"]) is type(x[0, 0]) and out["scalar"].tobytes() == x[0, 0].tobytes()
    assert out["empty"].shape == (0, 2)


@pytest.mark.parametrize(
    "name",
    ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "int4", "uint4", "int2"],
)
def test_ml_dtypes_round_trip_as_jax_arrays(name: str) -> None:
    x = jnp.asarray(_sample(name, (5,)))
    buf = io.BytesIO()
    tm.save(buf, [x])
    buf.seek(0)
    (out,) = tm.load(buf, [jax.ShapeDtypeStruct(x.shape, x.dtype)])
    assert isinstance(out, jax.Array) and out.dtype == x.dtype
    assert np.asarray(out).tobytes() == np.asarray(x).tobytes()


def test_simple_values_round_trip() -> None:
    values = {
        "i": -(2**70),
        "f": 0.1,
        "nan": float("nan"),
        "inf": float("-inf"),
        "b": False,
        "c": 1 - 2.5j,
        "s": 'héllo ✓ "quoted" \n',
        "none": None,
        "empty": (),
    }
    buf = io.BytesIO()
    tm.save(buf, values)
    buf.seek(0)
    like = {"i": 0, "f": 0.0, "nan": 0.0, "inf": 0.0, "b": True, "c": 0j, "s": "", "none": None}
    like["empty"] = ()
    assert_same(tm.load(buf, like), values)


def test_non_data_leaves_come_from_like() -> None:
    buf = io.BytesIO()
    tm.save(buf, {"fn": jnp.tanh, "w": jnp.ones(2)})
    buf.seek(0)
    out = tm.load(buf, {"fn": jax.nn.relu, "w": jnp.zeros(2)})
    assert out["fn"] is jax.nn.relu


def _mesh() -> Mesh:
    devices = jax.devices("cpu")  # the 8 fake CPU devices of conftest, also beside a GPU
    if len(devices) < 8:
        pytest.skip("needs the 8 fake CPU devices of tests/conftest.py")
    return Mesh(np.array(devices[:8]).reshape(4, 2), ("data", "model"))


def test_sharded_arrays_save_and_load_with_like_sharding(tmp_path: pathlib.Path) -> None:
    mesh = _mesh()
    sharding = NamedSharding(mesh, PartitionSpec("data", "model"))
    x = jax.device_put(jnp.arange(32.0).reshape(8, 4), sharding)
    assert len(x.addressable_shards) == 8
    path = tmp_path / "sharded.safetensors"
    tm.save(path, {"x": x})
    # A concrete like with another sharding: the result takes like's sharding.
    other = NamedSharding(mesh, PartitionSpec(None, "model"))
    out = tm.load(path, {"x": jax.device_put(jnp.zeros((8, 4)), other)})
    assert out["x"].sharding == other
    np.testing.assert_array_equal(np.asarray(out["x"]), np.arange(32.0).reshape(8, 4))
    # An abstract like carrying a sharding.
    abstract = {"x": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=sharding)}
    out = tm.load(path, abstract)
    assert out["x"].sharding == sharding
    for shard in out["x"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(x)[shard.index])


def test_load_of_a_sharded_checkpoint_on_one_device() -> None:
    x = jax.device_put(jnp.arange(8.0), NamedSharding(_mesh(), PartitionSpec("data")))
    buf = io.BytesIO()
    tm.save(buf, x)
    buf.seek(0)
    out = tm.load(buf, jax.ShapeDtypeStruct((8,), jnp.float32))
    assert len(out.devices()) == 1
    np.testing.assert_array_equal(np.asarray(out), np.arange(8.0))


def test_optax_state_resume(tmp_path: pathlib.Path) -> None:
    import optax

    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    opt = optax.adam(1e-2)
    state = opt.init(params)
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    with jax.numpy_dtype_promotion("standard"):  # optax mixes its int32 count with floats
        updates, state = opt.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    path = tmp_path / "ckpt.safetensors"
    tm.save(path, {"params": params, "opt": state, "step": 1})
    like = {"params": params, "opt": opt.init(params), "step": 0}
    out = tm.load(path, like)
    assert out["step"] == 1
    assert_same(out["opt"], state)
    assert type(out["opt"][0]) is type(state[0])  # the optax namedtuple comes back


# Key paths are jax.tree_util.keystr.
def test_tensor_names_are_key_paths() -> None:
    import json
    import struct

    buf = io.BytesIO()
    tm.save(buf, net())
    raw = buf.getvalue()
    (n,) = struct.unpack("<Q", raw[:8])
    names = set(json.loads(raw[8 : 8 + n])) - {"__metadata__"}
    assert names == {".backbone.weight", ".backbone.bias", ".head.weight", ".stats.value"}


# --- hypothesis round trip ---------------------------------------------------------------

_HYP_DTYPES = ["bool", "int8", "uint32", "int32", "float16", "bfloat16", "float32", "float64"]
_HYP_DTYPES += ["complex64", "int4", "float8_e4m3fn", "float8_e5m2"]


@st.composite
def _arrays(draw):
    name = draw(st.sampled_from(_HYP_DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    x = _sample(name, shape, seed=draw(st.integers(0, 2**16)))
    return x if draw(st.booleans()) else jnp.asarray(x)


_simple = (
    st.integers(-(2**80), 2**80)
    | st.floats(allow_nan=True)
    | st.booleans()
    | st.text(max_size=8)
    | st.none()
    | st.complex_numbers(allow_nan=False)
)
_leaves = _arrays() | _simple
_keys = st.text("abcxyz_", min_size=1, max_size=4)


def _trees():
    return st.recursive(
        _leaves,
        lambda children: (
            st.lists(children, max_size=3)
            | st.tuples(children, children)
            | st.dictionaries(_keys, children, max_size=3)
            | st.builds(lambda w, b: Block(w, b), children, children)
        ),
        max_leaves=10,
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_trees())
def test_hypothesis_round_trip(tree) -> None:
    buf = io.BytesIO()
    tm.save(buf, tree)
    buf.seek(0)
    like = jax.tree_util.tree_map(
        lambda x: np.zeros_like(x) if isinstance(x, np.ndarray) else x, tree
    )
    assert_same(tm.load(buf, like), tree)
    buf.seek(0)
    abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else x, tree
    )
    assert_same(tm.load(buf, abstract), tree)


def test_saving_to_a_path_leaves_no_temporary_files(tmp_path: pathlib.Path) -> None:
    tm.save(tmp_path / "a.safetensors", {"w": jnp.ones(2)})
    tm.save(str(tmp_path / "a.safetensors"), {"w": jnp.ones(3)})
    assert os.listdir(tmp_path) == ["a.safetensors"]
    assert tm.load(tmp_path / "a.safetensors", {"w": jnp.ones(3)})["w"].shape == (3,)


def test_big_endian_numpy_arrays_are_stored_little_endian() -> None:
    x = np.arange(4, dtype=">f4")
    buf = saved({"x": x})
    assert np.arange(4, dtype="<f4").tobytes() in buf.getvalue()
    out = tm.load(buf, {"x": np.zeros(4, ">f4")})
    np.testing.assert_array_equal(out["x"], x)


def test_several_checkpoints_and_other_data_in_one_stream() -> None:
    # Equinox's pattern: a JSON line of hyperparameters, then the model, in one file.
    buf = io.BytesIO()
    buf.write(b'{"width": 3}\n')
    tm.save(buf, {"w": jnp.ones(3)})
    tm.save(buf, {"w": jnp.full(2, 2.0)})
    buf.seek(0)
    assert buf.readline() == b'{"width": 3}\n'
    first = tm.load(buf, {"w": jnp.zeros(3)})
    second = tm.load(buf, {"w": jnp.zeros(2)})
    assert float(first["w"].sum()) == 3.0 and float(second["w"].sum()) == 4.0
    assert buf.read() == b""


def test_save_needs_an_existing_directory(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError, match="directory .*missing' does not exist.*makedirs"):
        tm.save(tmp_path / "missing" / "c.safetensors", {"w": jnp.ones(1)})


def test_batch_norm_running_statistics_are_saved_and_restored() -> None:
    bn = tm.nn.BatchNorm(3)
    x = jax.random.normal(jax.random.key(0), (8, 3, 4))
    for _ in range(2):
        _, bn = tm.stateful(bn)(x)
    # Reference by hand: the running mean is no longer its initial zeros.
    assert float(jnp.abs(bn.running_mean.value).sum()) > 0
    buf = saved(bn)
    fresh = tm.load(buf, jax.eval_shape(lambda: tm.nn.BatchNorm(3)))
    for name in ("running_mean", "running_var"):
        np.testing.assert_array_equal(
            np.asarray(getattr(fresh, name).value), np.asarray(getattr(bn, name).value)
        )
    np.testing.assert_array_equal(
        np.asarray(tm.nn.inference_mode(fresh)(x)), np.asarray(tm.nn.inference_mode(bn)(x))
    )


def test_prng_keys_round_trip() -> None:
    key = jax.random.key(42)
    keys = jax.random.split(jax.random.key(1), 3)
    rbg = jax.random.key(7, impl="rbg")
    tree = {"key": key, "keys": keys, "rbg": rbg, "raw": jax.random.PRNGKey(3)}
    buf = saved(tree)
    abstract = jax.eval_shape(lambda: tree)
    for like in (tree, abstract):
        buf.seek(0)
        out = tm.load(buf, like)
        for name in ("key", "keys", "rbg"):
            assert out[name].dtype == tree[name].dtype
            np.testing.assert_array_equal(
                np.asarray(jax.random.key_data(out[name])),
                np.asarray(jax.random.key_data(tree[name])),
            )
        # The restored keys draw the same numbers.
        np.testing.assert_array_equal(
            np.asarray(jax.random.normal(out["key"], (3,))),
            np.asarray(jax.random.normal(key, (3,))),
        )
        np.testing.assert_array_equal(np.asarray(out["raw"]), np.asarray(tree["raw"]))


def test_prng_key_mismatches_are_reported_by_key_dtype() -> None:
    buf = saved({"key": jax.random.key(0), "raw": jax.random.PRNGKey(0)})
    like = {"key": jax.random.key(0, impl="rbg"), "raw": jax.random.key(0)}
    with pytest.raises(tm.CheckpointError) as e:
        tm.load(buf, like)
    msg = str(e.value)
    assert "wrong dtype: ['key'] is key<fry>[] in the file but key<rbg>[] in like" in msg
    assert "wrong shape and dtype: ['raw'] is u32[2] in the file but key<fry>[] in like" in msg


def test_a_deleted_array_is_named_and_nothing_is_written(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "c.safetensors"
    x = jnp.ones(3)
    x.delete()
    with pytest.raises(RuntimeError, match=r"could not fetch the array at \['x'\].*deleted"):
        tm.save(path, {"w": jnp.ones(2), "x": x})
    assert os.listdir(tmp_path) == []
