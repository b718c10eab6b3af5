"""Shape checks on the `treemod.nn` layers: a wrong shape is an error naming the layer, at trace
time, instead of an XLA error."""

import jax
import jax.numpy as jnp
import pytest

import treemod as tm
from treemod import nn

KEY = jax.random.key(0)


pytestmark = pytest.mark.usefixtures("shape_checks_on")  # tests/conftest.py


# `nn.Linear.__call__` annotates `x: Float[Array, "*batch in"] | Float[Array, "*batch"]` (the
# second member is for `in_features="scalar"`), which any float array matches; the layer's own
# shape check then reports the error. Either way it is raised while tracing and names Linear.
_LINEAR_ERRORS = (tm.ShapeCheckError, ValueError)


def _trace(fn):
    """Run `fn` under `jax.eval_shape`: layers are built and called on tracers, nothing compiles."""
    return jax.eval_shape(fn)


def test_linear_wrong_input_size_is_an_error_naming_linear_at_trace_time():
    Linear = nn.Linear
    assert _trace(lambda: Linear(3, 4, key=KEY)(jnp.ones((5, 3)))).shape == (5, 4)
    with pytest.raises(_LINEAR_ERRORS, match=r"^Linear\b.*\bx\b.*3"):
        _trace(lambda: Linear(3, 4, key=KEY)(jnp.ones((5, 7))))
    with pytest.raises(_LINEAR_ERRORS, match=r"^Linear\b.*\bx\b.*3"):
        _trace(lambda: Linear(3, 4, key=KEY)(jnp.ones(2)))


def test_linear_fields_checked_by_tree_at():
    Linear = nn.Linear

    def swap(where, value):
        return lambda: tm.tree_at(where, Linear(3, 4, key=KEY), value)

    with pytest.raises(tm.ShapeCheckError, match=r"^Linear\.bias: .*out=4 \(bound by Linear"):
        _trace(swap(lambda m: m.bias, jnp.zeros(5)))
    with pytest.raises(tm.ShapeCheckError, match=r"^Linear\.weight: .*got i32\[4,3\]"):
        _trace(swap(lambda m: m.weight, jnp.zeros((4, 3), jnp.int32)))
    _trace(swap(lambda m: m.weight, jnp.zeros((4, 3), jnp.bfloat16)))  # a float: fine


def test_linear_wrong_dtype_input():
    Linear = nn.Linear
    # Integers are promoted as JAX promotes them (Equinox accepts them); booleans are refused.
    assert _trace(lambda: Linear(3, 4, key=KEY)(jnp.ones(3, jnp.int32))).dtype == jnp.float32
    with pytest.raises(tm.ShapeCheckError, match=r"^Linear\.__call__ argument x: .*got bool\[3\]"):
        _trace(lambda: Linear(3, 4, key=KEY)(jnp.ones(3, jnp.bool_)))


def test_mlp_names_the_inner_layer():
    MLP = nn.MLP
    with pytest.raises(_LINEAR_ERRORS, match=r"^Linear\b.*\bx\b.*3"):
        _trace(lambda: MLP(3, 2, width_size=8, depth=2, key=KEY)(jnp.ones(5)))


def test_conv2d_wrong_channels():
    Conv2d = nn.Conv2d
    out = _trace(lambda: Conv2d(3, 8, kernel_size=3, key=KEY)(jnp.ones((3, 9, 9))))
    assert out.shape == (8, 7, 7)
    with pytest.raises((tm.ShapeCheckError, ValueError), match=r"^Conv2d"):
        _trace(lambda: Conv2d(3, 8, kernel_size=3, key=KEY)(jnp.ones((4, 9, 9))))


def test_layers_under_vmap_and_checks_off():
    Linear = nn.Linear
    assert _trace(lambda: jax.vmap(Linear(3, 4, key=KEY))(jnp.ones((6, 3)))).shape == (6, 4)
    with tm.shape_checks(False):
        assert _trace(lambda: Linear(3, 4, key=KEY)(jnp.ones(3))).shape == (4,)
