"""inference_mode: one call switches BatchNorm, Dropout and user layers in a whole model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm
import treemod.nn as nn


class Block(tm.Module):
    """A user layer with its own non-static `inference` leaf (Equinox style) and sublayers."""

    norm: nn.BatchNorm
    drop: nn.Dropout
    inference: bool = False

    def __call__(self, x, *, key=None):
        return self.drop(self.norm(x), key=key)


def _model(key):
    k1, k2 = jax.random.split(key)
    return nn.Sequential(
        [
            nn.Linear(4, 6, key=k1),
            Block(nn.BatchNorm(6), nn.Dropout(0.5)),
            nn.Sequential([nn.Linear(6, 2, key=k2), nn.BatchNorm(2)]),
        ]
    )


def _flags(tree):
    """The `inference` flags of every module in `tree`, outer modules before inner ones."""
    found = []

    def visit(node):
        if isinstance(node, tm.Module) and hasattr(node, "inference"):
            found.append(node.inference)
        children, _ = jax.tree_util.tree_flatten(node, is_leaf=lambda x: x is not node)
        if children != [node]:
            for child in children:
                visit(child)

    visit(tree)
    return found


def test_switches_every_layer_and_back() -> None:
    model = _model(jax.random.key(0))
    assert _flags(model) == [False, False, False, False]
    evaluation = nn.inference_mode(model)
    assert _flags(evaluation) == [True, True, True, True]
    assert _flags(model) == [False, False, False, False]  # the input is untouched
    assert _flags(nn.inference_mode(evaluation, value=False)) == [False] * 4
    # Arrays are shared, not copied, and the structure is otherwise the same.
    assert evaluation[0].weight is model[0].weight
    assert evaluation[1].norm.running_mean.value is model[1].norm.running_mean.value


def test_inference_uses_running_stats_and_no_dropout() -> None:
    bn = nn.BatchNorm(3)
    x = jax.random.normal(jax.random.key(1), (10, 3)) * 3.0 + 1.0
    _, bn = tm.stateful(bn)(x)
    drop = nn.Dropout(0.9)
    model = nn.Sequential([bn, drop])
    evaluation = nn.inference_mode(model)
    expected = (x - bn.running_mean.value[None]) / jnp.sqrt(bn.running_var.value[None] + 1e-5)
    np.testing.assert_allclose(evaluation(x), expected, rtol=1e-5, atol=1e-6)
    # No key needed, nothing dropped, no stateful needed (nothing is updated).
    out, same = tm.stateful(evaluation)(x)
    assert same is evaluation
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_single_example_alone_equals_inside_a_batch() -> None:
    model = _model(jax.random.key(2))
    x = jax.random.normal(jax.random.key(3), (8, 4))
    _, model = tm.filter_jit(lambda m, x, k: tm.stateful(m)(x, key=k))(model, x, jax.random.key(4))
    evaluation = nn.inference_mode(model)
    batch, alone = tm.filter_jit(lambda m, x: (m(x), m(x[5:6])))(evaluation, x)
    np.testing.assert_allclose(alone, batch[5:6], rtol=1e-5, atol=1e-6)


def test_training_mode_depends_on_the_batch() -> None:
    """The contrast: in training mode an example's output depends on the rest of the batch."""
    bn = nn.BatchNorm(2)
    x = jax.random.normal(jax.random.key(5), (6, 2))
    full, _ = tm.stateful(bn)(x)
    part, _ = tm.stateful(bn)(x[:3])
    assert not np.allclose(full[:3], part)


def test_works_inside_jit_and_on_plain_containers() -> None:
    tree = {"a": [nn.BatchNorm(2), nn.Dropout(0.1)], "b": (jnp.ones(2), "text")}
    evaluation = tm.filter_jit(nn.inference_mode)(tree)
    assert _flags(evaluation) == [True, True]
    assert evaluation["b"][1] == "text"


def test_value_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="inference_mode: value must be True or False"):
        nn.inference_mode(nn.BatchNorm(2), value=1)  # type: ignore[arg-type]


@settings(max_examples=20, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=5), st.booleans())
def test_sets_every_flag_whatever_it_was(initial: list[bool], value: bool) -> None:
    layers = [
        nn.BatchNorm(2, inference=f) if i % 2 else nn.Dropout(0.1, inference=f)
        for i, f in enumerate(initial)
    ]
    switched = nn.inference_mode(layers, value)
    assert _flags(switched) == [value] * len(initial)
    assert _flags(nn.inference_mode(switched, value)) == [value] * len(initial)  # idempotent
