"""Equinox's checkpoint format: treemod writes the bytes real Equinox writes, reads Equinox's files
into treemod's layers (converting the layouts that differ), and Equinox reads treemod's files.

Every reference here is real Equinox (`eqx.tree_serialise_leaves`, Equinox's layers and their
outputs); the module is skipped where Equinox is not installed.
"""

from __future__ import annotations

import io
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from equinox_format_helpers import (
    KEY,
    built,
    close_leaves,
    eqx_bytes,
    noisy,
    prng,
    tm_bytes,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm
import treemod.compat.equinox as ceqx

eqx = pytest.importorskip("equinox")


# Byte-identical files for plain trees.

_DTYPES = [
    jnp.bool_,
    jnp.int8,
    jnp.int16,
    jnp.int32,
    jnp.uint8,
    jnp.uint32,
    jnp.float16,
    jnp.bfloat16,
    jnp.float32,
    jnp.complex64,
]


def _array(dtype: Any, shape: tuple[int, ...], seed: int) -> jax.Array:
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=shape) * 5).astype(dtype)


_leaf = st.one_of(
    st.builds(
        _array,
        st.sampled_from(_DTYPES),
        st.lists(st.integers(0, 3), max_size=3).map(tuple),
        st.integers(0, 9),
    ),
    st.builds(lambda s: np.arange(s, dtype=np.float64), st.integers(0, 4)),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False),
    st.complex_numbers(allow_nan=False, allow_infinity=False),
    st.none(),
    st.just("a string"),
    st.just(jnp.tanh),
    st.builds(np.float32, st.floats(-10, 10, width=32)),
)
_trees = st.recursive(
    _leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from("abcd"), children, max_size=3),
    ),
    max_leaves=8,
)


@settings(deadline=None)
@given(_trees)
def test_plain_trees_give_equinox_bytes_and_round_trip(tree: Any) -> None:
    data = tm_bytes(tree)
    assert data == eqx_bytes(tree)
    back = ceqx.tree_deserialise_leaves(io.BytesIO(data), tree)
    assert eqx.tree_equal(back, eqx.tree_deserialise_leaves(io.BytesIO(data), tree))


class _Net(tm.Module):
    """A user's module with a static field and nested modules."""

    layers: list
    scale: float
    name: str = tm.field(static=True)


def test_nested_modules_and_static_fields() -> None:
    net = _Net([tm.nn.Linear(2, 3, key=jax.random.key(1)), jnp.arange(3)], 0.5, "n")
    assert tm_bytes(net) == eqx_bytes(net)
    like = _Net([tm.nn.Linear(2, 3, key=jax.random.key(2)), jnp.zeros(3, jnp.int32)], 0.0, "n")
    back = ceqx.tree_deserialise_leaves(io.BytesIO(eqx_bytes(net)), like)
    assert tm.tree_equal(back, net)


def test_suffix_added_as_equinox_does(tmp_path: pathlib.Path) -> None:
    tree = {"w": jnp.arange(4.0)}
    ceqx.tree_serialise_leaves(tmp_path / "model", tree)
    ceqx.tree_serialise_leaves(str(tmp_path / "other.bin"), tree)
    eqx.tree_serialise_leaves(tmp_path / "ref", tree)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.eqx", "other.bin", "ref.eqx"]
    assert (tmp_path / "model.eqx").read_bytes() == (tmp_path / "ref.eqx").read_bytes()
    # Both libraries read the suffixless name back from the `.eqx` file.
    assert tm.tree_equal(ceqx.tree_deserialise_leaves(tmp_path / "model", tree), tree)
    assert tm.tree_equal(eqx.tree_deserialise_leaves(tmp_path / "model", tree), tree)


def test_file_objects_hold_several_trees_in_sequence() -> None:
    buf = io.BytesIO()
    ceqx.tree_serialise_leaves(buf, [jnp.ones(2)])
    ceqx.tree_serialise_leaves(buf, (3, 4.5))
    buf.seek(0)
    assert tm.tree_equal(ceqx.tree_deserialise_leaves(buf, [jnp.zeros(2)]), [jnp.ones(2)])
    assert ceqx.tree_deserialise_leaves(buf, (0, 0.0)) == (3, 4.5)


