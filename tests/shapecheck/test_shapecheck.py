"""Shape checks: construction paths, calls, jit/vmap/scan, messages, variadic/broadcast dims."""

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxtyping import Array, Float, Int, PyTree

import treemod as tm
from treemod._shapecheck import engine as _shapecheck
from treemod._shapecheck.checker import checked_call_state
from treemod._tree.module_info import module_info

# ---------------------------------------------------------------------------- test modules


class Linear(tm.Module):
    weight: Float[Array, "out in"]
    bias: Float[Array, " out"]

    def __call__(self, x: Float[Array, " in"]) -> Float[Array, " out"]:
        return self.weight @ x + self.bias


class OptionalBias(tm.Module):
    weight: Float[Array, "out in"]
    bias: Float[Array, " out"] | None


class BadReturn(tm.Module):
    weight: Float[Array, "out in"]

    def __call__(self, x: Float[Array, " in"]) -> Float[Array, " out"]:
        return x * 2.0  # wrong: has size `in`, not `out`


class CustomInit(tm.Module):
    weight: Float[Array, "n n"]

    def __init__(self, n: int, m: int):
        self.weight = jnp.zeros((n, m))


class Converted(tm.Module):
    x: Float[Array, "3"] = tm.field(converter=lambda v: jnp.asarray(v, jnp.float32))


class Indices(tm.Module):
    idx: Int[Array, " n"]


class Outer(tm.Module):
    layer: Linear
    scale: Float[Array, ""]


class Batched(tm.Module):
    x: Float[Array, "*batch n"]
    y: Float[Array, "*batch n"]

    def __call__(self, z: Float[Array, "*batch n"]) -> Float[Array, "*batch"]:
        return jnp.sum(self.x * self.y * z, axis=-1)


class Scaled(tm.Module):
    weight: Float[Array, "n m"]
    scale: Float[Array, "#n 1"]


class Pair(tm.Module):
    weight: Float[Array, " n"]

    def dot(self, xs: tuple[Float[Array, " n"], Float[Array, " n"]]) -> Float[Array, ""]:
        return jnp.dot(xs[0], xs[1]) + jnp.sum(self.weight)


class Treeish(tm.Module):
    leaves: PyTree[Float[Array, " n"]]


class Always(tm.Module, shapecheck=True):
    x: Float[Array, "2"]


class Never(tm.Module, shapecheck=False):
    x: Float[Array, "2"]


class Plain(tm.Module):
    w: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.w * x


@tm.shapecheck
def outer_product(x: Float[Array, " m"], y: Float[Array, " n"]) -> Float[Array, "m n"]:
    return x[:, None] * y[None, :]


@tm.shapecheck
def same_size(x: Float[Array, " n"], y: Float[Array, " n"]) -> Float[Array, " n"]:
    return x + y


@tm.shapecheck
def wrong_out(x: Float[Array, " n"]) -> Float[Array, "n n"]:
    return x


def lin(out: int = 2, inp: int = 3) -> Linear:
    return Linear(jnp.ones((out, inp)), jnp.zeros(out))


pytestmark = pytest.mark.usefixtures("shape_checks_on")  # tests/conftest.py


# ---------------------------------------------------------------------------- bad cases


def _scan_with_wrong_carry() -> Any:
    layer = lin(2, 3)

    def body(carry, _):
        return carry, layer(carry)  # carry has size 4, layer expects in=3

    return jax.lax.scan(body, jnp.ones(4), None, length=2)


