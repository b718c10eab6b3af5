"""The rest of Equinox's public API in treemod.compat.equinox, against real Equinox."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm
import treemod.compat.equinox as teqx

eqx = pytest.importorskip("equinox")


def _same_type(a: object, b: object) -> bool:
    return type(a) is type(b) and bool(a == b)


@pytest.mark.parametrize(
    ("x", "y", "kwargs"),
    [
        (jnp.ones(2), jnp.ones(2), {}),
        (jnp.ones(2), jnp.zeros(2), {}),
        (jnp.ones(2), jnp.ones(3), {}),
        (np.ones(2), np.ones(2), {}),
        (np.ones(2), jnp.ones(2), {}),
        (np.ones(2), jnp.ones(2), {"typematch": True}),
        (jnp.ones(2), jnp.ones(2) + 1e-4, {"atol": 1e-3}),
        ({"a": 1, "b": jnp.ones(())}, {"a": 1, "b": jnp.ones(())}, {}),
        ({"a": 1, "b": jnp.ones(())}, {"a": 2, "b": jnp.ones(())}, {}),
        ([1.0, "s"], [1.0, "s"], {}),
        (1.0, jnp.float32(1.0), {}),
    ],
)
def test_tree_equal_gives_equinox_result_types(x: object, y: object, kwargs: dict) -> None:
    ours, theirs = teqx.tree_equal(x, y, **kwargs), eqx.tree_equal(x, y, **kwargs)
    assert _same_type(ours, theirs), (ours, theirs)
    assert bool(tm.tree_equal(x, y, **kwargs)) == bool(theirs)  # treemod proper: same answer


def test_tree_equal_under_jit_is_traced_as_in_equinox() -> None:
    out = jax.jit(lambda a, b: teqx.tree_equal(a, b))(jnp.ones(2), jnp.ones(2))
    assert isinstance(out, jax.Array) and out.dtype == jnp.bool_ and bool(out)


def test_runtime_error_names() -> None:
    assert teqx.EquinoxRuntimeError is tm.RuntimeCheckError
    assert teqx.EquinoxTracetimeError is tm.RuntimeCheckError
    with pytest.raises(teqx.EquinoxRuntimeError, match="negative"):
        teqx.error_if(jnp.ones(()), jnp.array(True), "negative")


def test_debug_namespace_matches_equinox() -> None:
    assert set(teqx.debug.__all__) >= {
        n for n in dir(eqx.debug) if not n.startswith("_") and n != "announce_transform"
    }


class _Affine(teqx.Module):
    w: jax.Array

    def apply(self, x: jax.Array) -> jax.Array:
        """Scale x."""
        return self.w * x

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.apply(x)


class _EqxAffine(eqx.Module):  # type: ignore[misc,name-defined]
    w: jax.Array

    def apply(self, x: jax.Array) -> jax.Array:
        return self.w * x


def test_bound_methods_are_pytrees_of_the_module_as_in_equinox() -> None:
    ours, theirs = _Affine(jnp.arange(3.0)), _EqxAffine(jnp.arange(3.0))
    ours_leaves = jax.tree_util.tree_leaves(ours.apply)
    assert [np.asarray(x).tolist() for x in ours_leaves] == [
        np.asarray(x).tolist() for x in jax.tree_util.tree_leaves(theirs.apply)
    ]
    run = jax.jit(lambda method, x: method(x))  # the method crosses jit as a pytree
    np.testing.assert_array_equal(run(ours.apply, jnp.ones(3)), run(theirs.apply, jnp.ones(3)))
    assert ours.apply.__name__ == "apply" and ours.apply.__doc__ == "Scale x."
    assert ours.apply == ours.apply and ours(jnp.ones(3)).tolist() == [0.0, 1.0, 2.0]
    leaves, treedef = jax.tree_util.tree_flatten(ours.apply)
    assert jax.tree_util.tree_unflatten(treedef, leaves)(jnp.ones(3)).tolist() == [0.0, 1.0, 2.0]


def test_filter_jit_of_a_bound_method_counts_its_own_traces() -> None:
    model = _Affine(jnp.ones(()))
    f = teqx.filter_jit(model.apply)
    f(jnp.ones(2))
    f(jnp.ones(3))
    assert teqx.debug.get_num_traces(f) == 2


@pytest.mark.parametrize(
    "tree",
    [
        {"w": jnp.zeros((2, 3)), "n": np.arange(2), "s": "relu"},
        [jnp.asarray(1.0) * 2, jax.ShapeDtypeStruct((2,), jnp.float32)],
        list(range(30)),
        (jnp.ones(2), None, 3.5),
    ],
)
@pytest.mark.parametrize(
    "options",
    [{}, {"width": 20}, {"struct_as_array": True}, {"short_arrays": False}, {"indent": 4}],
)
def test_tree_pformat_matches_equinox(tree: object, options: dict) -> None:
    assert teqx.tree_pformat(tree, **options) == eqx.tree_pformat(tree, **options)


def test_tree_pformat_truncate_leaf_matches_equinox() -> None:
    tree = {"a": [1, 2], "b": {"c": 3}}

    def is_list(x: object) -> bool:
        return isinstance(x, list)

    assert teqx.tree_pformat(tree, truncate_leaf=is_list) == eqx.tree_pformat(
        tree, truncate_leaf=is_list
    )


def test_filter_custom_vjp_residuals_may_hold_non_arrays() -> None:
    marker = object()

    @teqx.filter_custom_vjp
    def triple_grad(x: jax.Array) -> jax.Array:
        return 2 * x

    @triple_grad.def_fwd
    def fwd(perturbed: object, x: jax.Array) -> tuple[jax.Array, tuple]:
        return triple_grad(x), (marker, x, "tag")

    @triple_grad.def_bwd
    def bwd(res: tuple, g: jax.Array, perturbed: object, x: jax.Array) -> jax.Array:
        assert res[0] is marker and res[2] == "tag"
        return 3 * g

    for grad in (jax.grad(triple_grad), jax.jit(jax.grad(triple_grad))):
        assert grad(jnp.array(1.0)) == 3.0


def test_filter_pure_callback_checks_non_array_outputs_as_equinox() -> None:
    declared, returned = object(), object()

    def host(x: np.ndarray, tag: object) -> tuple:
        return x + 1, tag

    struct = (jax.ShapeDtypeStruct((), jnp.float32), declared)
    out = teqx.filter_pure_callback(host, jnp.array(1.0), declared, result_shape_dtypes=struct)
    assert out[0] == 2.0 and out[1] is declared
    with pytest.raises(RuntimeError, match=r"returned .* at \[1\], where result_shape_dtypes"):
        jax.block_until_ready(
            teqx.filter_pure_callback(host, jnp.array(1.0), returned, result_shape_dtypes=struct)
        )
    for module in (teqx, eqx):  # Equinox raises too
        g = module.filter_jit(
            lambda x, m=module: m.filter_pure_callback(
                host, x, returned, result_shape_dtypes=struct
            )
        )
        with pytest.raises(RuntimeError):
            jax.block_until_ready(g(jnp.array(2.0)))


def test_filter_custom_vjp_defvjp_old_api_warns_and_works() -> None:
    @teqx.filter_custom_vjp
    def f(x: jax.Array, y: jax.Array) -> jax.Array:
        return x * y

    def fwd(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        return x * y, y

    def bwd(res: jax.Array, g: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
        return 10 * g * res  # a deliberately different rule, to see it used

    with pytest.warns(DeprecationWarning, match="defvjp is Equinox's deprecated API"):
        f.defvjp(fwd, bwd)
    assert jax.grad(f)(jnp.array(2.0), jnp.array(3.0)) == 30.0


def test_static_field_is_a_deprecated_static_field() -> None:
    with pytest.warns(DeprecationWarning, match="static_field"):

        class WithStatic(teqx.Module):
            weight: jax.Array
            size: int = teqx.static_field(default=3)

    leaves = jax.tree_util.tree_leaves(WithStatic(jnp.ones(2)))
    assert len(leaves) == 1 and WithStatic(jnp.ones(2)).size == 3


def test_abstract_variables_under_equinox_names() -> None:
    class Base(teqx.Module):
        x: teqx.AbstractVar[int]
        y: teqx.AbstractClassVar[int]

    class Half(Base):
        x: int

    class Full(Half):
        y: ClassVar[int] = 1

    assert (Base.__abstractvars__, Base.__abstractclassvars__) == ({"x"}, {"y"})
    assert (Half.__abstractvars__, Half.__abstractclassvars__) == (frozenset(), {"y"})
    assert (Full.__abstractvars__, Full.__abstractclassvars__) == (frozenset(), frozenset())
