"""Private JAX and jaxtyping APIs are used through `treemod/_private_apis.py` only, and each one
there still does what treemod relies on (checked against public JAX), so an upgrade of JAX or
jaxtyping that moves or changes one fails here, naming it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from treemod import _private_apis as private

PACKAGE = Path(__file__).resolve().parents[2] / "treemod"
PRIVATE_MODULES = ("jax._src", "jaxtyping._storage")


def _private_imports(path: Path) -> list[str]:
    """`jax._src...` / `jaxtyping._storage` imports anywhere in `path`, and logger names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value] if node.value.startswith(PRIVATE_MODULES) else []
        found += [f"line {node.lineno}: {n}" for n in names if n.startswith(PRIVATE_MODULES)]
    return found


def test_only_the_private_apis_module_imports_private_apis() -> None:
    users = {
        path.relative_to(PACKAGE).as_posix(): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "_private_apis.py" and (found := _private_imports(path))
    }
    assert users == {}


@pytest.mark.parametrize("name", private.__all__)
def test_every_name_resolves_in_the_installed_libraries(name: str) -> None:
    assert getattr(private, name) is not None


@pytest.mark.heavy
def test_the_jaxtyping_names_are_loaded_at_their_first_use_not_at_import() -> None:
    code = (
        "import sys, treemod._private_apis as p\n"
        "assert 'jaxtyping' not in sys.modules, 'imported jaxtyping'\n"
        "from jaxtyping import _storage\n"
        "assert p.get_shape_memo is _storage.get_shape_memo\n"
        "assert p.push_shape_memo is _storage.push_shape_memo\n"
        "assert p.pop_shape_memo is _storage.pop_shape_memo\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_trace_state_clean_is_false_under_any_transform() -> None:
    seen = []

    def probe(x: jax.Array) -> jax.Array:
        seen.append(private.trace_state_clean())
        return x

    assert private.trace_state_clean()
    jax.jit(probe)(1.0)
    jax.vmap(probe)(jnp.ones(2))
    jax.grad(probe)(1.0)
    jax.eval_shape(probe, jnp.ones(3))  # a new shape: the trace above is not reused
    assert seen == [False] * 4


def test_convert_element_type_makes_an_array_weakly_typed_as_a_python_scalar_is() -> None:
    out = private.convert_element_type(jnp.asarray(2.0, jnp.float32), weak_type=True)
    reference = jnp.asarray(2.0)  # a Python float: weakly typed (public JAX)
    assert out.weak_type and reference.weak_type and out.dtype == reference.dtype
    assert (out + jnp.ones(2, jnp.bfloat16)).dtype == jnp.bfloat16  # promotes as a weak scalar


def test_opaque_trace_state_tells_traces_apart() -> None:
    outside = private.opaque_trace_state()
    inside = []
    jax.jit(lambda x: inside.append(private.opaque_trace_state()) or x)(1.0)
    assert outside is not None and inside[0] is not None
    assert outside == private.opaque_trace_state() and inside[0] != outside


def test_find_top_trace_names_the_innermost_transform() -> None:
    found = []

    def f(x: jax.Array) -> jax.Array:
        found.append(private.find_top_trace([x]))
        return x

    jax.jvp(f, (1.0,), (1.0,))
    assert type(found[0]).__name__ == "JVPTrace"


@pytest.mark.parametrize("name", ["ClosedJaxpr", "Literal", "Primitive", "find_top_trace"])
def test_each_name_jax_extend_core_exports_is_the_public_object(name: str) -> None:
    # Imported from jax._src for import time; `jax.extend.core` is the public home on every
    # supported version (JAX 0.12's `ClosedJaxpr` is its merged `Jaxpr`).
    import jax.extend.core

    assert getattr(private, name) is getattr(jax.extend.core, name)


def test_eval_jaxpr_runs_a_traced_program_with_other_constants() -> None:
    w = jnp.array([1.0, 2.0])
    closed = jax.make_jaxpr(lambda x: jnp.sin(x) * w)(1.0)  # public: a ClosedJaxpr
    assert isinstance(closed, private.ClosedJaxpr)
    assert [np.asarray(c).tolist() for c in closed.consts] == [[1.0, 2.0]]
    (out,) = private.eval_jaxpr(closed.jaxpr, [jnp.array([3.0, 4.0])], 0.5)
    np.testing.assert_allclose(out, np.sin(0.5) * np.array([3.0, 4.0]), rtol=1e-6)


def test_called_program_finds_a_nested_jit_its_program_and_its_name() -> None:
    def named_inner(x: jax.Array) -> jax.Array:
        return jnp.cos(x) + 1

    inner = jax.jit(named_inner)
    closed = jax.make_jaxpr(lambda x: inner(x) * inner(2 * x) + jnp.sin(x))(1.0)
    calls = [private.called_program(e) for e in closed.jaxpr.eqns]
    found = [c for c in calls if c is not None]
    assert len(found) == 2 and sum(c is None for c in calls) == len(calls) - 2
    (program_a, name_a), (program_b, name_b) = found
    assert program_a is program_b and name_a == name_b == "named_inner"
    assert isinstance(program_a, private.ClosedJaxpr)
    assert [e.primitive.name for e in program_a.jaxpr.eqns] == ["cos", "add"]
    assert {e.primitive.name for e in closed.jaxpr.eqns} & set(private.CALL_PRIMITIVES)


def test_sub_jaxprs_finds_callees_loop_bodies_and_branches() -> None:
    def f(x: jax.Array) -> jax.Array:
        y = jax.jit(jnp.tanh)(x)
        y = jax.lax.cond(x > 0, jnp.sin, jnp.cos, y)
        return jax.lax.scan(lambda c, _: (jnp.exp(c), None), y, length=2)[0]

    closed = jax.make_jaxpr(f)(1.0)
    inner = {
        e.primitive.name: [
            sorted(q.primitive.name for q in sub.eqns) for sub in private.sub_jaxprs(e.params)
        ]
        for e in closed.jaxpr.eqns
        if list(private.sub_jaxprs(e.params))
    }
    assert inner == {
        next(n for n in private.CALL_PRIMITIVES if n in inner): [["tanh"]],
        "cond": [["cos"], ["sin"]],
        "scan": [["exp"]],
    }


def test_primitive_binds_with_an_implementation() -> None:
    double = private.Primitive("treemod_test_double")
    double.def_impl(lambda x: x * 2)
    np.testing.assert_allclose(double.bind(jnp.ones(2)), [2.0, 2.0])


def test_the_debug_callback_logger_is_the_one_that_logs_failed_callbacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def fail(x: object) -> None:
        raise ValueError("boom")

    with caplog.at_level("ERROR", logger=private.DEBUG_CALLBACK_LOGGER):
        try:
            jax.debug.callback(fail, jnp.ones(()))
            jax.effects_barrier()
        except Exception:
            pass
    assert any(r.name == private.DEBUG_CALLBACK_LOGGER for r in caplog.records), caplog.records


def test_reset_compilation_cache_forgets_the_opened_cache() -> None:
    from jax._src import compilation_cache

    private.reset_compilation_cache()
    # Reset: no cache object and nothing checked, so the next compilation reads the settings.
    assert compilation_cache._cache is None and not compilation_cache._cache_checked
