"""Filtered transforms behave as Equinox's: the same programs run with Equinox and treemod."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

import treemod.compat.equinox as teqx

eqx = pytest.importorskip("equinox")


def _same(a: Any, b: Any) -> None:
    """Same structure (None included), same leaf types and values."""
    assert jtu.tree_structure(a) == jtu.tree_structure(b), (a, b)
    for x, y in zip(jtu.tree_leaves(a), jtu.tree_leaves(b), strict=True):
        assert type(x) is type(y), (x, y)
        if isinstance(x, str):
            assert x == y
        else:
            np.testing.assert_allclose(np.asarray(x), np.asarray(y))


def _outcome(fn: Any) -> Any:
    """`fn()`'s result, or the type of the exception it raised."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 (the type is the outcome compared)
        return type(e)


def _g(a: Any, n: Any, c: Any, m: Any) -> Any:
    return a**2, n * 3, c * 4, m * 5, jnp.float32(7.0), "label"


_PRIMALS = (jnp.array(1.0), jnp.array(2), 1.5, 3)


@pytest.mark.parametrize(
    "tangents",
    [
        (jnp.array(5.0), None, None, None),  # only `a`: the others' outputs have no tangent
        (jnp.array(5.0), None, 2.0, None),  # a Python float primal with a Python float tangent
        (None, None, jnp.array(3.0), None),  # a Python float primal with an array tangent
        (None, None, None, None),  # nothing differentiated: every tangent None
    ],
)
def test_filter_jvp_python_floats_and_symbolic_zeros(tangents: tuple) -> None:
    ours = teqx.filter_jvp(_g, _PRIMALS, tangents)
    theirs = eqx.filter_jvp(_g, _PRIMALS, tangents)
    _same(ours, theirs)


def test_filter_jvp_output_of_an_enclosing_jvp_has_no_tangent() -> None:
    def outer(jvp: Any) -> Any:
        def f(x: Any) -> Any:
            (_, _), (ta, tb) = jvp(lambda y: (y * 2, x), (x,), (1.0,))
            return ta, tb

        return jvp(f, (1.0,), (1.0,))

    _same(outer(teqx.filter_jvp), outer(eqx.filter_jvp))
    (_, tb), _ = outer(teqx.filter_jvp)
    assert tb is None


@pytest.mark.parametrize(
    ("tangent", "error"),
    [(jnp.array(5), TypeError), (jnp.ones(3), ValueError), ("x", TypeError)],
)
def test_filter_jvp_bad_tangent_errors_are_jaxs_types(tangent: Any, error: type) -> None:
    primals = ({"w": jnp.array(1.0)},)
    tangents = ({"w": tangent},)
    assert _outcome(lambda: eqx.filter_jvp(lambda p: p["w"], primals, tangents)) is error
    with pytest.raises(error, match=r"filter_jvp\(<lambda>\): the tangent of primals\[0\]\['w'\]"):
        teqx.filter_jvp(lambda p: p["w"], primals, tangents)


@pytest.mark.parametrize("out_axes", [None, 0, -1, teqx.if_array(0), (0, None, 0)])
@pytest.mark.parametrize("in_axes", [None, 0])
def test_filter_vmap_python_number_outputs_follow_out_axes(in_axes: Any, out_axes: Any) -> None:
    def run(e: Any) -> Any:
        f = lambda x: (1, x, 2.5)  # noqa: E731
        return e.filter_vmap(f, in_axes=in_axes, out_axes=out_axes, axis_size=3)(jnp.arange(3))

    ours, theirs = _outcome(lambda: run(teqx)), _outcome(lambda: run(eqx))
    if isinstance(theirs, type):  # a batched output given out_axes None: both refuse it
        assert ours is theirs
    else:
        _same(ours, theirs)


@pytest.mark.parametrize("out_axes", [None, (0, 0, None), teqx.if_array(0)])
def test_filter_pmap_python_number_outputs_follow_out_axes(out_axes: Any) -> None:
    def run(e: Any) -> Any:
        f = e.filter_pmap(lambda x: (x, 3.0, "s"), in_axes=None, out_axes=out_axes, axis_size=1)
        return f(jnp.arange(2))

    ours = run(teqx)
    with warnings.catch_warnings():
        # Equinox 0.13.8 on JAX 0.12 asks `eval_shape` for an int64 struct without x64 (its own
        # call, not treemod's), and gets int32 with a warning.
        warnings.filterwarnings("ignore", "Explicitly requested dtype int64", UserWarning)
        theirs = run(eqx)
    _same(ours, theirs)


def test_filter_make_jaxpr_returned_shape_dtype_struct_is_static() -> None:
    spec = jax.ShapeDtypeStruct((2,), jnp.float32)

    def f(x: Any) -> Any:
        return x * 2, jax.ShapeDtypeStruct((3,), jnp.int32)

    ours, theirs = teqx.filter_make_jaxpr(f)(spec), eqx.filter_make_jaxpr(f)(spec)
    assert ours[0].consts == theirs[0].consts == []
    assert ours[1:] == theirs[1:]
    assert ours[2] == (None, jax.ShapeDtypeStruct((3,), jnp.int32))


def test_failed_check_in_filter_jit_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    def run(e: Any) -> Any:
        @e.filter_jit
        def f(x: Any) -> Any:
            return e.error_if(x, x > 0, "positive")

        with pytest.raises(RuntimeError, match="positive") as info:
            jax.block_until_ready(f(jnp.array(1.0)))
        return info.value

    for e in (eqx, teqx):
        caplog.clear()
        error = run(e)
        assert caplog.text == "", e  # as with Equinox: the error is raised, not also logged
        assert error.__cause__ is None


