"""Measured against Equinox: which construction paths catch a wrong shape (docs claim this)."""

import jax.numpy as jnp
import pytest
from jaxtyping import Array, Float, jaxtyped
from typeguard import typechecked

import treemod as tm

eqx = pytest.importorskip("equinox", reason="Equinox is not installed (the bench extra)")


@jaxtyped(typechecker=typechecked)
class EqxLinear(eqx.Module):
    weight: Float[Array, "out in"]
    bias: Float[Array, " out"]


@jaxtyped(typechecker=typechecked)
class EqxCustom(eqx.Module):
    weight: Float[Array, "n n"]

    def __init__(self, n: int, m: int):
        self.weight = jnp.zeros((n, m))


@jaxtyped(typechecker=typechecked)
class EqxConverted(eqx.Module):
    x: Float[Array, "3"] = eqx.field(converter=lambda v: jnp.asarray(v, jnp.float32))


class TmLinear(tm.Module):
    weight: Float[Array, "out in"]
    bias: Float[Array, " out"]


class TmCustom(tm.Module):
    weight: Float[Array, "n n"]

    def __init__(self, n: int, m: int):
        self.weight = jnp.zeros((n, m))


class TmConverted(tm.Module):
    x: Float[Array, "3"] = tm.field(converter=lambda v: jnp.asarray(v, jnp.float32))


pytestmark = pytest.mark.usefixtures("shape_checks_on")  # tests/conftest.py


def _caught(build) -> bool:
    try:
        build()
    except TypeError:  # jaxtyping's TypeCheckError and treemod's ShapeCheckError
        return True
    return False


def test_equinox_checks_only_generated_init_arguments_treemod_checks_every_path():
    eqx_layer = EqxLinear(jnp.ones((2, 3)), jnp.zeros(2))
    tm_layer = TmLinear(jnp.ones((2, 3)), jnp.zeros(2))
    equinox = {
        "generated __init__": _caught(lambda: EqxLinear(jnp.ones((2, 3)), jnp.zeros(5))),
        "custom __init__": _caught(lambda: EqxCustom(2, 3)),
        "converter": _caught(lambda: EqxConverted([1.0, 2.0])),
        "tree_at": _caught(lambda: eqx.tree_at(lambda m: m.bias, eqx_layer, jnp.zeros(5))),
    }
    treemod = {
        "generated __init__": _caught(lambda: TmLinear(jnp.ones((2, 3)), jnp.zeros(5))),
        "custom __init__": _caught(lambda: TmCustom(2, 3)),
        "converter": _caught(lambda: TmConverted([1.0, 2.0])),
        "tree_at": _caught(lambda: tm.tree_at(lambda m: m.bias, tm_layer, jnp.zeros(5))),
    }
    assert treemod == dict.fromkeys(treemod, True)
    assert equinox == {
        "generated __init__": True,
        "custom __init__": False,
        "converter": False,
        "tree_at": False,
    }
