"""Shape checks on the `treemod.nn` layers: a wrong shape is an error naming the layer, at trace
time, instead of an XLA error."""

import jax
import jax.numpy as jnp
import pytest

import treemod as tm

nn = pytest.importorskip("treemod.nn")
from treemod._shapecheck.config import _GLOBAL  # noqa: E402

KEY = jax.random.key(0)


@pytest.fixture(autouse=True)
def _checks_on():
    saved = list(_GLOBAL)
    tm.set_shape_checks(True, checker="typeguard")
    yield
    _GLOBAL[:] = saved


def _need(name: str):
    if not hasattr(nn, name):
        pytest.skip(f"treemod.nn.{name} does not exist yet")
    return getattr(nn, name)


# `nn.Linear.__call__` annotates `x: Float[Array, "*batch in"] | Float[Array, "*batch"]` (the
# second member is for `in_features="scalar"`), which any float array matches; the layer's own
# shape check then reports the error. Either way it is raised while tracing and names Linear.
_LINEAR_ERRORS = (tm.ShapeCheckError, ValueError)


def _trace(fn):
    """Run `fn` under `jax.eval_shape`: layers are built and called on tracers, nothing compiles."""
    return jax.eval_shape(fn)


def test_linear_wrong_input_size_is_an_error_naming_linear_at_trace_time():
    Linear = _need("Linear")
    assert _trace(lambda: Linear(3, 4, key=KEY)(jnp.ones((5, 3)))).shape == (5, 4)
    with pytest.raises(_LINEAR_ERRORS, match=r"^Linear\b.*\bx\b.*3"):
        _trace(lambda: Linear(3, 4, key=KEY)(jnp.ones((5, 7))))
    with pytest.raises(_LINEAR_ERRORS, match=r"^Linear\b.*\bx\b.*3"):
        _trace(lambda: Linear(3, 4, key=KEY)(jnp.ones(2)))


def test_linear_fields_checked_by_tree_at():
    Linear = _need("Linear")

    def swap(where, value):
        return lambda: tm.tree_at(where, Linear(3, 4, key=KEY), value)

    with pytest.raises(tm.ShapeCheckError, match=r"^Linear\.bias: .*out=4 \(bound by Linear"):
        _trace(swap(lambda m: m.bias, jnp.zeros(5)))
    with pytest.raises(tm.ShapeCheckError, match=r"^Linear\.weight: .*got i32\[4,3\]"):
        _trace(swap(lambda m: m.weight, jnp.zeros((4, 3), jnp.int32)))
    _trace(swap(lambda m: m.weight, jnp.zeros((4, 3), jnp.bfloat16)))  # a float: fine


def test_linear_wrong_dtype_input():
    Linear = _need("Linear")
    with pytest.raises(tm.ShapeCheckError, match=r"^Linear\.__call__ argument x: .*got i32\[3\]"):
        _trace(lambda: Linear(3, 4, key=KEY)(jnp.ones(3, jnp.int32)))


def test_mlp_names_the_inner_layer():
    MLP = _need("MLP")
    with pytest.raises(_LINEAR_ERRORS, match=r"^Linear\b.*\bx\b.*3"):
        _trace(lambda: MLP(3, 2, width_size=8, depth=2, key=KEY)(jnp.ones(5)))


def test_conv2d_wrong_channels():
    Conv2d = _need("Conv2d")
    out = _trace(lambda: Conv2d(3, 8, kernel_size=3, key=KEY)(jnp.ones((3, 9, 9))))
    assert out.shape == (8, 7, 7)
    with pytest.raises((tm.ShapeCheckError, ValueError), match=r"^Conv2d"):
        _trace(lambda: Conv2d(3, 8, kernel_size=3, key=KEY)(jnp.ones((4, 9, 9))))


def test_layers_under_vmap_and_checks_off():
    Linear = _need("Linear")
    assert _trace(lambda: jax.vmap(Linear(3, 4, key=KEY))(jnp.ones((6, 3)))).shape == (6, 4)
    with tm.shape_checks(False):
        assert _trace(lambda: Linear(3, 4, key=KEY)(jnp.ones(3))).shape == (4,)
