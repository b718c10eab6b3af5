"""save/load: round trips (all dtypes, sharding, State, values), like checks, partial loads."""

from __future__ import annotations

import io
import math
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

import treemod as tm
import treemod.nn  # noqa: F401 (tm.nn)


class Block(tm.Module):
    weight: jax.Array
    bias: jax.Array | None
    act: str = tm.field(static=True, default="relu")


class Net(tm.Module):
    backbone: Block
    head: Block
    stats: tm.State
    step: int


def _net(scale: float = 1.0, head_out: int = 2) -> Net:
    w = np.arange(12, dtype=np.float32).reshape(3, 4) * scale
    return Net(
        backbone=Block(jnp.asarray(w), jnp.ones(3)),
        head=Block(jnp.full((head_out, 3), scale), None),
        stats=tm.State(jnp.full(3, 2.0 * scale)),
        step=7,
    )


def _zeros_like(tree):
    return jax.tree_util.tree_map(lambda x: jnp.zeros_like(x) if tm.is_array(x) else x, tree)


def _assert_same(a, b) -> None:
    """Leaf by leaf: same type, dtype, shape and bits (NaN-safe), checked with NumPy."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        assert type(x) is type(y) or (isinstance(x, jax.Array) and isinstance(y, jax.Array))
        if tm.is_array(x):
            x, y = np.asarray(x), np.asarray(y)
            assert x.dtype == y.dtype and x.shape == y.shape
            assert x.tobytes() == y.tobytes()
        elif isinstance(x, float) and math.isnan(x):
            assert math.isnan(y)
        else:
            assert x == y


def test_round_trip_model(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "model.safetensors"
    model = _net()
    tm.save(path, model)
    loaded = tm.load(path, _zeros_like(_net(scale=0.0)))
    _assert_same(loaded, model)
    assert isinstance(loaded.stats, tm.State) and loaded.step == 7
    assert loaded.backbone.act == "relu"


def test_round_trip_abstract_like_allocates_nothing_twice(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "model.safetensors"
    model = _net()
    tm.save(path, model)
    abstract = jax.eval_shape(lambda: _net(0.0))
    assert all(
        isinstance(x, jax.ShapeDtypeStruct | int) for x in jax.tree_util.tree_leaves(abstract)
    )
    _assert_same(tm.load(path, abstract), model)


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
    _assert_same(tm.load(buf, like), values)


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
    _assert_same(out["opt"], state)
    assert type(out["opt"][0]) is type(state[0])  # the optax namedtuple comes back


# Key paths are jax.tree_util.keystr.
def test_tensor_names_are_key_paths() -> None:
    import json
    import struct

    buf = io.BytesIO()
    tm.save(buf, _net())
    raw = buf.getvalue()
    (n,) = struct.unpack("<Q", raw[:8])
    names = set(json.loads(raw[8 : 8 + n])) - {"__metadata__"}
    assert names == {".backbone.weight", ".backbone.bias", ".head.weight", ".stats.value"}


# --- errors: mismatches with like ---------------------------------------------------------


def _saved(tree) -> io.BytesIO:
    buf = io.BytesIO()
    tm.save(buf, tree)
    buf.seek(0)
    return buf


def test_all_mismatches_in_one_error() -> None:
    buf = _saved({"a": jnp.ones(3), "b": jnp.ones(2), "n": 3, "extra": jnp.ones(1), "s": "x"})
    like = {
        "a": jnp.ones(4),  # wrong shape
        "b": jnp.ones(2, jnp.int32),  # wrong dtype
        "n": 3.0,  # wrong simple type
        "s": jnp.ones(1),  # a value in the file, an array in like
        "missing": jnp.ones(5),
    }
    with pytest.raises(tm.CheckpointError) as e:
        tm.load(buf, like)
    msg = str(e.value)
    assert "6 mismatches" in msg and "<BytesIO>" in msg
    assert "wrong shape: ['a'] is f32[3] in the file but f32[4] in like" in msg
    assert "wrong dtype: ['b'] is f32[2] in the file but i32[2] in like" in msg
    assert "wrong type: ['n'] is an int value in the file but a float value in like" in msg
    assert "wrong type: ['s'] is a str value in the file but an array f32[1]" in msg
    assert "missing: ['missing'] (f32[5] in like)" in msg
    assert "unexpected: ['extra'] (f32[1] in the file, not in like)" in msg
    assert "Nothing was loaded" in msg


def test_shape_and_dtype_both_wrong_and_array_where_like_has_value() -> None:
    buf = _saved({"a": jnp.ones(3), "v": jnp.ones(1), "fn": jnp.ones(1)})
    with pytest.raises(tm.CheckpointError) as e:
        tm.load(buf, {"a": jnp.ones(2, jnp.int32), "v": 1, "fn": jax.nn.relu})
    msg = str(e.value)
    assert "wrong shape and dtype: ['a'] is f32[3] in the file but i32[2]" in msg
    assert "wrong type: ['v'] is an array f32[1] in the file but an int value" in msg
    assert "wrong type: ['fn'] is data in the file but a" in msg


def test_missing_simple_value_and_unexpected_simple_value() -> None:
    buf = _saved({"a": 1})
    with pytest.raises(tm.CheckpointError, match=r"missing: \['b'\] \(an int value in like\)"):
        tm.load(buf, {"b": 2})
    buf.seek(0)
    with pytest.raises(tm.CheckpointError, match=r"unexpected: \['a'\] \(an int value"):
        tm.load(buf, {})


def test_a_long_list_of_mismatches_is_cut() -> None:
    buf = _saved([jnp.ones(1)] * 60)
    with pytest.raises(tm.CheckpointError) as e:
        tm.load(buf, [jnp.ones(2)] * 60)
    assert "60 mismatches" in str(e.value) and "... and 20 more" in str(e.value)


def test_a_mismatch_returns_nothing_and_changes_nothing() -> None:
    like = {"a": jnp.zeros(3), "b": jnp.zeros(2)}
    buf = _saved({"a": jnp.ones(3), "b": jnp.ones(3)})
    with pytest.raises(tm.CheckpointError):
        tm.load(buf, like)
    assert float(like["a"].sum()) == 0.0


def test_bad_prefix_and_where_errors() -> None:
    buf = _saved(_net())
    with pytest.raises(ValueError, match="prefix='backbone' is not a key path"):
        tm.load(buf, _net().backbone, prefix="backbone")
    with pytest.raises(ValueError, match="is not a node of like.*prefix="):
        tm.load(buf, _net(), where=lambda m: jnp.ones(2))
    buf.seek(0)
    with pytest.raises(tm.CheckpointError, match="nothing under prefix '.encoder'.*.backbone"):
        tm.load(buf, _net().backbone, prefix=".encoder")


def test_save_errors_name_the_leaf(tmp_path: pathlib.Path) -> None:
    with pytest.raises(TypeError, match=r"\['x'\] is a ShapeDtypeStruct"):
        tm.save(io.BytesIO(), {"x": jax.ShapeDtypeStruct((2,), jnp.float32)})
    with pytest.raises(TypeError, match=r"\['x'\] has dtype <U1"):
        tm.save(io.BytesIO(), {"x": np.array(["a"])})

    class Key(str):  # a dictionary key that prints like another
        def __repr__(self) -> str:
            return "'a'"

    with pytest.raises(ValueError, match=r"same key path \"\['a'\]\""):
        tm.save(io.BytesIO(), {"a": jnp.ones(1), Key("b"): jnp.ones(1)})
    with pytest.raises(TypeError, match="expected a path or a binary file"):
        tm.save(123, {})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected a path or a binary file"):
        tm.load(123, {})  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="no checkpoint file .*nope"):
        tm.load(tmp_path / "nope", {})


def test_tracers_are_refused() -> None:
    @jax.jit
    def inside(x):
        tm.save(io.BytesIO(), {"w": x})
        return x

    with pytest.raises(TypeError, match=r"save: the leaf at \['w'\] is a tracer"):
        inside(jnp.ones(2))


# --- partial loading ---------------------------------------------------------------------


def test_load_a_pretrained_backbone_into_a_new_model(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "pretrained.safetensors"
    pretrained = _net(scale=3.0)
    tm.save(path, pretrained)
    new = _net(scale=0.0, head_out=5)  # a different head: a full load would fail
    with pytest.raises(tm.CheckpointError, match="wrong shape: .head.weight"):
        tm.load(path, new)
    out = tm.load(path, new, where=lambda m: m.backbone)
    _assert_same(out.backbone, pretrained.backbone)
    _assert_same(out.head, new.head)
    assert out.step == 7 and float(out.stats.value[0]) == 0.0  # untouched parts of `like`
    # The same, as a load of the subtree alone by its prefix.
    _assert_same(tm.load(path, new.backbone, prefix=".backbone"), pretrained.backbone)


def test_partial_load_checks_the_selected_part() -> None:
    buf = _saved(_net())
    bad = tm.tree_at(lambda m: m.backbone.weight, _net(), jnp.ones((4, 3)))
    with pytest.raises(tm.CheckpointError) as e:
        tm.load(buf, bad, where=lambda m: m.backbone)
    assert "1 mismatch\n" in str(e.value) and ".backbone.weight" in str(e.value)


def test_partial_load_from_a_file_of_the_backbone_alone_or_another_name() -> None:
    pretrained = _net(scale=2.0)
    alone = _saved(pretrained.backbone)
    out = tm.load(alone, _net(0.0), where=lambda m: m.backbone, prefix="")
    _assert_same(out.backbone, pretrained.backbone)
    renamed = _saved({"encoder": pretrained.backbone, "other": jnp.ones(1)})
    out = tm.load(renamed, _net(0.0), where=lambda m: m.backbone, prefix="['encoder']")
    _assert_same(out.backbone, pretrained.backbone)


def test_prefix_matches_whole_key_path_components() -> None:
    buf = _saved({"a": {"w": jnp.ones(1)}, "ab": {"w": jnp.ones(2)}})
    out = tm.load(buf, {"w": jnp.zeros(1)}, prefix="['a']")
    assert out["w"].shape == (1,)


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
    _assert_same(tm.load(buf, like), tree)
    buf.seek(0)
    abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else x, tree
    )
    _assert_same(tm.load(buf, abstract), tree)


def test_saving_to_a_path_leaves_no_temporary_files(tmp_path: pathlib.Path) -> None:
    tm.save(tmp_path / "a.safetensors", {"w": jnp.ones(2)})
    tm.save(str(tmp_path / "a.safetensors"), {"w": jnp.ones(3)})
    assert os.listdir(tmp_path) == ["a.safetensors"]
    assert tm.load(tmp_path / "a.safetensors", {"w": jnp.ones(3)})["w"].shape == (3,)


def test_big_endian_numpy_arrays_are_stored_little_endian() -> None:
    x = np.arange(4, dtype=">f4")
    buf = _saved({"x": x})
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
    buf = _saved(bn)
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
    buf = _saved(tree)
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
    buf = _saved({"key": jax.random.key(0), "raw": jax.random.PRNGKey(0)})
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
