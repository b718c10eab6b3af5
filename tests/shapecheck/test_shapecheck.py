"""Shape checks: construction paths, calls, jit/vmap/scan, messages, variadic/broadcast dims."""

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from shapecheck_modules import (
    Always,
    BadReturn,
    Batched,
    Converted,
    CustomInit,
    Indices,
    Linear,
    OptionalBias,
    Outer,
    Pair,
    Scaled,
    Treeish,
    lin,
    off,
    same_size,
    wrong_out,
)

import treemod as tm

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
        lambda: off(lambda: Always(jnp.ones(3))),
        r"^Always\.x: expected Float\[Array, '2'\], got f32\[3\]",
    ),
    (
        "@shapecheck turns checks on for the code it calls",
        lambda: off(lambda: tm.shapecheck(lambda: lin(2, 3)(jnp.ones(4)))()),
        r"^Linear\.__call__ argument x: expected Float\[Array, 'in'\] with in=3",
    ),
]


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