def test_custom_filter_spec_and_is_leaf_as_equinox() -> None:
    tree = (jnp.array([1, 2, 3]), [4, 5, 6], {"k": jnp.ones(2)})

    def skip_arrays(f: Any, x: Any) -> None:
        if not isinstance(x, jax.Array):
            ceqx.default_serialise_filter_spec(f, x)

    assert tm_bytes(tree, filter_spec=skip_arrays) == eqx_bytes(tree, filter_spec=skip_arrays)
    # A tree of specs, a prefix of the tree.
    specs = (ceqx.default_serialise_filter_spec, skip_arrays, ceqx.default_serialise_filter_spec)
    assert tm_bytes(tree, filter_spec=specs) == eqx_bytes(tree, filter_spec=specs)

    # is_leaf: the whole list goes to the spec as one leaf.
    def whole_list(f: Any, x: Any) -> None:
        np.save(f, np.asarray(x) if isinstance(x, list) else x)

    is_list = lambda x: isinstance(x, list)  # noqa: E731
    assert tm_bytes(tree, filter_spec=whole_list, is_leaf=is_list) == eqx_bytes(
        tree, filter_spec=whole_list, is_leaf=is_list
    )
    # Loading with a spec that keeps `like`'s arrays reads only the rest.
    data = eqx_bytes(tree, filter_spec=skip_arrays)
    like = (jnp.zeros(3, jnp.int32), [0, 0, 0], {"k": jnp.zeros(2)})

    def keep_arrays(f: Any, x: Any) -> Any:
        return x if isinstance(x, jax.Array) else ceqx.default_deserialise_filter_spec(f, x)

    ours = ceqx.tree_deserialise_leaves(io.BytesIO(data), like, filter_spec=keep_arrays)
    theirs = eqx.tree_deserialise_leaves(io.BytesIO(data), like, filter_spec=keep_arrays)
    assert eqx.tree_equal(ours, theirs) and ours[1] == [4, 5, 6]


def test_abstract_like_from_filter_eval_shape() -> None:
    conv = tm.nn.Conv2d(2, 3, 3, key=jax.random.key(0))
    abstract = tm.filter_eval_shape(lambda: tm.nn.Conv2d(2, 3, 3, key=jax.random.key(1)))
    back = ceqx.tree_deserialise_leaves(io.BytesIO(tm_bytes(conv)), abstract)
    assert tm.tree_equal(back, conv)


# Errors name the key path and say what to do.


def test_shape_mismatch_names_the_key_path() -> None:
    data = eqx_bytes(built(lambda: eqx.nn.MLP(2, 3, 4, 1, key=KEY)))
    with pytest.raises(
        tm.CheckpointError,
        match=r"has changed shape from \(5, 2\) in `like` to \(4, 2\) on disk: .* leaf 1 of 4 at "
        r"\.layers\[0\]\.weight",
    ):
        ceqx.tree_deserialise_leaves(
            io.BytesIO(data), built(lambda: tm.nn.MLP(2, 3, 5, 1, key=prng(0)))
        )


def test_converted_layer_mismatch_names_equinox_layout() -> None:
    data = eqx_bytes(built(lambda: eqx.nn.Conv2d(2, 3, 3, key=KEY)))
    with pytest.raises(tm.CheckpointError, match=r"at \.weight \(in Equinox's layout of Conv2d\)"):
        ceqx.tree_deserialise_leaves(
            io.BytesIO(data), built(lambda: tm.nn.Conv2d(2, 4, 3, key=prng(0)))
        )


def test_dtype_mismatch_is_a_runtime_error_too() -> None:
    data = eqx_bytes([jnp.ones(2, jnp.float16)])
    with pytest.raises(
        RuntimeError, match=r"changed dtype from float32 in `like` to float16 on disk: .* at \[0\]"
    ):
        ceqx.tree_deserialise_leaves(io.BytesIO(data), [jnp.zeros(2)])


def test_messages_carry_equinoxs_wording() -> None:
    # Equinox's messages name the key path as a tuple of keys; code matching them keeps working.
    data = eqx_bytes((jnp.array(1), {}))
    like = (jnp.array(2), {"a": jnp.array(2), "b": jnp.array(2)})
    with pytest.raises(
        RuntimeError, match=r"Error at leaf with path \(SequenceKey\(idx=1\), DictKey\(key='a'\)\)"
    ):
        ceqx.tree_deserialise_leaves(io.BytesIO(data), like)
    data = eqx_bytes((jnp.array(1), {"a": jnp.array(1)}))
    like = (jnp.array(2), {"a": jnp.array(2.0)})
    with pytest.raises(
        RuntimeError,
        match=r"Deserialised leaf at path \(SequenceKey\(idx=1\), DictKey\(key='a'\)\)",
    ):
        ceqx.tree_deserialise_leaves(io.BytesIO(data), like)


def test_type_mismatch() -> None:
    data = eqx_bytes({"a": np.ones(2)})
    with pytest.raises(tm.CheckpointError, match=r"\['a'\] could not be read: ValueError"):
        ceqx.tree_deserialise_leaves(io.BytesIO(data), {"a": 0})
    with pytest.raises(
        tm.CheckpointError, match=r"changed type from int in `like` to str on disk: .* at \['a'\]"
    ):
        ceqx.tree_deserialise_leaves(io.BytesIO(data), {"a": 0}, filter_spec=lambda f, x: "?")


