"""tree_at's shape checks of rebuilt modules, the class option that turns them off below a
module (`check_descendants=False`, given by `nn.Stack`), and `is_module` and `module_info`, how
code below `treemod._module` reads a Module class."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from jaxtyping import Array, Float

import treemod as tm
import treemod.nn as nn
from treemod._tree.module_info import (
    check_descendants,
    is_module,
    is_module_class,
    module_info,
    static_field_names,
)


class Row(tm.Module):
    w: Float[Array, " n"]


class Holder(tm.Module):
    row: Row


class LayerAxisHolder(tm.Module, check_descendants=False):
    """Like nn.Stack: the arrays below carry an extra leading axis."""

    row: Row


def test_tree_at_checks_a_rebuilt_module_below_an_ordinary_one(shape_checks_on: None) -> None:
    holder = Holder(Row(jnp.zeros(3)))
    with pytest.raises(tm.ShapeCheckError, match=r"Row\.w: expected Float\[Array, 'n'\]"):
        tm.tree_at(lambda h: h.row.w, holder, jnp.zeros((2, 3)))


def test_the_hook_turns_off_checks_of_descendants_only(shape_checks_on: None) -> None:
    holder = LayerAxisHolder(Row(jnp.zeros(3)))
    new = tm.tree_at(lambda h: h.row.w, holder, jnp.zeros((2, 3)))  # one row per layer
    assert new.row.w.shape == (2, 3)
    assert check_descendants(holder) is False
    assert check_descendants(Holder(Row(jnp.zeros(3)))) is True
    assert check_descendants({"a": 1}) is True  # not a module: checks as usual


def test_stack_uses_the_hook(shape_checks_on: None) -> None:
    stack = nn.Stack(lambda k: nn.Linear(4, 4, key=k), 3, key=jax.random.key(0))
    assert check_descendants(stack) is False
    new = tm.tree_at(lambda s: s.layers.bias, stack, jnp.ones((3, 4)))
    assert jnp.array_equal(new[1].bias, jnp.ones(4))
    with pytest.raises(tm.ShapeCheckError, match=r"Linear\.bias"):
        tm.tree_at(lambda layer: layer.bias, stack[0], jnp.ones((3, 4)))  # one layer: checked


@dataclasses.dataclass
class PlainDataclass:
    x: int


@pytest.mark.parametrize(
    "value",
    [Row(jnp.zeros(2)), nn.Linear(2, 2, key=jax.random.key(0)), tm.Partial(jnp.add, 1.0)],
)
def test_is_module_agrees_with_isinstance_for_modules(value: object) -> None:
    assert isinstance(value, tm.Module)
    assert is_module(value)
    assert is_module_class(type(value))
    assert not is_module(type(value))  # the class itself is not an instance


@pytest.mark.parametrize(
    "value", [PlainDataclass(1), {"w": jnp.zeros(2)}, [1], jnp.zeros(2), None, Row, tm.Module]
)
def test_is_module_is_false_for_everything_else(value: object) -> None:
    assert is_module(value) == isinstance(value, tm.Module)
    assert not is_module(value)


def test_static_field_names() -> None:
    class Config(tm.Module):
        w: jax.Array
        size: int = tm.field(static=True)
        act: object = tm.field(static=True, default=None)

    assert static_field_names(Config) == ("size", "act")
    assert static_field_names(PlainDataclass) == ()
    assert is_module_class(Config) and not is_module_class(PlainDataclass)


def test_class_options_are_inherited_from_the_class_that_gave_them() -> None:
    class Child(LayerAxisHolder):  # gives no option: LayerAxisHolder's
        pass

    class Checked(LayerAxisHolder, check_descendants=True):
        pass

    class Diamond(Holder, Child):  # Holder gave none; Child inherited LayerAxisHolder's
        pass

    class Top(tm.Module, check_descendants=False):
        pass

    class Left(Top):
        pass

    class Right(Top, check_descendants=True):
        pass

    class Bottom(Left, Right):  # the MRO is Bottom, Left, Right, Top: Right gave it first
        pass

    assert module_info(Left).check_descendants is False
    assert module_info(Bottom).check_descendants is True
    assert module_info(Child).check_descendants is False
    assert module_info(Checked).check_descendants is True
    assert module_info(Diamond).check_descendants is False  # as attribute lookup would find
    assert module_info(Holder).check_descendants is True
    assert module_info(tm.State).holds_state and not module_info(Holder).holds_state


def test_class_options_refuse_non_booleans() -> None:
    with pytest.raises(
        TypeError, match=r"class .*Bad: the class option `check_descendants=` takes"
    ):

        class Bad(tm.Module, check_descendants="no"):  # type: ignore[call-arg]
            x: int


def test_module_info_records_the_fields() -> None:
    def positive(x: float) -> float:
        return abs(x)

    class Config(tm.Module):
        w: jax.Array
        size: int = tm.field(static=True)
        scale: float = tm.field(converter=positive, default=1.0)
        cache: int = tm.field(init=False, default=0)

        def __check_init__(self) -> None:
            pass

    info = module_info(Config)
    assert [f.name for f in info.fields] == ["w", "size", "scale", "cache"]
    assert info.field_names == {"w", "size", "scale", "cache"}
    assert info.static_fields == ("size",) and info.init_false_fields == ("cache",)
    assert info.converters == (("scale", positive),)
    assert info.check_inits == (Config.__check_init__,)
    assert not info.custom_init and not info.abstract_vars
    with pytest.raises(TypeError, match="PlainDataclass.* is not a treemod.Module class"):
        module_info(PlainDataclass)