BAD_CASES: list[tuple[str, Callable[[], Any], str]] = [
    (
        "wrong dtype of a field",
        lambda: Linear(jnp.zeros((2, 3), jnp.int32), jnp.zeros(2)),
        r"^Linear\.weight: expected Float\[Array, 'out in'\], got i32\[2,3\]\n"
        r"  reason: this array has dtype int32, not .*float",
    ),
    (
        "wrong rank of a field",
        lambda: Linear(jnp.zeros(3), jnp.zeros(3)),
        r"^Linear\.weight: expected Float\[Array, 'out in'\], got f32\[3\]\n"
        r"  reason: this array has 1 dimensions, not the 2",
    ),
    (
        "mismatched dimension between two fields",
        lambda: Linear(jnp.zeros((64, 32)), jnp.zeros(32)),
        r"^Linear\.bias: expected Float\[Array, 'out'\] with out=64 \(bound by Linear\.weight\), "
        r"got f32\[32\]\n  reason: .*dimension out is 32.*64\n"
        r"  other dimensions bound so far: in=32 \(bound by Linear\.weight\)$",
    ),
    (
        "mismatched dimension in an optional field",
        lambda: OptionalBias(jnp.zeros((2, 3)), jnp.zeros(3)),
        r"^OptionalBias\.bias: expected Float\[Array, 'out'\] \| None with out=2 "
        r"\(bound by OptionalBias\.weight\), got f32\[3\]",
    ),
    (
        "wrong integer dtype",
        lambda: Indices(jnp.zeros(3)),
        r"^Indices\.idx: expected Int\[Array, 'n'\], got f32\[3\]\n  reason: .*dtype float32",
    ),
    (
        "None in a field that is not optional",
        lambda: Linear(jnp.zeros((2, 3)), None),
        r"^Linear\.bias: expected Float\[Array, 'out'\] with out=2 \(bound by Linear\.weight\), "
        r"got None",
    ),
    (
        "NumPy array where a JAX array is annotated",
        lambda: Linear(np.zeros((2, 3), np.float32), jnp.zeros(2)),
        r"^Linear\.weight: expected Float\[Array, 'out in'\], got f32\[2,3\] \(numpy\.ndarray\)",
    ),
    (
        "custom __init__ storing a wrong shape",
        lambda: CustomInit(2, 3),
        r"^CustomInit\.weight: expected Float\[Array, 'n n'\], got f32\[2,3\]\n"
        r"  reason: .*dimension n is 3.*2",
    ),
    (
        "converter producing a wrong shape",
        lambda: Converted([1.0, 2.0]),
        r"^Converted\.x: expected Float\[Array, '3'\], got f32\[2\]",
    ),
    (
        "tree_at swapping in a wrong shape",
        lambda: tm.tree_at(lambda m: m.bias, lin(2, 3), jnp.zeros(5)),
        r"^Linear\.bias: expected Float\[Array, 'out'\] with out=2 \(bound by Linear\.weight\), "
        r"got f32\[5\]",
    ),
    (
        "tree_at swapping in a wrong shape deep in a model",
        lambda: tm.tree_at(
            lambda m: m.layer.weight, Outer(lin(2, 3), jnp.ones(())), jnp.zeros((5, 3))
        ),
        r"^Linear\.bias: expected Float\[Array, 'out'\] with out=5 \(bound by Linear\.weight\), "
        r"got f32\[2\]",
    ),
    (
        "mismatched dimension between an argument and a field",
        lambda: lin(2, 3)(jnp.ones(4)),
        r"^Linear\.__call__ argument x: expected Float\[Array, 'in'\] with in=3 "
        r"\(bound by Linear\.weight\), got f32\[4\]\n"
        r"  reason: .*dimension in is 4.*3\n"
        r"  other dimensions bound so far: out=2 \(bound by Linear\.weight\)$",
    ),
    (
        "wrong dtype of an argument",
        lambda: lin(2, 3)(jnp.ones(3, jnp.int32)),
        r"^Linear\.__call__ argument x: expected Float\[Array, 'in'\] with in=3 .*got i32\[3\]",
    ),
    (
        "wrong return shape",
        lambda: BadReturn(jnp.ones((2, 3)))(jnp.ones(3)),
        r"^BadReturn\.__call__ return value: expected Float\[Array, 'out'\] with out=2 "
        r"\(bound by BadReturn\.weight\), got f32\[3\]",
    ),
    (
        "wrong return rank of a function",
        lambda: wrong_out(jnp.ones(3)),
        r"^wrong_out return value: expected Float\[Array, 'n n'\] with n=3 "
        r"\(bound by argument x\), got f32\[3\]",
    ),
    (
        "mismatched dimension between two arguments",
        lambda: same_size(jnp.ones(2), jnp.ones(3)),
        r"^same_size argument y: expected Float\[Array, 'n'\] with n=2 \(bound by argument x\), "
        r"got f32\[3\]",
    ),
    (
        "call under jax.jit",
        lambda: jax.jit(lambda m, x: m(x))(lin(2, 3), jnp.ones(4)),
        r"^Linear\.__call__ argument x: expected Float\[Array, 'in'\] with in=3 .*got f32\[4\]",
    ),
    (
        "call under jax.vmap (per-example shapes)",
        lambda: jax.vmap(lin(2, 3))(jnp.ones((7, 4))),
        r"^Linear\.__call__ argument x: expected Float\[Array, 'in'\] with in=3 .*got f32\[4\]",
    ),
    (
        "call under lax.scan",
        _scan_with_wrong_carry,
        r"^Linear\.__call__ argument x: expected Float\[Array, 'in'\] with in=3 .*got f32\[4\]",
    ),
    (
        "construction under jax.jit (tracer fields)",
        lambda: jax.jit(Linear)(jnp.zeros((2, 3)), jnp.zeros(3)),
        r"^Linear\.bias: expected Float\[Array, 'out'\] with out=2 .*got f32\[3\]",
    ),
    (
        "construction under jax.vmap (tracer fields, per-example shapes)",
        lambda: jax.vmap(lambda b: Linear(jnp.zeros((2, 3)), b))(jnp.zeros((5, 3))),
        r"^Linear\.bias: expected Float\[Array, 'out'\] with out=2 .*got f32\[3\]",
    ),
    (
        "variadic dimensions that differ between fields",
        lambda: Batched(jnp.ones((4, 2, 3)), jnp.ones((5, 2, 3))),
        r"^Batched\.y: expected Float\[Array, '\*batch n'\] with \*batch=\(4, 2\), n=3 "
        r"\(bound by Batched\.x\), got f32\[5,2,3\]",
    ),
    (
        "variadic dimensions of an argument that differ from the fields'",
        lambda: Batched(jnp.ones((4, 3)), jnp.ones((4, 3)))(jnp.ones((5, 3))),
        r"^Batched\.__call__ argument z: expected Float\[Array, '\*batch n'\] with "
        r"\*batch=\(4,\), n=3 \(bound by Batched\.x\), got f32\[5,3\]",
    ),
    (
        "broadcastable dimension of a wrong size",
        lambda: Scaled(jnp.ones((4, 3)), jnp.ones((2, 1))),
        r"^Scaled\.scale: expected Float\[Array, '#n 1'\] with n=4 \(bound by Scaled\.weight\), "
        r"got f32\[2,1\]",
    ),
    (
        "container annotation checked by the backend, sharing dimensions",
        lambda: Pair(jnp.ones(3)).dot((jnp.ones(3), jnp.ones(2))),
        r"^Pair\.dot argument xs: expected tuple\[Float\[Array, 'n'\], Float\[Array, 'n'\]\] "
        r"with n=3 \(bound by Pair\.weight\), got \(f32\[3\], f32\[2\]\)\n  reason: .*xs",
    ),
    (
        "PyTree annotation",
        lambda: Treeish({"a": jnp.ones(3), "b": jnp.ones(4)}),
        r"^Treeish\.leaves: expected PyTree\[Float\[Array, 'n'\]\]",
    ),
    (
        "class option shapecheck=True checks with checks switched off",
        lambda: _off(lambda: Always(jnp.ones(3))),
        r"^Always\.x: expected Float\[Array, '2'\], got f32\[3\]",
    ),
    (
        "@shapecheck turns checks on for the code it calls",
        lambda: _off(lambda: tm.shapecheck(lambda: lin(2, 3)(jnp.ones(4)))()),
        r"^Linear\.__call__ argument x: expected Float\[Array, 'in'\] with in=3",
    ),
]


