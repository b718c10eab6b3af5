"""save/load against `like`: every mismatch named in one error, save errors, and partial loads."""

from __future__ import annotations

import io
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from serialisation_models import assert_same, net, saved

import treemod as tm
import treemod.nn  # noqa: F401 (tm.nn)

# --- errors: mismatches with like ---------------------------------------------------------


def test_all_mismatches_in_one_error() -> None:
    buf = saved({"a": jnp.ones(3), "b": jnp.ones(2), "n": 3, "extra": jnp.ones(1), "s": "x"})
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
    buf = saved({"a": jnp.ones(3), "v": jnp.ones(1), "fn": jnp.ones(1)})
    with pytest.raises(tm.CheckpointError) as e:
        tm.load(buf, {"a": jnp.ones(2, jnp.int32), "v": 1, "fn": jax.nn.relu})
    msg = str(e.value)
    assert "wrong shape and dtype: ['a'] is f32[3] in the file but i32[2]" in msg
    assert "wrong type: ['v'] is an array f32[1] in the file but an int value" in msg
    assert "wrong type: ['fn'] is data in the file but a" in msg


def test_missing_simple_value_and_unexpected_simple_value() -> None:
    buf = saved({"a": 1})
    with pytest.raises(tm.CheckpointError, match=r"missing: \['b'\] \(an int value in like\)"):
        tm.load(buf, {"b": 2})
    buf.seek(0)
    with pytest.raises(tm.CheckpointError, match=r"unexpected: \['a'\] \(an int value"):
        tm.load(buf, {})


def test_a_long_list_of_mismatches_is_cut() -> None:
    buf = saved([jnp.ones(1)] * 60)
    with pytest.raises(tm.CheckpointError) as e:
        tm.load(buf, [jnp.ones(2)] * 60)
    assert "60 mismatches" in str(e.value) and "... and 20 more" in str(e.value)


def test_a_mismatch_returns_nothing_and_changes_nothing() -> None:
    like = {"a": jnp.zeros(3), "b": jnp.zeros(2)}
    buf = saved({"a": jnp.ones(3), "b": jnp.ones(3)})
    with pytest.raises(tm.CheckpointError):
        tm.load(buf, like)
    assert float(like["a"].sum()) == 0.0


def test_bad_prefix_and_where_errors() -> None:
    buf = saved(net())
    with pytest.raises(ValueError, match="prefix='backbone' is not a key path"):
        tm.load(buf, net().backbone, prefix="backbone")
    with pytest.raises(ValueError, match="is not a node of like.*prefix="):
        tm.load(buf, net(), where=lambda m: jnp.ones(2))
    buf.seek(0)
    with pytest.raises(tm.CheckpointError, match="nothing under prefix '.encoder'.*.backbone"):
        tm.load(buf, net().backbone, prefix=".encoder")


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
    pretrained = net(scale=3.0)
    tm.save(path, pretrained)
    new = net(scale=0.0, head_out=5)  # a different head: a full load would fail
    with pytest.raises(tm.CheckpointError, match="wrong shape: .head.weight"):
        tm.load(path, new)
    out = tm.load(path, new, where=lambda m: m.backbone)
    assert_same(out.backbone, pretrained.backbone)
    assert_same(out.head, new.head)
    assert out.step == 7 and float(out.stats.value[0]) == 0.0  # untouched parts of `like`
    # The same, as a load of the subtree alone by its prefix.
    assert_same(tm.load(path, new.backbone, prefix=".backbone"), pretrained.backbone)


def test_partial_load_checks_the_selected_part() -> None:
    buf = saved(net())
    bad = tm.tree_at(lambda m: m.backbone.weight, net(), jnp.ones((4, 3)))
    with pytest.raises(tm.CheckpointError) as e:
        tm.load(buf, bad, where=lambda m: m.backbone)
    assert "1 mismatch\n" in str(e.value) and ".backbone.weight" in str(e.value)


def test_partial_load_from_a_file_of_the_backbone_alone_or_another_name() -> None:
    pretrained = net(scale=2.0)
    alone = saved(pretrained.backbone)
    out = tm.load(alone, net(0.0), where=lambda m: m.backbone, prefix="")
    assert_same(out.backbone, pretrained.backbone)
    renamed = saved({"encoder": pretrained.backbone, "other": jnp.ones(1)})
    out = tm.load(renamed, net(0.0), where=lambda m: m.backbone, prefix="['encoder']")
    assert_same(out.backbone, pretrained.backbone)


def test_prefix_matches_whole_key_path_components() -> None:
    buf = saved({"a": {"w": jnp.ones(1)}, "ab": {"w": jnp.ones(2)}})
    out = tm.load(buf, {"w": jnp.zeros(1)}, prefix="['a']")
    assert out["w"].shape == (1,)
