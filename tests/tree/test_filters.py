"""Leaf predicates and filter / partition / combine."""

import warnings

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

import treemod as tm


class Layer(tm.Module):
    weight: jax.Array
    bias: jax.Array
    count: int
    name: str = tm.field(static=True, default="layer")


class Model(tm.Module):
    encoder: Layer
    decoder: Layer
    extra: object = None


def _model() -> Model:
    return Model(
        Layer(jnp.ones((2, 2)), jnp.zeros(2), 1),
        Layer(jnp.full((2, 2), 2.0), jnp.ones(2), 2),
        extra=[np.arange(3), "tag"],
    )


# --- predicates -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, array, inexact, like",
    [
        (jnp.zeros(3), True, True, True),
        (jnp.arange(3), True, False, True),
        (jnp.zeros(2, dtype=jnp.complex64), True, True, True),
        (jnp.zeros(2, dtype=bool), True, False, True),
        (np.zeros(3), True, True, True),
        (np.arange(3), True, False, True),
        (np.float32(1.0), True, True, True),
        (np.int8(1), True, False, True),
        (1.0, False, False, True),
        (1, False, False, True),
        (True, False, False, True),
        (1j, False, False, True),
        ("a", False, False, False),
        (None, False, False, False),
        ([1.0], False, False, False),
        # abstract leaves (from jax.eval_shape) count as the arrays they stand for
        (jax.ShapeDtypeStruct((2,), jnp.float32), True, True, True),
        (jax.ShapeDtypeStruct((), jnp.float32, weak_type=True), True, True, True),
        (jax.ShapeDtypeStruct((2,), jnp.bfloat16), True, True, True),
        (jax.ShapeDtypeStruct((2,), jnp.complex64), True, True, True),
        (jax.ShapeDtypeStruct((2,), jnp.int32), True, False, True),
        (jax.ShapeDtypeStruct((2,), jnp.bool_), True, False, True),
        (jax.eval_shape(lambda: jax.random.key(0)), True, False, True),
    ],
)
def test_predicates(value: object, array: bool, inexact: bool, like: bool) -> None:
    assert tm.is_array(value) is array
    assert bool(tm.is_inexact_array(value)) is inexact
    assert tm.is_array_like(value) is like
    inexact_like = inexact or isinstance(value, float | complex)
    assert tm.is_inexact_array_like(value) is inexact_like


def test_predicates_see_tracers_as_arrays() -> None:
    seen: list[tuple[bool, bool]] = []

    def record(x: jax.Array, i: jax.Array) -> jax.Array:
        seen.append((tm.is_array(x), tm.is_inexact_array(x)))
        seen.append((tm.is_array(i), tm.is_inexact_array(i)))
        return x.sum()

    x, i = jnp.ones(2), jnp.arange(2)
    jax.jit(record)(x, i)
    jax.vmap(record)(x, i)
    jax.grad(record)(x, i)
    assert seen == [(True, True), (True, False)] * 3


def test_predicates_agree_on_a_tree_and_its_eval_shape_skeleton() -> None:
    # The reference is the concrete tree: filtering its skeleton keeps exactly the leaves that
    # filtering the concrete tree keeps, for every predicate.
    tree = {
        "w": jnp.ones((2, 3)),
        "i": jnp.arange(3),
        "np": np.zeros(2, np.float16),
        "key": jax.random.key(1),
        "c": jnp.zeros(2, jnp.complex64),
        "flag": jnp.array(True),
    }
    skeleton = jax.eval_shape(lambda: tree)
    for predicate in (tm.is_array, tm.is_inexact_array, tm.is_array_like, tm.is_param):
        concrete = jtu.tree_map(lambda x: x is not None, tm.filter(tree, predicate))
        abstract = jtu.tree_map(lambda x: x is not None, tm.filter(skeleton, predicate))
        assert abstract == concrete, predicate.__name__


def test_filtered_transforms_still_treat_shape_dtype_structs_as_static() -> None:
    # The predicates accept abstract leaves; what filter_jit traces does not change: a
    # ShapeDtypeStruct argument is static (hashed into the cache key), not traced.
    traces: list[tuple[int, ...]] = []

    @tm.filter_jit
    def zeros_like(spec: jax.ShapeDtypeStruct, x: jax.Array) -> jax.Array:
        traces.append(spec.shape)
        return jnp.zeros(spec.shape, spec.dtype) + x

    out = zeros_like(jax.ShapeDtypeStruct((2,), jnp.float32), jnp.ones(()))
    np.testing.assert_array_equal(out, np.ones(2, np.float32))
    zeros_like(jax.ShapeDtypeStruct((2,), jnp.float32), jnp.ones(()))
    zeros_like(jax.ShapeDtypeStruct((3,), jnp.float32), jnp.ones(()))
    assert traces == [(2,), (3,)]


