"""eqx.Module's class options, mixin methods, wrappers and construction warnings, vs Equinox."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import pytest

import treemod as tm
import treemod.compat.equinox as teqx

eqx = pytest.importorskip("equinox")

LIBRARIES = [pytest.param(eqx, id="equinox"), pytest.param(teqx, id="compat")]


def _outcome(fn: Callable[[], Any]) -> Any:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result: Any = fn()
        except Exception as e:  # noqa: BLE001 - the outcome is the error's type
            result = type(e)
    return result, sorted({w.category.__name__ for w in caught})


@pytest.mark.parametrize(
    "options",
    [
        lambda lib: {"strict": True},
        lambda lib: {"strict": False},
        lambda lib: {"is_abstract": True},
        lambda lib: {"strict": lib.StrictConfig(force_abstact=True)},
        lambda lib: {"strict": lib.StrictConfig(force_abstact=False)},
        lambda lib: {"strict": lib.StrictConfig(allow_abstract_name=True)},
        lambda lib: {"is_abstract": True, "strict": True},
    ],
)
def test_class_options_as_in_equinox(options: Callable[[Any], dict[str, Any]]) -> None:
    def build(lib: Any) -> tuple[Any, ...]:
        class Base(lib.Module, **options(lib)):
            x: int

        class Sub(Base):
            pass

        base = _outcome(lambda: Base(1))[0]
        return (base if isinstance(base, type) else "built"), Sub(2).x

    assert build(teqx) == build(eqx)


def test_abstract_class_option_error_names_the_class() -> None:
    class Base(teqx.Module, is_abstract=True):
        x: int

    with pytest.raises(TypeError, match="abstract `equinox.Module` .*Base: it is declared"):
        Base(1)


class _Mixin:
    def total(self: Any) -> Any:
        return self.x.sum()

    def _private(self: Any) -> Any:
        return self.x


@pytest.mark.parametrize("lib", LIBRARIES)
def test_mixin_methods_are_pytrees(lib: Any) -> None:
    class Model(lib.Module, _Mixin):
        x: jax.Array

        def _private(self) -> Any:  # overrides the mixin's: this one is bound
            return 2 * self.x

    model = Model(jnp.arange(3.0))
    for method, expected in ((model.total, 3.0), (model._private, [0.0, 2.0, 4.0])):
        assert isinstance(method, lib.Module)
        assert jtu.tree_leaves(method) == jtu.tree_leaves(model)
        assert jnp.array_equal(jax.jit(lambda m: m())(method), jnp.asarray(expected))


def test_module_update_wrapper_as_in_equinox() -> None:
    def fn(x: int) -> int:
        """Doc."""
        return x

    def wrap(lib: Any) -> tuple[Any, ...]:
        class Wrapper(lib.Module):
            inner: Any

            def __call__(self, x: Any) -> Any:
                return self.inner(x)

            @property
            def __wrapped__(self) -> Any:
                return self.inner

        original = Wrapper(fn)
        w = lib.module_update_wrapper(original)
        names = (w.__name__, w.__qualname__, w.__doc__, w.__module__, w.__annotations__)
        return names, w(3), w is not original, "__name__" not in vars(original)

    assert wrap(teqx) == wrap(eqx)


@pytest.mark.parametrize("lib", LIBRARIES)
def test_module_update_wrapper_needs_a_wrapped_property(lib: Any) -> None:
    class NotWrapper(lib.Module):
        inner: Any

    with pytest.raises(ValueError, match="__wrapped__"):
        lib.module_update_wrapper(NotWrapper(len))
    if lib is teqx:
        with pytest.raises(ValueError, match="NotWrapper must define `__wrapped__`"):
            lib.module_update_wrapper(NotWrapper(len))


@pytest.mark.parametrize("lib", [*LIBRARIES, pytest.param(tm, id="treemod")])
def test_init_may_set_wrapper_names_but_no_other_attribute(lib: Any) -> None:
    class Named(lib.Module):
        x: int

        def __init__(self, name: str) -> None:
            self.x = 1
            self.__name__ = name
            self.__doc__ = "doc"

    class Stray(lib.Module):
        x: int

        def __init__(self) -> None:
            self.x = 1
            self.y = 2

    named = Named("n")
    assert (named.__name__, named.__doc__) == ("n", "doc")
    with pytest.raises(dataclasses.FrozenInstanceError) as e:
        Stray()
    if lib is not eqx:
        assert "Stray has no field 'y'" in str(e.value)


@pytest.mark.parametrize(
    ("default", "post_init"),
    [(None, lambda a: 2 * a), (None, lambda a: 2), (1.5, None), ("s", None), (None, jnp.arange)],
)
def test_init_false_field_warning_as_in_equinox(default: Any, post_init: Any) -> None:
    def build(lib: Any) -> Any:
        kwargs = {} if default is None else {"default": default}

        class Derived(lib.Module):
            a: Any
            derived: Any = lib.field(init=False, **kwargs)

            def __post_init__(self) -> None:
                if post_init is not None:
                    self.derived = post_init(self.a)

        return _outcome(lambda: Derived(jnp.array(3.0)))[1]

    assert build(teqx) == build(eqx) == build(tm)


def test_init_false_field_warning_names_the_field() -> None:
    class Derived(tm.Module):
        a: jax.Array
        length: jax.Array = tm.field(init=False)

        def __post_init__(self) -> None:
            self.length = jnp.abs(self.a)

    with pytest.warns(UserWarning, match=r"Derived\.length is a `field\(init=False\)`"):
        Derived(jnp.array(-1.0))


def test_module_equality_gives_equinox_result_types() -> None:
    def compare(lib: Any) -> tuple[type, ...]:
        class Box(lib.Module):
            x: Any

        return tuple(
            type(Box(a) == Box(b)) for a, b in ((jnp.ones(2), jnp.ones(2)), (1, 1), (1, 2))
        )

    assert compare(teqx) == compare(eqx)
    assert hash(teqx.Partial(len)) == hash(teqx.Partial(len))


@pytest.mark.parametrize("lib", [*LIBRARIES, pytest.param(tm, id="treemod")])
def test_custom_init_is_inherited_by_subclasses_that_add_fields(lib: Any) -> None:
    class Parent(lib.Module):
        x: int

        def __init__(self, v: int) -> None:
            self.x = 10 * v

    class WithDefault(Parent):
        y: int = 5

    class WithRequired(Parent):
        y: int

    built = WithDefault(1)
    assert (built.x, built.y) == (10, 5)  # Parent.__init__ ran; `y` took its default
    with pytest.raises(TypeError):
        WithDefault(1, 2)
    with pytest.raises(TypeError, match="'y' was not initialized"):
        WithRequired(1)


def test_bound_methods_print_as_in_equinox() -> None:
    def printed(lib: Any) -> tuple[str, ...]:
        class Scale(lib.Module):
            w: jax.Array

            def apply(self, x: Any) -> Any:
                return self.w * x

        bound = Scale(jnp.ones(2)).apply
        grads = lib.filter_grad(lambda fn: fn(2.0).sum())(bound)
        return lib.tree_pformat(bound), lib.tree_pformat(grads, width=20), repr(bound)

    ours, theirs = printed(teqx), printed(eqx)
    assert ours[:2] == theirs[:2]
    assert ours[2].startswith("BoundMethod(__func__=<function ") and "apply>, __self__=" in ours[2]


def test_transform_wrappers_are_modules_as_in_equinox() -> None:
    def kinds(lib: Any) -> list[bool]:
        def f(x: Any) -> Any:
            return x

        wrappers = [
            lib.filter_jit(f),
            lib.filter_grad(f),
            lib.filter_value_and_grad(f),
            lib.filter_vmap(f),
            lib.filter_checkpoint(f),
            lib.filter_jacfwd(f),
            lib.filter_jacrev(f),
            lib.filter_hessian(f),
            lib.filter_custom_jvp(f),
            lib.filter_custom_vjp(f),
            lib.Partial(f),
            f,
        ]
        return [isinstance(w, lib.Module) for w in wrappers]

    assert kinds(teqx) == kinds(eqx)
