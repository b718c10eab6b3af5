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


class Checkpoint(tm.Module):
    model: Net
    opt_state: dict[str, object]


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        (lambda net, opt: [net, opt, 3], "[0]"),
        (lambda net, opt: (opt, net), "[1]"),
        (lambda net, opt: Checkpoint(net, opt), ".model"),
    ],
    ids=["list", "tuple", "module-attribute"],
)
def test_prefix_hint_for_other_containers(tmp_path, container, expected) -> None:
    net = Net(key=jax.random.key(0))
    opt_state = {"mu": tm.filter(net, tm.is_param), "count": jnp.zeros((), jnp.int32)}
    path = tmp_path / "train.safetensors"
    tm.save(path, container(net, opt_state))
    skeleton = tm.filter_eval_shape(Net, key=jax.random.key(1))
    with pytest.raises(tm.CheckpointError) as info:
        tm.load(path, skeleton)
    assert f"pass prefix={expected!r}" in str(info.value)
    assert tm.tree_equal(tm.load(path, skeleton, prefix=expected), net)


class WithDropout(tm.Module):
    linear: nn.Linear
    norm: nn.BatchNorm
    dropout: nn.Dropout

    def __init__(self, *, key: jax.Array) -> None:
        self.linear = nn.Linear(3, 4, key=key)
        self.norm = nn.BatchNorm(4)
        self.dropout = nn.Dropout(0.25)


def test_a_jax_eval_shape_skeleton_gets_a_hint_naming_its_python_values(tmp_path) -> None:
    # jax.eval_shape turns the Dropout's p and inference flag into ShapeDtypeStructs: the
    # model's inference flag no longer matches, and Adam's state built from the skeleton has
    # moments for p. The message names the first such leaf and the way out.
    optax = pytest.importorskip("optax")
    optimiser = optax.adam(1e-3)
    net = WithDropout(key=jax.random.key(0))
    path = tmp_path / "train.safetensors"
    opt_state = optimiser.init(tm.filter(net, tm.is_param))
    tm.save(path, {"model": net, "opt_state": opt_state, "step": 1})

    def like(skeleton: WithDropout) -> dict[str, object]:
        opt_like = jax.eval_shape(optimiser.init, tm.filter(skeleton, tm.is_param))
        return {"model": skeleton, "opt_state": opt_like, "step": 0}

    with pytest.raises(tm.CheckpointError) as info:
        tm.load(path, like(jax.eval_shape(lambda: WithDropout(key=jax.random.key(1)))))
    message = str(info.value)
    assert "missing: ['opt_state'][0].mu.dropout.p" in message
    assert "ShapeDtypeStruct where the file holds a Python value (['model'].dropout." in message
    assert "tm.filter_eval_shape" in message
    # Following the hint loads the whole checkpoint.
    loaded = tm.load(path, like(tm.filter_eval_shape(WithDropout, key=jax.random.key(1))))
    assert tm.tree_equal(loaded["model"], net) and loaded["step"] == 1
    assert tm.tree_equal(loaded["opt_state"], opt_state)


def test_no_eval_shape_hint_for_a_filter_eval_shape_skeleton(tmp_path) -> None:
    path = tmp_path / "model.safetensors"
    tm.save(path, {"model": WithDropout(key=jax.random.key(0))})
    with pytest.raises(tm.CheckpointError) as info:
        tm.load(path, {"model": tm.filter_eval_shape(Net, key=jax.random.key(1))})
    assert "unexpected: ['model'].dropout" in str(info.value)
    assert "ShapeDtypeStruct where the file holds" not in str(info.value)