def test_tree_equal_compares_abstract_leaves_by_shape_and_dtype() -> None:
    a = {"w": jax.ShapeDtypeStruct((2,), jnp.float32)}
    assert tm.tree_equal(a, {"w": jax.ShapeDtypeStruct((2,), jnp.float32)})
    assert not tm.tree_equal(a, {"w": jax.ShapeDtypeStruct((3,), jnp.float32)})
    assert not tm.tree_equal(a, {"w": jnp.zeros(2)})


# --- transforms keep abstract leaves static ------------------------------------------------------

_SPEC = jax.ShapeDtypeStruct((2,), jnp.float32)


def _loss(t: dict[str, object]) -> jax.Array:
    spec = t["spec"]
    assert isinstance(spec, jax.ShapeDtypeStruct), "the transform traced the abstract leaf"
    return jnp.sum(t["w"] ** 2) + jnp.zeros(spec.shape, spec.dtype).sum()  # type: ignore[operator]


def _custom_vjp_loss() -> object:
    @tm.filter_custom_vjp
    def loss(t: dict[str, object]) -> jax.Array:
        return _loss(t)

    def fwd(perturbed: object, t: dict[str, object]) -> tuple[jax.Array, object]:
        return _loss(t), t["w"]

    def bwd(w: jax.Array, ct: jax.Array, perturbed: object, t: object) -> dict[str, object]:
        return {"w": 2 * w * ct, "spec": None}

    loss.def_fwd(fwd)
    loss.def_bwd(bwd)
    return loss


@pytest.mark.parametrize(
    "derivative",
    [
        lambda t: tm.filter_grad(_loss)(t),
        lambda t: tm.filter_value_and_grad(_loss)(t)[1],
        lambda t: tm.filter_jacfwd(_loss)(t),
        lambda t: tm.filter_jacrev(_loss)(t),
        lambda t: tm.filter_grad(tm.filter_checkpoint(_loss))(t),
        lambda t: tm.filter_grad(tm.filter_jit(_loss))(t),
        lambda t: tm.filter_vjp(_loss, t)[1](jnp.float32(1.0))[0],
        lambda t: tm.filter_grad(_custom_vjp_loss())(t),
    ],
    ids=["grad", "value_and_grad", "jacfwd", "jacrev", "checkpoint", "jit", "vjp", "custom_vjp"],
)
def test_derivatives_leave_an_abstract_leaf_undifferentiated(derivative: object) -> None:
    # is_param counts a ShapeDtypeStruct (for filtering skeletons); the transforms, as
    # Equinox's, keep it static and give it no gradient. Reference: d/dw sum(w**2) = 2w.
    w = jnp.array([1.0, -3.0])
    grads = derivative({"w": w, "spec": _SPEC})  # type: ignore[operator]
    assert grads["spec"] is None
    np.testing.assert_allclose(grads["w"], [2.0, -6.0])


def test_hessian_leaves_an_abstract_leaf_undifferentiated() -> None:
    hessian = tm.filter_hessian(_loss)({"w": jnp.ones(2), "spec": _SPEC})
    assert hessian["spec"] is None and hessian["w"]["spec"] is None
    np.testing.assert_allclose(hessian["w"]["w"], 2 * np.eye(2))


def test_filter_jvp_refuses_a_tangent_for_an_abstract_leaf_naming_its_path() -> None:
    t = {"w": jnp.ones(2), "spec": _SPEC}
    primal, tangent = tm.filter_jvp(_loss, (t,), ({"w": jnp.ones(2), "spec": None},))
    np.testing.assert_allclose([primal, tangent], [2.0, 4.0])
    with pytest.raises(TypeError, match=r"primals\[0\]\['spec'\] is f32\[2\].*tangent None"):
        tm.filter_jvp(_loss, (t,), ({"w": jnp.ones(2), "spec": _SPEC},))


def test_abstract_leaves_in_fields_do_not_warn_as_arrays() -> None:
    # Equinox's construction warnings are about arrays: a ShapeDtypeStruct describing one is
    # ordinary static configuration.
    class Spec(tm.Module):
        spec: jax.ShapeDtypeStruct = tm.field(static=True)
        shapes: object = tm.field(init=False)

        def __post_init__(self) -> None:
            self.shapes = jax.ShapeDtypeStruct((3,), jnp.float32)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Spec(_SPEC).spec == _SPEC
    with pytest.warns(UserWarning, match=r"Held\.table is a static field holding an array"):

        class Held(tm.Module):
            table: jax.Array = tm.field(static=True)

        Held(jnp.zeros(2))


# --- filter ---------------------------------------------------------------------------------------


def test_filter_with_a_predicate_keeps_structure() -> None:
    model = _model()
    arrays = tm.filter(model, tm.is_array)

    def is_none(x: object) -> bool:
        return x is None

    assert jtu.tree_structure(arrays, is_leaf=is_none) == jtu.tree_structure(model)
    assert arrays.encoder.count is None and arrays.extra[1] is None
    assert arrays.encoder.weight is model.encoder.weight
    assert arrays.encoder.name == "layer"  # static fields are structure, never filtered
    rest = tm.filter(model, tm.is_array, inverse=True)
    assert rest.encoder.weight is None and rest.encoder.count == 1
    floats = tm.filter(model, tm.is_inexact_array, replace=0)
    assert floats.extra[0] == 0 and floats.encoder.count == 0