def _off(fn: Callable[[], Any]) -> Any:
    with tm.shape_checks(False):
        return fn()


@pytest.mark.parametrize("what, build, pattern", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_cases_raise_with_clear_messages(what, build, pattern):
    with pytest.raises(tm.ShapeCheckError) as info:
        build()
    message = str(info.value)
    assert re.search(pattern, message), f"{what}:\n{message}"


def test_at_least_fifteen_bad_cases():
    assert len(BAD_CASES) >= 15


def test_error_is_a_jaxtyping_type_check_error():
    import jaxtyping

    with pytest.raises(jaxtyping.TypeCheckError):
        lin(2, 3)(jnp.ones(4))
    with pytest.raises(TypeError):
        lin(2, 3)(jnp.ones(4))


def test_issue_example_message_verbatim():
    with pytest.raises(tm.ShapeCheckError) as info:
        Linear(jnp.zeros((64, 32)), jnp.zeros(32))
    first_line = str(info.value).splitlines()[0]
    assert first_line == (
        "Linear.bias: expected Float[Array, 'out'] with out=64 (bound by Linear.weight), "
        "got f32[32]"
    )


# ---------------------------------------------------------------------------- good cases


def test_good_modules_and_calls_pass():
    layer = lin(2, 3)
    np.testing.assert_allclose(layer(jnp.ones(3)), np.full(2, 3.0))
    OptionalBias(jnp.zeros((2, 3)), None)
    OptionalBias(jnp.zeros((2, 3)), jnp.zeros(2))
    Indices(jnp.arange(4))
    Converted([1, 2, 3])
    CustomInit(3, 3)
    assert Pair(jnp.ones(3)).dot((jnp.ones(3), jnp.ones(3))).shape == ()
    Treeish({"a": jnp.ones(3), "b": [jnp.ones(3)]})
    assert outer_product(jnp.ones(2), jnp.ones(3)).shape == (2, 3)


@pytest.mark.parametrize("batch", [(), (5,), (2, 4)])
def test_variadic_dims(batch):
    x = jnp.ones((*batch, 3))
    m = Batched(x, x)
    out = m(x)
    assert out.shape == batch
    np.testing.assert_allclose(out, np.full(batch, 3.0))


@pytest.mark.parametrize("scale_shape", [(1, 1), (4, 1)])
def test_broadcastable_dims(scale_shape):
    m = Scaled(jnp.ones((4, 3)), jnp.ones(scale_shape))
    assert m.scale.shape == scale_shape


def test_dims_are_per_instance_and_per_call():
    # Different instances and different calls bind dimensions independently.
    a, b = lin(2, 3), lin(5, 7)
    assert a(jnp.ones(3)).shape == (2,)
    assert b(jnp.ones(7)).shape == (5,)
    assert same_size(jnp.ones(2), jnp.ones(2)).shape == (2,)
    assert same_size(jnp.ones(4), jnp.ones(4)).shape == (4,)


def test_nested_checked_calls_have_their_own_dims():
    class Two(tm.Module):
        first: Linear
        second: Linear

        def __call__(self, x: Float[Array, " n"]) -> Float[Array, " m"]:
            return self.second(self.first(x))

    model = Two(lin(4, 3), lin(2, 4))
    assert model(jnp.ones(3)).shape == (2,)


def test_tree_at_on_filter_specs_and_partitions_passes():
    layer = lin(2, 3)
    spec = jax.tree_util.tree_map(lambda _: False, layer)
    spec = tm.tree_at(lambda m: m.weight, spec, replace=True)
    assert spec.weight is True and spec.bias is False
    params, static = tm.partition(layer, spec)
    swapped = tm.tree_at(lambda m: m.weight, params, jnp.zeros((2, 3)))
    assert swapped.bias is None
    # ... but a real array of the wrong shape is still caught in a partitioned tree.
    with pytest.raises(tm.ShapeCheckError, match=r"Linear\.weight"):
        tm.tree_at(lambda m: m.weight, params, jnp.zeros(4))


def test_good_calls_under_transforms():
    layer = lin(2, 3)
    assert jax.jit(lambda m, x: m(x))(layer, jnp.ones(3)).shape == (2,)
    assert jax.vmap(layer)(jnp.ones((7, 3))).shape == (7, 2)
    assert jax.vmap(lambda b: Linear(jnp.zeros((2, 3)), b))(jnp.zeros((5, 2))).bias.shape == (5, 2)
    grads = jax.grad(lambda m: jnp.sum(m(jnp.ones(3))))(layer)
    assert grads.weight.shape == (2, 3)
    assert jax.eval_shape(lambda: lin(2, 3)).weight.shape == (2, 3)


# ---------------------------------------------------------------------------- switch


def test_checks_off_globally_and_in_a_block():
    tm.shape_checks(False)
    assert not tm.shape_checks_enabled()
    Linear(jnp.zeros((2, 3)), jnp.zeros(5))  # not checked
    with tm.shape_checks(True):
        assert tm.shape_checks_enabled()
        with pytest.raises(tm.ShapeCheckError):
            Linear(jnp.zeros((2, 3)), jnp.zeros(5))
    assert not tm.shape_checks_enabled()
    tm.shape_checks(True)
    with tm.shape_checks(False):
        Linear(jnp.zeros((2, 3)), jnp.zeros(5))
        assert lin(2, 3)(jnp.ones(3)).shape == (2,)
    with pytest.raises(tm.ShapeCheckError):
        Linear(jnp.zeros((2, 3)), jnp.zeros(5))


def test_class_options():
    Never(jnp.ones(5))  # never checked
    with pytest.raises(tm.ShapeCheckError):
        _off(lambda: Always(jnp.ones(5)))

    @tm.shapecheck
    class Decorated(tm.Module):
        x: Float[Array, "2"]

    with pytest.raises(tm.ShapeCheckError, match=r"Decorated\.x"):
        _off(lambda: Decorated(jnp.ones(3)))


def test_class_option_rejects_other_values():
    with pytest.raises(TypeError, match=r"class .*Bad: the class option `shapecheck=` takes True"):

        class Bad(tm.Module, shapecheck="yes"):  # type: ignore[call-arg]
            x: int


def test_shapecheck_decorator_rejects_non_modules():
    with pytest.raises(TypeError, match="shapecheck decorates functions and treemod.Module"):
        tm.shapecheck(int)
    with pytest.raises(TypeError, match="not 3"):
        tm.shapecheck(3)


def test_switch_arguments_are_validated():
    with pytest.raises(TypeError, match="takes True or False"):
        tm.shape_checks("yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Unknown shape checker 'mypy'"):
        tm.shape_checks(True, checker="mypy")
    with pytest.raises(ValueError, match="Unknown shape checker"):
        with tm.shape_checks(True, checker="pyright"):
            pass


def test_a_call_switches_from_now_on_and_a_block_only_inside():
    from treemod._shapecheck.config import current

    tm.shape_checks(False)
    with tm.shape_checks(True):
        assert current()[0] is True
        tm.shape_checks(False)  # the global setting; the block's own still holds here
        assert tm.shape_checks_enabled()
    assert not tm.shape_checks_enabled()
    tm.shape_checks(True)
    block = tm.shape_checks(False)
    with block:
        assert not tm.shape_checks_enabled()
    assert tm.shape_checks_enabled()  # the call that made the block changed nothing after it
    with pytest.raises(RuntimeError, match="can be entered once"):
        with block:
            pass


def test_a_block_is_local_to_its_thread_and_a_call_is_global():
    import threading

    seen: list[bool] = []

    def other_thread() -> None:
        seen.append(tm.shape_checks_enabled())
        try:
            Linear(jnp.zeros((2, 3)), jnp.zeros(5))
        except tm.ShapeCheckError:
            seen.append(True)
        else:
            seen.append(False)

    tm.shape_checks(True)
    with tm.shape_checks(False):
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert seen == [True, True]  # the block did not reach the other thread
    seen.clear()
    tm.shape_checks(False)
    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    tm.shape_checks(True)
    assert seen == [False, False]  # the call did


def test_a_forced_function_wins_over_an_enclosing_block_and_a_block_inside_it_wins():
    @tm.shapecheck
    def build(weight: Float[Array, "o i"]) -> Any:
        return Linear(weight, jnp.zeros(5))  # bias does not match: checked in here

    @tm.shapecheck
    def build_unchecked(weight: Float[Array, "o i"]) -> Any:
        with tm.shape_checks(False):
            return Linear(weight, jnp.zeros(5))

    with tm.shape_checks(False):
        with pytest.raises(tm.ShapeCheckError, match=r"Linear\.bias"):
            build(jnp.zeros((2, 3)))
        assert build_unchecked(jnp.zeros((2, 3))).bias.shape == (5,)


def test_default_is_on():
    # The environment variable is unset in the test run, so the default applies.
    import os

    from treemod._shapecheck.config import _env_checker, _env_enabled

    assert os.environ.get("TREEMOD_SHAPE_CHECKS") in (None, "1")
    assert os.environ.get("JAXTYPING_DISABLE", "0") == "0"
    assert _env_enabled() is True
    assert _env_checker() == "auto"  # typeguard 2.13 if installed, else beartype, else none


def test_environment_variable(monkeypatch):
    from treemod._shapecheck.config import _env_checker, _env_enabled

    for value, expected in [("0", False), ("off", False), ("1", True), ("TRUE", True)]:
        monkeypatch.setenv("TREEMOD_SHAPE_CHECKS", value)
        assert _env_enabled() is expected
    monkeypatch.delenv("TREEMOD_SHAPE_CHECKS")
    monkeypatch.setenv("JAXTYPING_DISABLE", "1")
    assert _env_enabled() is False  # jaxtyping's switch is honoured when ours is unset
    monkeypatch.setenv("TREEMOD_SHAPE_CHECKS", "1")
    assert _env_enabled() is True  # ours wins
    monkeypatch.delenv("JAXTYPING_DISABLE")
    monkeypatch.setenv("TREEMOD_SHAPE_CHECKS", "maybe")
    with pytest.raises(ValueError, match=r"TREEMOD_SHAPE_CHECKS='maybe' is not understood"):
        _env_enabled()
    monkeypatch.setenv("TREEMOD_SHAPE_CHECKER", "beartype")
    assert _env_checker() == "beartype"
    monkeypatch.setenv("TREEMOD_SHAPE_CHECKER", "mypy")
    with pytest.raises(ValueError, match=r"TREEMOD_SHAPE_CHECKER='mypy' is not understood"):
        _env_checker()


@pytest.mark.heavy
def test_environment_variable_at_import():
    import subprocess
    import sys

    code = (
        "import jax.numpy as jnp, treemod as tm\n"
        "from jaxtyping import Array, Float\n"
        "class V(tm.Module):\n"
        "    x: Float[Array, '2']\n"
        "V(jnp.ones(3))\n"
        "print(tm.shape_checks_enabled())\n"
    )
    env = {"TREEMOD_SHAPE_CHECKS": "0", "JAX_PLATFORMS": "cpu", "PATH": ""}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------- costs


def test_unannotated_modules_pay_nothing():
    assert module_info(Plain).field_spec in (None, ())
    Plain(jnp.ones(2))
    assert module_info(Plain).field_spec == ()
    assert checked_call_state(Plain.__call__) is None  # not wrapped
    assert checked_call_state(Linear.__call__) is not None


def test_checks_run_only_while_tracing(monkeypatch):
    calls = []
    original = _shapecheck._check

    def counting(*args: Any) -> None:
        calls.append(args[3])  # who: the field or argument checked
        return original(*args)

    monkeypatch.setattr(_shapecheck, "_check", counting)
    step = jax.jit(lambda m, x: m(x))
    layer = lin(2, 3)
    spec = checked_call_state(Linear.__call__)[0]
    if spec:  # forget signatures that passed in earlier tests (the per-signature cache)
        spec.passed.clear()
    calls.clear()
    step(layer, jnp.ones(3))
    traced = len(calls)
    assert traced == 4  # weight, bias, x, return value
    for _ in range(3):
        step(layer, jnp.ones(3))
    assert len(calls) == traced  # compiled calls run no Python checks


# ---------------------------------------------------------------------------- laws


@settings(max_examples=30, deadline=None)
@given(
    out=st.integers(1, 5),
    inp=st.integers(1, 5),
    bias=st.integers(1, 5),
    x=st.integers(1, 5),
)
def test_law_errors_iff_sizes_disagree(out, inp, bias, x):
    # Under eval_shape (tracers, nothing compiles); the reference is "sizes equal".
    def build():
        return Linear(jnp.ones((out, inp)), jnp.zeros(bias))

    if bias != out:
        with pytest.raises(tm.ShapeCheckError, match=rf"with out={out} "):
            jax.eval_shape(build)
        return
    if x != inp:
        with pytest.raises(tm.ShapeCheckError, match=rf"with in={inp} "):
            jax.eval_shape(lambda: build()(jnp.ones(x)))
    else:
        assert jax.eval_shape(lambda: build()(jnp.ones(x))).shape == (out,)


@settings(max_examples=20, deadline=None)
@given(batch=st.lists(st.integers(0, 3), max_size=3), n=st.integers(1, 4))
def test_law_any_batch_shape_is_accepted(batch, n):
    def run():
        x = jnp.ones((*batch, n))
        return Batched(x, x)(x)

    assert jax.eval_shape(run).shape == tuple(batch)


def test_checks_run_only_while_tracing_under_filter_jit(monkeypatch):
    filter_jit = tm.filter_jit
    calls = []
    original = _shapecheck._check

    def counting(*args: Any) -> None:
        calls.append(args[3])  # who: the field or argument checked
        return original(*args)

    monkeypatch.setattr(_shapecheck, "_check", counting)
    step = filter_jit(lambda m, x: m(x))
    layer = lin(2, 3)
    spec = checked_call_state(Linear.__call__)[0]
    if spec:  # forget signatures that passed in earlier tests (the per-signature cache)
        spec.passed.clear()
    calls.clear()
    step(layer, jnp.ones(3))
    assert len(calls) == 4
    step(layer, jnp.ones(3))
    step(layer, jnp.ones(3))
    assert len(calls) == 4
    with pytest.raises(tm.ShapeCheckError, match=r"^Linear\.__call__ argument x"):
        step(layer, jnp.ones(5))  # a new shape retraces, and the check fires


def test_compiled_step_is_the_same_program_with_checks_on_and_off():
    def step(m, x):
        return jax.grad(lambda m: jnp.sum(m(x)))(m)

    texts = []
    for flag in (True, False):
        with tm.shape_checks(flag):
            texts.append(jax.jit(step).lower(lin(2, 3), jnp.ones(3)).as_text())
    assert texts[0] == texts[1]


def test_shapecheck_on_static_methods_and_callable_objects():
    class WithStatic(tm.Module):
        w: Float[Array, " n"]

        @staticmethod
        @tm.shapecheck
        def norm(x: Float[Array, " n"]) -> Float[Array, ""]:
            return jnp.sum(x * x)

    assert WithStatic.norm(jnp.ones(3)).shape == ()
    with pytest.raises(tm.ShapeCheckError, match=r"norm argument x: expected Float\[Array, 'n'\]"):
        WithStatic.norm(jnp.ones((2, 2)))

    class Doubler:
        def __call__(self, x):
            return 2.0 * x

    doubled = tm.shapecheck(Doubler())
    assert doubled(jnp.ones(2)).shape == (2,)


def test_custom_init_arguments_are_checked_through_fields_or_on_request():
    class FromWeight(tm.Module):
        weight: Float[Array, "n n"]

        def __init__(self, weight: Float[Array, "n n"], key: Float[Array, "2"]):
            self.weight = weight

    assert checked_call_state(FromWeight.__init__) is None  # not wrapped
    FromWeight(jnp.eye(2), None)  # `key` is not checked: __init__ validates its arguments
    with pytest.raises(tm.ShapeCheckError, match=r"^FromWeight\.weight: expected"):
        FromWeight(jnp.ones((2, 3)), None)  # ... and the field it sets is

    class Strict(tm.Module):
        weight: Float[Array, "n n"]

        @tm.shapecheck
        def __init__(self, weight: Float[Array, "n n"], key: Float[Array, "2"]):
            self.weight = weight

    Strict(jnp.eye(2), jnp.ones(2))
    with pytest.raises(tm.ShapeCheckError, match=r"^Strict\.__init__ argument key"):
        Strict(jnp.eye(2), None)
