"""`load`'s error suggests `prefix=` when the file holds all of `like` under another key path."""

import jax
import jax.numpy as jnp
import pytest

import treemod as tm
import treemod.nn as nn


class Net(tm.Module):
    linear: nn.Linear
    norm: nn.BatchNorm

    def __init__(self, *, key: jax.Array) -> None:
        self.linear = nn.Linear(3, 4, key=key)
        self.norm = nn.BatchNorm(4)


def test_loading_the_model_alone_from_a_training_checkpoint_suggests_prefix(tmp_path) -> None:
    net = Net(key=jax.random.key(0))
    opt_state = {"mu": tm.filter(net, tm.is_param), "count": jnp.zeros((), jnp.int32)}
    path = tmp_path / "train.safetensors"
    tm.save(path, {"model": net, "opt_state": opt_state, "step": 7})
    skeleton = tm.filter_eval_shape(Net, key=jax.random.key(1))
    with pytest.raises(tm.CheckpointError) as info:
        tm.load(path, skeleton)
    message = str(info.value)
    assert "train.safetensors" in message and "missing: .linear.weight" in message
    assert "pass prefix=\"['model']\"" in message
    # ... and following the hint works.
    loaded = tm.load(path, skeleton, prefix="['model']")
    assert tm.tree_equal(loaded, net)


def test_prefix_hint_finds_a_nested_place_and_stays_silent_when_there_is_none(tmp_path) -> None:
    net = Net(key=jax.random.key(0))
    path = tmp_path / "nested.safetensors"
    tm.save(path, {"run": {"ema": net}, "other": jnp.ones(2)})
    with pytest.raises(tm.CheckpointError, match=r"prefix=\"\['run'\]\['ema'\]\""):
        tm.load(path, net)
    assert tm.tree_equal(tm.load(path, net, prefix="['run']['ema']"), net)
    # A file without the model anywhere: the error lists the mismatches and suggests nothing.
    tm.save(path, {"model": {"linear": jnp.ones(2)}})
    with pytest.raises(tm.CheckpointError) as info:
        tm.load(path, net)
    assert "missing: .linear.weight" in str(info.value)
    assert "The file holds every entry of like" not in str(info.value)