def test_filter_with_bool_spec() -> None:
    model = _model()
    assert tm.filter(model, True) == model
    assert jtu.tree_leaves(tm.filter(model, False)) == []


def test_filter_with_a_prefix_tree_spec_equinox_style() -> None:
    model = _model()
    spec = jtu.tree_map(lambda _: False, model)
    spec = tm.tree_at(lambda m: m.decoder, spec, True)
    trainable = tm.filter(model, spec)
    assert trainable.encoder.weight is None and trainable.encoder.count is None
    assert trainable.decoder.weight is model.decoder.weight
    assert trainable.decoder.count == 2
    # predicates in a prefix tree, mixed with bools
    spec = Model(tm.is_inexact_array, False, True)  # type: ignore[arg-type]
    out = tm.filter(model, spec)
    assert out.encoder.weight is model.encoder.weight and out.encoder.count is None
    assert out.decoder.bias is None and out.extra[1] == "tag"


def test_filter_spec_that_is_not_a_prefix_errors() -> None:
    with pytest.raises(ValueError, match="filter_spec must be a prefix of the tree"):
        tm.filter({"a": jnp.ones(1)}, {"b": True})
    with pytest.raises(TypeError, match=r"filter_spec leaves must be bools or predicates; got str"):
        tm.filter([1, 2], ["yes", True])


def test_filter_is_leaf() -> None:
    tree = {"a": (jnp.ones(1), 2), "b": [3]}
    out = tm.filter(tree, lambda x: isinstance(x, tuple), is_leaf=lambda x: isinstance(x, tuple))
    assert out["a"] is tree["a"] and out["b"] == [None]


def test_predicate_with_its_own_is_leaf() -> None:
    class Box(tm.Module):
        value: jax.Array

    def is_box(x: object) -> bool:
        return isinstance(x, Box)

    is_box.is_leaf = is_box  # type: ignore[attr-defined]
    tree = [Box(jnp.ones(1)), jnp.zeros(1)]
    out = tm.filter(tree, is_box)
    assert out[0] is tree[0] and out[1] is None
    # combined with a user is_leaf
    out = tm.filter(tree, is_box, is_leaf=lambda x: isinstance(x, list) and x is not tree)
    assert out[0] is tree[0]


def test_filter_inside_jit() -> None:
    @jax.jit
    def f(tree: list) -> jax.Array:
        return sum(jtu.tree_leaves(tm.filter(tree, tm.is_inexact_array)))

    np.testing.assert_allclose(f([jnp.ones(2), jnp.arange(2)]), np.ones(2))


# --- partition and combine ---------------------------------------------------------------------


def test_partition_and_combine_are_inverse_and_disjoint() -> None:
    model = _model()
    arrays, rest = tm.partition(model, tm.is_array)
    assert tm.combine(arrays, rest) == model
    assert tm.combine(rest, arrays) == model
    for a, r in zip(
        jtu.tree_leaves(arrays, is_leaf=lambda x: x is None),
        jtu.tree_leaves(rest, is_leaf=lambda x: x is None),
        strict=True,
    ):
        assert (a is None) != (r is None)


def test_partition_with_replace_and_prefix_spec() -> None:
    model = _model()
    spec = tm.tree_at(lambda m: m.encoder, jtu.tree_map(lambda _: False, model), True)
    enc, others = tm.partition(model, spec, replace="hole")
    assert enc.decoder.weight == "hole" and others.encoder.weight == "hole"
    assert enc.encoder.weight is model.encoder.weight


def test_combine_many_and_is_leaf() -> None:
    assert tm.combine([1, None, None], [None, 2, None], [None, None, 3]) == [1, 2, 3]
    assert tm.combine([None, None], [None, None]) == [None, None]
    pairs = tm.combine([None, (1, 2)], [(3, 4), None], is_leaf=lambda x: isinstance(x, tuple))
    assert pairs == [(3, 4), (1, 2)]
    with pytest.raises(TypeError, match="combine\\(\\) needs at least one pytree"):
        tm.combine()


def test_partition_combine_under_jit_matches_plain_jax() -> None:
    model = _model()
    params, static = tm.partition(model, tm.is_inexact_array)

    @jax.jit
    def loss(params: Model) -> jax.Array:
        m = tm.combine(params, static)
        return jnp.sum(m.encoder.weight) * m.decoder.count

    grads = jax.grad(loss)(params)
    np.testing.assert_allclose(grads.encoder.weight, np.full((2, 2), 2.0))
    np.testing.assert_allclose(grads.decoder.weight, np.zeros((2, 2)))