def test_too_few_leaves(tmp_path: pathlib.Path) -> None:
    eqx.tree_serialise_leaves(tmp_path / "m", [jnp.ones(2)])
    with pytest.raises(tm.CheckpointError, match=r"ends before leaf 2 of 2 \(\[1\]\)"):
        ceqx.tree_deserialise_leaves(tmp_path / "m", [jnp.ones(2), jnp.ones(3)])


def test_too_many_leaves(tmp_path: pathlib.Path) -> None:
    eqx.tree_serialise_leaves(tmp_path / "m", [jnp.ones(2), 5])
    with pytest.raises(tm.CheckpointError, match=r"m\.eqx holds more data after the 1 leaves"):
        ceqx.tree_deserialise_leaves(tmp_path / "m", [jnp.ones(2)])


def test_stateful_model_saved_without_its_state_says_so() -> None:
    bn, _ = eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, "batch", mode="ema")
    with pytest.raises(tm.CheckpointError, match=r"without its state"):
        ceqx.tree_deserialise_leaves(io.BytesIO(eqx_bytes(bn)), tm.nn.BatchNorm(3))


def test_safetensors_file_points_to_load(tmp_path: pathlib.Path) -> None:
    tm.save(tmp_path / "c.safetensors", {"w": jnp.ones(2)})
    with pytest.raises(tm.CheckpointError, match=r"safetensors file .* tm\.load\(path, like\)"):
        ceqx.tree_deserialise_leaves(tmp_path / "c.safetensors", {"w": jnp.ones(2)})


def test_garbage_file_is_refused() -> None:
    with pytest.raises(tm.CheckpointError, match=r"not in Equinox's format"):
        ceqx.tree_deserialise_leaves(io.BytesIO(b"hello world, not npy"), [jnp.ones(2)])


def test_corrupt_record_names_the_leaf() -> None:
    data = bytearray(eqx_bytes([jnp.ones(2), jnp.ones(3)]))
    cut = bytes(data[: len(data) - 4])
    with pytest.raises(tm.CheckpointError, match=r"leaf 2 of 2 at \[1\] could not be read"):
        ceqx.tree_deserialise_leaves(io.BytesIO(cut), [jnp.ones(2), jnp.ones(3)])


def test_load_points_equinox_files_to_tree_deserialise_leaves(tmp_path: pathlib.Path) -> None:
    ceqx.tree_serialise_leaves(tmp_path / "m", {"w": jnp.ones(2)})
    hint = r"NumPy \.npy records.*treemod\.compat\.equinox\.tree_deserialise_leaves\(path, like\)"
    with pytest.raises(tm.CheckpointError, match=hint):
        tm.load(tmp_path / "m.eqx", like={"w": jnp.ones(2)})
    buf = io.BytesIO(b"prefix" + eqx_bytes({"w": jnp.ones(2)}))
    buf.seek(6)
    with pytest.raises(tm.CheckpointError, match=hint):
        tm.load(buf, like={"w": jnp.ones(2)})


def test_tracer_refused_when_saving() -> None:
    def f(x: jax.Array) -> jax.Array:
        ceqx.tree_serialise_leaves(io.BytesIO(), {"x": x})
        return x

    with pytest.raises(TypeError, match=r"\['x'\] is a tracer"):
        jax.jit(f)(jnp.ones(2))


def test_failed_write_names_the_leaf_and_keeps_the_old_file(tmp_path: pathlib.Path) -> None:
    ceqx.tree_serialise_leaves(tmp_path / "m", [jnp.ones(2)])
    before = (tmp_path / "m.eqx").read_bytes()

    def refuse_ints(f: Any, x: Any) -> None:
        if isinstance(x, int):
            raise ValueError("no ints here")
        ceqx.default_serialise_filter_spec(f, x)

    with pytest.raises(RuntimeError, match=r"leaf at \[1\]\['n'\]: ValueError: no ints here"):
        ceqx.tree_serialise_leaves(
            tmp_path / "m", [jnp.zeros(2), {"n": 3}], filter_spec=refuse_ints
        )
    assert (tmp_path / "m.eqx").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.eqx"]


def test_shared_weights_load_both_ways() -> None:
    # Equinox's Shared (tied embedding and output layer) and treemod's hold the same leaves.
    def tied(nn: Any, keys: tuple[Any, Any]) -> Any:
        emb, lin = nn.Embedding(5, 3, key=keys[0]), nn.Linear(3, 5, key=keys[1])
        return nn.Shared((emb, lin), lambda p: p[1].weight, lambda p: p[0].weight)

    theirs = noisy(tied(eqx.nn, tuple(jax.random.split(KEY))), 3)
    ours = ceqx.tree_deserialise_leaves(
        io.BytesIO(eqx_bytes(theirs)), tied(tm.nn, (prng(0), prng(1)))
    )
    x = jnp.array(4)
    (e_emb, e_lin), (t_emb, t_lin) = theirs(), ours()
    close_leaves(t_lin(t_emb(x)), e_lin(e_emb(x)))
    assert tm_bytes(ours) == eqx_bytes(theirs)
