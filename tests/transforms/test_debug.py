"""treemod.debug: backward_nan, breakpoint_if, store_dce/inspect_dce, and the trace counter."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

import treemod as tm

from fresh_interpreter import run_printing


def test_debug_exports_only_its_helpers() -> None:
    public = {n for n in vars(tm.debug) if not n.startswith(("_", "@"))}  # "@": pytest's
    assert public == set(tm.debug.__all__)


def test_backward_nan_prints_the_cotangent_and_passes_it_through(
    capfd: pytest.CaptureFixture[str],
) -> None:
    def f(x: jax.Array) -> jax.Array:
        return jnp.sum(jnp.sqrt(tm.debug.backward_nan(x, name="x", terminate=False)))

    x = jnp.array([4.0, 0.0])
    capfd.readouterr()
    grad = jax.jit(jax.grad(f))(x)
    jax.effects_barrier()
    out, _ = capfd.readouterr()
    # d sqrt(x)/dx = 1/(2 sqrt x): 0.25 and inf, the same as without the helper.
    np.testing.assert_array_equal(grad, jax.grad(lambda x: jnp.sum(jnp.sqrt(x)))(x))
    assert out.startswith("x:\n   primals=Array([4., 0.], dtype=float32)\ncotangents=")
    assert "0.25" in out and "inf" in out


def test_backward_nan_terminates_on_a_nan_cotangent() -> None:
    def f(x: jax.Array) -> jax.Array:
        return jnp.sum(jnp.sqrt(tm.debug.backward_nan(x)))

    jax.grad(f)(jnp.array([1.0]))  # finite: no error
    with pytest.raises(RuntimeError, match="Encountered NaN"):
        jax.block_until_ready(jax.jit(jax.grad(f))(jnp.array([-1.0])))


def test_backward_nan_keeps_non_array_leaves() -> None:
    tree = {"w": jnp.ones(2), "name": "layer"}
    assert tm.debug.backward_nan(tree, terminate=False)["name"] == "layer"


_BREAKPOINT_JAXPR = """
import jax, jax.numpy as jnp, treemod as tm
print(jax.make_jaxpr(jax.vmap(lambda x: tm.debug.breakpoint_if(x < 0)))(jnp.arange(3.0)))
"""


@pytest.mark.heavy
def test_breakpoint_if_stays_a_branch_under_vmap() -> None:
    text = run_printing(_BREAKPOINT_JAXPR)  # traced in a fresh interpreter: see its docstring
    assert "cond[" in text and "select" not in text  # debugger only when pred holds
    with pytest.raises(TypeError, match="breakpoint_if: `pred` must be a boolean array"):
        tm.debug.breakpoint_if(jnp.ones(2))


_BREAKPOINT_IF_DOCTEST = """
import doctest, treemod.debug
flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
runner = doctest.DocTestRunner(optionflags=flags)
for test in doctest.DocTestFinder().find(treemod.debug.breakpoint_if, "breakpoint_if"):
    runner.run(test)
print(runner.failures, runner.tries)
"""


@pytest.mark.heavy
def test_breakpoint_if_docstring_example() -> None:
    """The example in `breakpoint_if`'s docstring, which the doctest run leaves out (see the
    root conftest.py), run by doctest in a fresh interpreter."""
    failures, tries = map(int, run_printing(_BREAKPOINT_IF_DOCTEST).split()[-2:])
    assert (failures, tries) == (0, 3)


def test_store_dce_shows_what_was_eliminated(capfd: pytest.CaptureFixture[str]) -> None:
    @jax.jit
    def f(x: jax.Array) -> jax.Array:
        used, _, _ = tm.debug.store_dce((x**2, x + 1, "label"), name="test_store_dce")
        return used

    assert f(3) == 9
    capfd.readouterr()
    tm.debug.inspect_dce("test_store_dce")
    out, _ = capfd.readouterr()
    assert out == "Found 1 call to `store_dce`.\nEntry 0:\n(i32[], <DCE'd>, 'label')\n"


def test_store_dce_and_inspect_dce_say_where_they_belong() -> None:
    with pytest.raises(RuntimeError, match="store_dce must be called inside a compiled"):
        tm.debug.store_dce(jnp.ones(2))

    @jax.jit
    def f(x: jax.Array) -> jax.Array:
        tm.debug.inspect_dce()
        return x

    with pytest.raises(RuntimeError, match="inspect_dce must be called outside compiled"):
        f(jnp.ones(2))


class _Scale(tm.Module):
    w: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.w * x


def test_assert_max_traces_is_a_pytree_sharing_its_count() -> None:
    counted = tm.debug.assert_max_traces(_Scale(jnp.ones(2)), max_traces=1)
    assert len(jtu.tree_leaves(counted)) == 1  # the module's array stays a leaf
    leaves, treedef = jtu.tree_flatten(counted)
    clone = jtu.tree_unflatten(treedef, leaves)
    f = tm.filter_jit(lambda m, x: m(x))
    f(counted, jnp.ones(2))
    assert tm.debug.get_num_traces(clone) == 1
    with pytest.raises(RuntimeError, match="can only be traced 1 times"):
        f(clone, jnp.ones(3))


def test_assert_max_traces_under_jax_jit() -> None:
    @jax.jit
    @tm.debug.assert_max_traces(max_traces=1)
    def f(x: jax.Array) -> jax.Array:
        return x + 1

    f(1)
    f(2)
    with pytest.raises(RuntimeError, match="can only be traced 1 times"):
        f(3.0)


def test_get_num_traces_looks_through_wrappers() -> None:
    counted = tm.debug.assert_max_traces(lambda x: x, max_traces=None)
    jitted = tm.filter_jit(counted)
    jitted(jnp.ones(1))
    jitted(jnp.ones(2))
    # assert_max_traces returns a module; other tests' modules of its class hold other
    # functions in their static fields, so their traces are counted apart from these two.
    assert tm.debug.get_num_traces(jitted) == 2
    assert tm.debug.get_num_traces(counted) == 2
    with pytest.raises(ValueError, match="neither a filter_jit function"):
        tm.debug.get_num_traces(print)
