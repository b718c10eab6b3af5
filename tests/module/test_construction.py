"""treemod.Module's construction checks: each error and warning names the class and field."""

import abc
import warnings
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import pytest

import treemod as tm

_T = TypeVar("_T")


def test_storing_a_method_of_the_module_being_built_names_the_field() -> None:
    class Loop(tm.Module):
        fn: Callable[[], int]

        def __init__(self) -> None:
            self.fn = self.value

        def value(self) -> int:
            return 1

    with pytest.raises(ValueError, match=r"Loop\.fn is set to the bound method value .*property"):
        Loop()


def test_a_method_of_another_module_may_be_stored() -> None:
    class Source(tm.Module):
        k: int

        def times(self, x: int) -> int:
            return self.k * x

    class Holder(tm.Module):
        fn: Callable[[int], int]

    assert Holder(Source(3).times).fn(2) == 6


def test_field_overridden_at_class_level_and_set_in_init_is_refused() -> None:
    class Base(tm.Module):
        mode: str = "train"

    class Fixed(Base):
        mode = "eval"

        def __init__(self, mode: str) -> None:
            self.mode = mode

    class Plain(Base):
        mode = "eval"

        def __init__(self) -> None:
            pass

    class Generated(Base):  # its generated __init__ stores the field's default, as Equinox's
        mode = "eval"

    assert Plain().mode == "eval" and jtu.tree_leaves(Plain()) == []
    assert Generated().mode == "train" and jtu.tree_leaves(Generated()) == ["train"]
    with pytest.raises(TypeError, match=r"Fixed\.__init__ set 'mode', a field of a base class"):
        Fixed("train")


def test_abstract_property_over_a_field_is_provided_by_the_subclass() -> None:
    class Base(tm.Module):
        width: int = tm.field(static=True)

        @property
        @abc.abstractmethod
        def width(self) -> int: ...  # noqa: F811

    class Wide(Base):
        width = 8

        def __init__(self) -> None:
            pass

    wide = Wide()
    assert jax.jit(lambda m: jnp.zeros(m.width))(wide).shape == (8,)  # 8, as Python reads it


def test_transform_warning_names_class_and_field() -> None:
    class Scale(tm.Module):
        w: jax.Array

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.w * x

    class Holder(tm.Module):
        fn: Callable[..., Any]

    with pytest.warns(UserWarning, match=r"Holder\.fn holds a .* of a pytree with arrays"):
        Holder(jax.vmap(Scale(jnp.ones(2))))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Holder(tm.filter_vmap(Scale(jnp.ones(2))))  # a filtered transform is a pytree


def test_static_array_warning_names_class_and_field() -> None:
    class Config(tm.Module):
        table: Any = tm.field(static=True)

    with pytest.warns(UserWarning, match=r"Config\.table is a static field holding an array"):
        Config({"a": (jnp.ones(2),)})


def test_post_init_with_custom_init_warns_with_the_qualified_name() -> None:
    class Base(tm.Module):
        def __post_init__(self) -> None:
            raise AssertionError("never run")

    with pytest.warns(UserWarning, match=rf"{__name__}\..*\.Custom has a custom `__init__`"):

        class Custom(Base):
            def __init__(self) -> None:
                pass

    Custom()


def test_bad_abstract_declarations_name_the_attribute() -> None:
    with pytest.raises(TypeError, match=r"Bare\.x is annotated with an unsubscripted AbstractVar"):

        class Bare(tm.Module):
            x: tm.AbstractVar  # type: ignore[type-arg]

    with pytest.raises(TypeError, match=r"Valued\.x is declared abstract .* cannot have value"):

        class Valued(tm.Module):
            x: tm.AbstractClassVar[int] = 3


def test_field_metadata_keys_that_field_sets_are_refused() -> None:
    with pytest.raises(ValueError, match=r"key 'static'.*pass `static=` as an argument"):
        tm.field(metadata={"static": True})
    assert dict(tm.field(metadata={"unit": "m"}).metadata) == {"unit": "m"}


def test_generic_module_keeps_orig_class_and_stays_frozen() -> None:
    class Box(tm.Module, Generic[_T]):
        x: int = 0

    box = Box[int]()
    assert box.__orig_class__ == Box[int]
    with pytest.raises(tm.FrozenModuleError, match=r"Cannot set .*Box\.x"):
        box.x = 1


def test_mixin_init_is_hand_written_and_converters_run() -> None:
    class Mixin:
        def __init__(self, v: float) -> None:
            self.value = v + 1  # type: ignore[misc]

    class Converted(tm.Module):
        value: jax.Array = tm.field(converter=jnp.asarray)

    class Both(Mixin, Converted):
        pass

    both = Both(1.0)
    assert isinstance(both.value, jax.Array) and both.value.item() == 2.0
