"""BatchNorm: numerics against PyTorch, layouts, transforms, and every error path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm
import treemod.nn as nn

torch = pytest.importorskip("torch", reason="PyTorch (the `torch` extra) is not installed")

# One jitted training call shared by the tests (eager BatchNorm compiles op by op per shape).
_step = tm.filter_jit(lambda m, x: tm.stateful(m)(x))


def _torch_bn(shape_ndim: int, channels: int, affine: bool = True):
    cls = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}
    cls[5] = torch.nn.BatchNorm3d
    return cls[shape_ndim](channels, eps=1e-5, momentum=0.1, affine=affine)


def _random_affine(bn: nn.BatchNorm, seed: int) -> nn.BatchNorm:
    k1, k2 = jax.random.split(jax.random.key(seed))
    c = bn.input_size
    return tm.tree_at(
        lambda m: (m.weight, m.bias),
        bn,
        (1 + 0.5 * jax.random.normal(k1, (c,)), jax.random.normal(k2, (c,))),
    )


@pytest.mark.parametrize(
    "shape", [(16, 4), (8, 3, 7), (6, 3, 5, 4), (4, 2, 3, 3, 2)], ids=["1d", "1d-L", "2d", "3d"]
)
@pytest.mark.parametrize("affine", [True, False])
def test_matches_pytorch_training_and_eval(shape, affine) -> None:
    c = shape[1]
    bn = nn.BatchNorm(c, channelwise_affine=affine)
    if affine:
        bn = _random_affine(bn, 0)
    ref = _torch_bn(len(shape), c, affine)
    if affine:
        with torch.no_grad():
            ref.weight.copy_(torch.tensor(np.asarray(bn.weight)))
            ref.bias.copy_(torch.tensor(np.asarray(bn.bias)))
    rng = np.random.default_rng(1)
    for _ in range(4):
        x = (3 * rng.normal(size=shape) + 2).astype(np.float32)
        y, bn = _step(bn, jnp.asarray(x))
        y_ref = ref(torch.tensor(x)).detach().numpy()
        np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(bn.running_mean.value, ref.running_mean.numpy(), rtol=1e-5)
    np.testing.assert_allclose(bn.running_var.value, ref.running_var.numpy(), rtol=1e-5)
    ref.eval()
    x = rng.normal(size=shape).astype(np.float32)
    y_eval = nn.inference_mode(bn)(jnp.asarray(x))
    np.testing.assert_allclose(y_eval, ref(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=2e-5)


def test_gradients_match_pytorch_in_training_mode() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(6, 3, 4, 4)).astype(np.float32)
    g = rng.normal(size=(6, 3, 4, 4)).astype(np.float32)
    bn = _random_affine(nn.BatchNorm(3), 3)
    ref = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(np.asarray(bn.weight)))
        ref.bias.copy_(torch.tensor(np.asarray(bn.bias)))
    xt = torch.tensor(x, requires_grad=True)
    (ref(xt) * torch.tensor(g)).sum().backward()

    @tm.filter_grad
    def grads(both, g):
        model, x = both
        y, _ = tm.stateful(model)(x)
        return jnp.sum(y * g)

    gm, gx = grads((bn, jnp.asarray(x)), jnp.asarray(g))
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gm.weight, ref.weight.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gm.bias, ref.bias.grad.numpy(), rtol=1e-4, atol=1e-5)
    assert gm.running_mean is None and gm.running_var is None


def test_vmap_with_axis_name_equals_batched() -> None:
    x = jax.random.normal(jax.random.key(0), (8, 3, 4, 4)) * 2.0 + 1.0
    batched = _random_affine(nn.BatchNorm(3), 1)
    mapped = _random_affine(nn.BatchNorm(3, axis_name="batch"), 1)
    y_b, new_b = _step(batched, x)
    # Plain jax.vmap and filter_vmap, both with out_axes=(0, None): the model comes back unbatched.
    y_v, new_v = jax.jit(
        lambda m, x: jax.vmap(tm.stateful(m), axis_name="batch", out_axes=(0, None))(x)
    )(mapped, x)
    y_f, new_f = tm.filter_jit(
        lambda m, x: tm.filter_vmap(tm.stateful(m), axis_name="batch", out_axes=(0, None))(x)
    )(mapped, x)
    for y, new in [(y_v, new_v), (y_f, new_f)]:
        np.testing.assert_allclose(y, y_b, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(new.running_mean.value, new_b.running_mean.value, rtol=1e-5)
        np.testing.assert_allclose(new.running_var.value, new_b.running_var.value, rtol=1e-5)
        assert new.running_mean.value.shape == (3,)
    # Inference: no axis needed; one example (C, H, W) at a time.
    inf, inf_b = nn.inference_mode(new_v), nn.inference_mode(new_b)
    y_each, y_batch = tm.filter_jit(lambda a, b, x: (jax.vmap(a)(x), b(x)))(inf, inf_b, x)
    np.testing.assert_allclose(y_each, y_batch, rtol=1e-5, atol=1e-5)


def test_tuple_axis_names_and_a_nested_vmap() -> None:
    x = jax.random.normal(jax.random.key(1), (4, 2, 3))  # two mapped axes of 4 and 2
    bn = nn.BatchNorm(3, axis_name=("outer", "inner"))
    run = jax.vmap(
        jax.vmap(tm.stateful(bn), axis_name="inner", out_axes=(0, None)),
        axis_name="outer",
        out_axes=(0, None),
    )
    y, new = jax.jit(run)(x)
    y_ref, new_ref = _step(nn.BatchNorm(3), x.reshape(8, 3))
    np.testing.assert_allclose(y.reshape(8, 3), y_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(new.running_var.value, new_ref.running_var.value, rtol=1e-5)


def test_sharded_batch_gives_global_statistics() -> None:
    devices = jax.devices()
    if len(devices) < 8:
        pytest.skip("needs the 8 fake CPU devices of tests/conftest.py")
    mesh = jax.sharding.Mesh(np.array(devices[:8]), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    x = jax.random.normal(jax.random.key(2), (16, 4))
    bn = nn.BatchNorm(4)
    y_s, new_s = _step(bn, jax.device_put(x, sharding))
    y, new = _step(bn, x)
    np.testing.assert_allclose(y_s, y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_s.running_var.value, new.running_var.value, rtol=1e-5)


def test_call_time_inference_override_and_bfloat16() -> None:
    x = jax.random.normal(jax.random.key(3), (5, 2))
    bn = nn.BatchNorm(2)
    np.testing.assert_allclose(bn(x, inference=True), x / np.sqrt(1 + 1e-5), rtol=1e-6)
    y, new = tm.stateful(bn)(x.astype(jnp.bfloat16))
    assert y.dtype == jnp.bfloat16 and new.running_mean.value.dtype == jnp.float32
    np.testing.assert_allclose(y.astype(jnp.float32), tm.stateful(bn)(x)[0], rtol=2e-2, atol=2e-2)
    half = nn.BatchNorm(2, dtype=jnp.bfloat16)
    assert half.weight.dtype == jnp.bfloat16 and half.running_var.value.dtype == jnp.bfloat16
    _, half = tm.stateful(half)(x)
    assert half.running_var.value.dtype == jnp.bfloat16


def test_accepts_a_key_and_works_in_sequential() -> None:
    k1, k2 = jax.random.split(jax.random.key(4))
    model = nn.Sequential([nn.Linear(3, 4, key=k1), nn.BatchNorm(4), jax.nn.relu])
    x = jax.random.normal(k2, (10, 3))
    y, new = tm.filter_jit(lambda m, x, k: tm.stateful(m)(x, key=k))(model, x, jax.random.key(5))
    h = model[0](x)
    np.testing.assert_allclose(new[1].running_mean.value, 0.1 * h.mean(0), rtol=1e-5, atol=1e-7)
    assert y.shape == (10, 4)


@pytest.mark.parametrize("example", [(4,), (4, 7), (4, 5, 3), (4, 2, 3, 2)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_inference_takes_one_unbatched_example(example, channels_last) -> None:
    # Reference: PyTorch in eval mode on the example with a batch axis of one, after a few
    # training steps so that the running statistics are not the initial ones.
    c = example[0]
    bn = _random_affine(nn.BatchNorm(c, channels_last=channels_last), 3)
    ref = _torch_bn(len(example) + 1 if len(example) > 1 else 2, c)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(np.asarray(bn.weight)))
        ref.bias.copy_(torch.tensor(np.asarray(bn.bias)))
    rng = np.random.default_rng(4)
    for _ in range(3):
        x = (2 * rng.normal(size=(6, *example)) + 1).astype(np.float32)
        _, bn = tm.stateful(bn)(jnp.asarray(np.moveaxis(x, 1, -1) if channels_last else x))
        ref(torch.tensor(x))
    ref.eval()
    one = rng.normal(size=example).astype(np.float32)
    expected = ref(torch.tensor(one[None])).detach().numpy()[0]
    ours = nn.inference_mode(bn)(jnp.asarray(np.moveaxis(one, 0, -1) if channels_last else one))
    if channels_last:
        ours = np.moveaxis(np.asarray(ours), -1, 0)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=2e-5)
    # ... and it is the batched call's row: one example or a batch, the same numbers.
    batch = jnp.asarray(np.stack([one, one]))
    if not channels_last:
        np.testing.assert_array_equal(
            bn(jnp.asarray(one), inference=True), bn(batch, inference=True)[0]
        )


def test_inference_reads_a_square_channels_first_input_as_a_batch() -> None:
    # (C, C): a batch of C examples (the layout training uses), not one example of length C.
    bn = _random_affine(nn.BatchNorm(3), 5)
    x = np.random.default_rng(6).normal(size=(3, 3)).astype(np.float32)
    ref = _torch_bn(2, 3)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(np.asarray(bn.weight)))
        ref.bias.copy_(torch.tensor(np.asarray(bn.bias)))
    ref.eval()
    expected = ref(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(bn(jnp.asarray(x), inference=True), expected, rtol=1e-5, atol=2e-5)


# ----- errors -----


def test_training_without_a_batch_axis_is_a_clear_error() -> None:
    bn = nn.BatchNorm(3)
    with pytest.raises(ValueError, match=r"BatchNorm\(input_size=3, axis_name=None\).*\(3,\)"):
        tm.stateful(bn)(jnp.ones(3))
    with pytest.raises(ValueError, match=r"looks like one example.*axis_name"):
        tm.stateful(bn)(jnp.ones((3, 5, 5)))
    with pytest.raises(ValueError, match=r"more than one value per channel.*\(1, 3\)"):
        tm.stateful(bn)(jnp.ones((1, 3)))
    # Under vmap without an axis name, BatchNorm sees single examples: the error says what to do.
    with pytest.raises(ValueError, match=r"BatchNorm.*axis_name"):
        jax.vmap(tm.stateful(bn), out_axes=(0, None))(jnp.ones((4, 3, 5)))


def test_axis_name_without_a_mapped_axis_is_a_clear_error() -> None:
    bn = nn.BatchNorm(3, axis_name="batch")
    with pytest.raises(NameError, match=r"BatchNorm\(axis_name='batch'\).*vmap.*axis_name=None"):
        tm.stateful(bn)(jnp.ones((3, 4)))
    with pytest.raises(ValueError, match=r"takes one example \(C=3, \*spatial\).*\(8, 3\)"):
        tm.stateful(bn)(jnp.ones((8, 3)))
    with pytest.raises(ValueError, match=r"mapped axis 'batch'.*give 1"):
        jax.vmap(tm.stateful(bn), axis_name="batch", out_axes=(0, None))(jnp.ones((1, 3)))


def test_training_outside_stateful_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"BatchNorm is in training mode.*stateful.*inference"):
        nn.BatchNorm(2)(jnp.ones((4, 2)))


def test_channel_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"\(N, C=4, \*spatial\).*one example \(C=4.*\(8, 3, 2\)"):
        nn.BatchNorm(4)(jnp.ones((8, 3, 2)), inference=True)
    with pytest.raises(ValueError, match=r"BatchNorm\(input_size=4, axis_name=None\).*\(3,\)"):
        nn.BatchNorm(4)(jnp.ones(3), inference=True)
    with pytest.raises(ValueError, match=r"channels_last=True.*C=4 on the last axis.*\(2, 3\)"):
        nn.BatchNorm(4, channels_last=True)(jnp.ones((2, 3)), inference=True)


def test_bad_constructor_arguments() -> None:
    with pytest.raises(ValueError, match="BatchNorm: `input_size` must be a positive int"):
        nn.BatchNorm(0)
    with pytest.raises(ValueError, match=r"BatchNorm: momentum must be in \[0, 1\]"):
        nn.BatchNorm(3, momentum=1.5)
    with pytest.raises(ValueError, match="BatchNorm: eps must be positive"):
        nn.BatchNorm(3, eps=0.0)
    with pytest.raises(TypeError, match="BatchNorm: dtype must be a real floating dtype"):
        nn.BatchNorm(3, dtype=jnp.int32)
    with pytest.warns(UserWarning, match=r"PyTorch's convention.*pass momentum=0.01"):
        nn.BatchNorm(3, momentum=0.99)


def test_nested_jit_inside_stateful_is_a_clear_error() -> None:
    class Net(tm.Module):
        bn: nn.BatchNorm

        def __call__(self, x):
            return tm.filter_jit(lambda m, x: m(x))(self.bn, x)

    with pytest.raises(RuntimeError, match=r"under a JAX transform.*started inside"):
        tm.stateful(Net(nn.BatchNorm(2)))(jnp.ones((4, 2)))
    # In inference mode nothing is updated, so the nested jit is fine.
    out = nn.inference_mode(Net(nn.BatchNorm(2)))(jnp.ones((4, 2)))
    assert out.shape == (4, 2)


# ----- laws -----


_SHAPES = [(2, 1), (5, 3, 2), (3, 2, 2, 3)]


@settings(max_examples=15, deadline=None)
@given(
    shape=st.sampled_from(_SHAPES),
    scale=st.floats(0.1, 100.0),
    offset=st.floats(-100.0, 100.0),
    seed=st.integers(0, 2**16),
)
def test_training_output_is_standardised_per_channel(shape, scale, offset, seed) -> None:
    c = shape[1]
    x = scale * np.random.default_rng(seed).normal(size=shape) + offset
    y, new = _step(nn.BatchNorm(c, eps=1e-12), jnp.asarray(x, jnp.float32))
    axes = tuple(i for i in range(len(shape)) if i != 1)
    xn = np.asarray(jnp.asarray(x, jnp.float32), np.float64)
    np.testing.assert_allclose(np.asarray(y).mean(axes), 0, atol=1e-3)
    np.testing.assert_allclose(np.asarray(y).var(axes), 1, atol=1e-3)
    count = xn.size // c
    mean = xn.mean(axes)
    np.testing.assert_allclose(new.running_mean.value, 0.1 * mean, rtol=1e-4, atol=1e-4 * scale)
    unbiased = xn.var(axes) * count / (count - 1)
    np.testing.assert_allclose(new.running_var.value, 0.9 + 0.1 * unbiased, rtol=1e-3)
