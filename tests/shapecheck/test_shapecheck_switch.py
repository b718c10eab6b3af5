"""The shape-check switch: globally, in a block, per thread, per class and from the environment."""

from typing import Any

import jax.numpy as jnp
import pytest
from jaxtyping import Array, Float
from shapecheck_modules import (
    Always,
    Linear,
    Never,
    lin,
    off,
)

import treemod as tm

pytestmark = pytest.mark.usefixtures("shape_checks_on")  # tests/conftest.py


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
        off(lambda: Always(jnp.ones(5)))

    @tm.shapecheck
    class Decorated(tm.Module):
        x: Float[Array, "2"]

    with pytest.raises(tm.ShapeCheckError, match=r"Decorated\.x"):
        off(lambda: Decorated(jnp.ones(3)))


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