def _custom_vjp_program(e: Any) -> tuple[Any, list[Any]]:
    """A filter_custom_vjp whose passes record what they are given; the gradient and records."""
    seen: list[Any] = []

    @e.filter_custom_vjp
    def f(xy: Any, tag: str, *, scale: Any) -> Any:
        x, y, n = xy
        return x * y * scale, x, y, n, tag

    @f.def_fwd
    def f_fwd(perturbed: Any, xy: Any, tag: str, *, scale: Any) -> Any:
        seen.append(perturbed)
        return f(xy, tag, scale=scale), xy[1]

    @f.def_bwd
    def f_bwd(res: Any, ct: Any, perturbed: Any, xy: Any, tag: str, *, scale: Any) -> Any:
        seen.append(perturbed)
        seen.append(jtu.tree_map(lambda c: c is None, ct, is_leaf=lambda c: c is None))
        return ct[0] * res * scale + (0.0 if ct[1] is None else ct[1]), None, None

    def loss(x: Any) -> Any:
        out, _, y_out, _, _ = f((x, jnp.array(3.0), jnp.array(2)), "t", scale=2.0)
        return out + y_out

    return jax.grad(loss)(jnp.array(1.5)), seen


def test_filter_custom_vjp_perturbed_and_symbolic_zero_cotangents() -> None:
    (ours, ours_seen), (theirs, theirs_seen) = _custom_vjp_program(teqx), _custom_vjp_program(eqx)
    np.testing.assert_allclose(ours, theirs)
    # perturbed: True only at the differentiated float (x); the unused output x has a
    # symbolically zero cotangent (None), as do the integer and string outputs.
    assert (
        ours_seen
        == theirs_seen
        == [
            (True, False, False),
            (True, False, False),
            (False, True, False, True, True),
        ]
    )


def test_filter_custom_vjp_differentiating_another_argument_is_an_error() -> None:
    def program(e: Any) -> Any:
        @e.filter_custom_vjp
        def f(x: Any, y: Any) -> Any:
            return x + y

        f.def_fwd(lambda perturbed, x, y: (x + y, None))
        f.def_bwd(lambda res, ct, perturbed, x, y: ct)
        return jax.grad(lambda x: f(x, {"b": x}))(1.0)

    assert _outcome(lambda: program(eqx)) is RuntimeError
    with pytest.raises(RuntimeError, match=r"filter_custom_vjp\(f\): args\[0\]\['b'\] is being"):
        program(teqx)


@pytest.mark.parametrize("name", ["filter_grad", "filter_value_and_grad"])
def test_first_argument_by_keyword_is_refused_as_in_equinox(name: str) -> None:
    prefix = "Functions wrapped with"
    with pytest.raises(TypeError, match=prefix):
        getattr(eqx, name)(lambda x: x)(x=jnp.array(1.0))
    with pytest.raises(TypeError, match=rf"{prefix} {name} .* {name}\(<lambda>\) was called"):
        getattr(teqx, name)(lambda x: x)(x=jnp.array(1.0))


def test_filter_jit_wrappers_of_one_custom_vjp_function_share_its_versions() -> None:
    def traces(e: Any) -> int:
        count = [0]

        @e.filter_custom_vjp
        def f(x: Any) -> Any:
            count[0] += 1
            return x

        f.def_fwd(lambda perturbed, x: (x, None))
        f.def_bwd(lambda res, g, perturbed, x: g + 2)
        for _ in range(2):  # a new filter_jit wrapper each time, of the same object
            assert e.filter_grad(e.filter_jit(f))(jnp.array(1.0)) == 3
        return count[0]

    assert traces(teqx) == traces(eqx)


@pytest.mark.parametrize("donate", ["none", "all"])
def test_filter_pmap_lower_and_compile_as_in_equinox(donate: str) -> None:
    def run(e: Any) -> Any:
        f = e.filter_pmap(lambda x, k, tag: (2 * x + k, tag), donate=donate)
        lowered = f.lower(jnp.array([3.0]), 4, "t")
        assert "stablehlo" in lowered.as_text() or "func" in lowered.as_text()
        return lowered.compile()(jnp.array([3.0]), 4, "t")

    _same(run(teqx), run(eqx))


_TRACES: list[int] = []


def _counted(x: Any) -> Any:  # module level: no closure cells that could change
    _TRACES.append(1)
    return jnp.sum(x**2)


@pytest.mark.parametrize(
    "wrap",
    [
        lambda e: e.filter_grad(_counted),
        lambda e: e.filter_value_and_grad(_counted),
        lambda e: e.filter_vmap(_counted),
        lambda e: e.filter_vmap(e.filter_grad(_counted), in_axes=e.if_array(0)),
    ],
)
def test_filter_jit_of_a_new_transform_wrapper_reuses_its_versions(wrap: Any) -> None:
    def traces(e: Any) -> int:
        _TRACES.clear()
        for x in (jnp.ones((2, 3)), jnp.zeros((2, 3))):
            e.filter_jit(wrap(e))(x)  # written inline: a new wrapper of the same function
        return len(_TRACES)

    assert traces(teqx) == traces(eqx) == 1


def test_shared_versions_of_a_wrapped_function_are_freed_with_it() -> None:
    import gc
    import weakref

    def make() -> Any:
        def f(x: Any) -> Any:
            return jnp.sum(x)

        return f

    f = make()
    alive = weakref.ref(f)
    teqx.filter_jit(teqx.filter_grad(f))(jnp.ones(2))
    del f
    gc.collect()
    assert alive() is None
