"""The compat `Module` core against real Equinox: each test builds the same classes with
`equinox.Module` and with `treemod.compat.equinox.Module` and compares what they do."""

import abc
import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import InitVar
from types import ModuleType
from typing import Any, ClassVar, Generic, TypeVar

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import pytest
from hypothesis import given
from hypothesis import strategies as st

import treemod.compat.equinox as teqx

eqx = pytest.importorskip("equinox")

LIBS = pytest.mark.parametrize("lib", [eqx, teqx], ids=["equinox", "treemod"])
_T = TypeVar("_T")


def _outcome(build: Callable[[], Any]) -> Any:
    """The value `build` returns, or the type of the exception it raises."""
    try:
        return build()
    except Exception as e:  # the type is what both libraries must agree on
        return type(e)


def _both(run: Callable[[ModuleType], Any]) -> tuple[Any, Any]:
    """`run`'s outcome with real Equinox, then with the compat namespace."""
    return _outcome(lambda: run(eqx)), _outcome(lambda: run(teqx))


# --- fields that __init__ leaves unset ---------------------------------------------------------


def test_unset_field_is_a_type_error_in_both() -> None:
    def run(lib: ModuleType) -> Any:
        class Pair(lib.Module):
            a: int
            b: int

            def __init__(self) -> None:
                self.a = 1

        return Pair()

    assert _both(run) == (TypeError, TypeError)
    with pytest.raises(TypeError, match=r"Field 'b' was not initialized: .*Pair\.__init__"):
        run(teqx)


@pytest.mark.parametrize("flag", [True, False])
def test_init_false_field_set_by_post_init(flag: bool) -> None:
    def run(lib: ModuleType) -> Any:
        class Flagged(lib.Module):
            n: int = lib.field(init=False)
            flag: InitVar[bool]

            def __post_init__(self, flag: bool) -> None:
                if flag:
                    self.n = 7

        return jtu.tree_leaves(Flagged(flag=flag))

    assert _both(run) == (([7], [7]) if flag else (TypeError, TypeError))


@pytest.mark.parametrize("make_field", [dataclasses.field, "lib"])
def test_field_overridden_by_a_property_is_not_a_leaf(make_field: Any) -> None:
    def run(lib: ModuleType) -> Any:
        fld = lib.field if make_field == "lib" else make_field

        class Base(lib.Module):
            size: int = fld(init=False)
            scale: float = 2.0

        class Sized(Base):
            @property
            def size(self) -> int:
                return 5

        leaves, treedef = jtu.tree_flatten(Sized())
        rebuilt = jtu.tree_unflatten(treedef, leaves)
        return leaves, rebuilt.size, rebuilt.scale

    theirs, ours = _both(run)
    assert ours == theirs == ([2.0], 5, 2.0)


def test_static_field_replaced_by_class_attribute_under_jit() -> None:
    def run(lib: ModuleType) -> Any:
        class Base(lib.Module):
            names: list[str] = lib.field(static=True)

            @property
            @abc.abstractmethod
            def names(self) -> list[str]: ...  # noqa: F811

        class Named(Base):
            names = ["p", "q", "r"]

            def __init__(self) -> None:
                pass

        model = Named()
        return jax.jit(lambda m: jnp.asarray(len(m.names)))(model).item(), jtu.tree_leaves(model)

    assert _both(run) == ((3, []), (3, []))


def test_class_attribute_over_a_field_with_and_without_generated_init() -> None:
    def run(lib: ModuleType) -> Any:
        class Base(lib.Module):
            mode: str = "train"

        class Generated(Base):
            mode = "eval"

        class Custom(Base):
            mode = "eval"

            def __init__(self) -> None:
                pass

        return [(m.mode, jtu.tree_leaves(m)) for m in (Generated(), Generated("x"), Custom())]

    theirs, ours = _both(run)
    assert ours == theirs == [("train", ["train"]), ("x", ["x"]), ("eval", [])]


def test_slotted_field_constructs_in_both() -> None:
    def run(lib: ModuleType) -> Any:
        class Slotted(lib.Module):
            __slots__ = ("x",)
            x: int

            def __init__(self) -> None:
                self.x = 3

        return jtu.tree_leaves(Slotted()), Slotted().x

    theirs, ours = _both(run)
    assert ours == theirs


# --- what __init__ may store --------------------------------------------------------------------


def test_storing_own_method_is_refused_in_both() -> None:
    def direct(lib: ModuleType) -> Any:
        class Direct(lib.Module):
            fn: Callable[[], Any]
            x: int

            def __init__(self) -> None:
                self.fn = self.get
                self.x = 1

            def get(self) -> int:
                return self.x

        return Direct()

    def through_super(lib: ModuleType) -> Any:
        class Holder(lib.Module):
            fn: Callable[[int], int]

            def __init__(self, fn: Callable[[int], int]) -> None:
                self.fn = fn

        class Sub(Holder):
            k: int

            def __init__(self) -> None:
                self.k = 2
                super().__init__(self.times)

            def times(self, x: int) -> int:
                return self.k * x

        return Sub()

    assert _both(direct) == (ValueError, ValueError)
    assert _both(through_super) == (ValueError, ValueError)
    with pytest.raises(ValueError, match=r"Cannot assign methods in __init__: .*Direct\.fn"):
        direct(teqx)


def test_jax_transform_of_a_pytree_warns_in_both() -> None:
    for lib in (eqx, teqx):

        class Scale(lib.Module):
            w: jax.Array

            def __call__(self, x: jax.Array) -> jax.Array:
                return self.w * x

        class Generated(lib.Module):
            fn: Callable[..., Any]

        class Custom(lib.Module):
            fn: Callable[..., Any]

            def __init__(self, fn: Callable[..., Any]) -> None:
                self.fn = fn

        for cls in (Generated, Custom):
            for transform in (jax.jit, jax.vmap, jax.grad):
                with pytest.warns(UserWarning, match="JAX-transformed callable"):
                    cls(transform(Scale(jnp.ones(2))))
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                cls(jax.jit(jnp.sin))  # a transform of a plain function is fine


def test_array_in_static_field_warns_in_both() -> None:
    for lib in (eqx, teqx):

        class Config(lib.Module):
            sizes: tuple[Any, ...] = lib.field(static=True)

        for bad in ((jnp.ones(2),), jnp.ones(2), [1, {"a": jnp.zeros(())}]):
            with pytest.warns(UserWarning, match="A JAX array is being set as static"):
                Config(bad)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            Config((1, 2, "three"))


# --- __init__ and its inheritance ----------------------------------------------------------------


@pytest.mark.parametrize("base_is_module", [False, True])
def test_mixin_init_is_used_and_converters_run(base_is_module: bool) -> None:
    def run(lib: ModuleType) -> Any:
        calls = []

        class Mixin(lib.Module if base_is_module else object):  # type: ignore[misc]
            def __init__(self, v: Any) -> None:
                calls.append(v)
                self.value = v * 10

        class Converted(lib.Module):
            value: jax.Array = lib.field(converter=jnp.asarray)

        class MixinFirst(Mixin, Converted):
            pass

        class ConvertedFirst(Converted, Mixin):
            pass

        a, b = MixinFirst(1), ConvertedFirst(1)
        return calls, type(a.value).__name__, a.value.item(), b.value.item()

    theirs, ours = _both(run)
    assert ours == theirs == ([1], "ArrayImpl", 10, 1)


def test_custom_init_with_post_init_warns_in_both() -> None:
    for lib in (eqx, teqx):

        class Checked(lib.Module):
            ran: ClassVar[list[str]] = []

            def __post_init__(self) -> None:
                self.ran.append("post")

        with pytest.warns(UserWarning, match=r"`__init__` method and a\s+`__post_init__`"):

            class Custom(Checked):
                def __init__(self) -> None:
                    pass

        with pytest.warns(UserWarning, match=r"test_equinox_module\..*\.Inherits"):

            class Inherits(Custom):
                pass

        Custom(), Inherits()
        assert Checked.ran == []


def test_generated_init_keeps_inherited_docstring_and_converter_types() -> None:
    def as_int(x: int) -> str:
        return str(x)

    def untyped(x):  # type: ignore[no-untyped-def]
        return x

    def run(lib: ModuleType) -> Any:
        class Documented(lib.Module):
            pass

        Documented.__init__.__doc__ = "Build one."

        class Child(Documented):
            pass

        class Typed(lib.Module):
            a: str = lib.field(converter=as_int)
            b: Any = lib.field(converter=untyped)
            c: float = lib.field(converter=float)
            d: int = 0

        ann = Typed.__init__.__annotations__
        return Child.__init__.__doc__, ann["a"], ann["b"], ann["c"], ann["d"]

    theirs, ours = _both(run)
    assert ours == theirs == ("Build one.", int, Any, Any, int)


def test_field_metadata_is_what_the_user_gave() -> None:
    def run(lib: ModuleType) -> Any:
        class Tagged(lib.Module):
            plain: int
            tagged: int = lib.field(metadata={"unit": "m"})
            frozen: int = lib.field(static=True, metadata={"unit": "s"})
            flagged: int = lib.field(static=False, default=0)

        return [dict(f.metadata) for f in dataclasses.fields(Tagged)]

    theirs, ours = _both(run)
    assert ours == theirs == [{}, {"unit": "m"}, {"unit": "s", "static": True}, {}]
    for key in ("static", "converter"):
        for lib in (eqx, teqx):
            with pytest.raises(ValueError):
                lib.field(metadata={key: True})


@given(
    st.lists(
        st.tuples(st.booleans(), st.booleans()),  # (static, overridden by a property)
        min_size=1,
        max_size=5,
    )
)
def test_leaves_and_structure_agree_for_any_field_layout(spec: list[tuple[bool, bool]]) -> None:
    def run(lib: ModuleType) -> Any:
        base_ns: dict[str, Any] = {"__annotations__": {}}
        sub_ns: dict[str, Any] = {}
        for i, (static, overridden) in enumerate(spec):
            base_ns["__annotations__"][f"f{i}"] = int
            base_ns[f"f{i}"] = lib.field(static=static, init=not overridden, default=i)
            if overridden:
                sub_ns[f"f{i}"] = property(lambda self, i=i: -i)
        base = type(lib.Module)("Base", (lib.Module,), base_ns)
        sub = type(lib.Module)("Sub", (base,), sub_ns)
        model = sub()
        leaves, treedef = jtu.tree_flatten(model)
        again = jtu.tree_unflatten(treedef, leaves)
        values = [getattr(again, f"f{i}") for i in range(len(spec))]
        return leaves, treedef.num_leaves, values

    theirs, ours = _both(run)
    assert ours == theirs


# --- abstract attributes -------------------------------------------------------------------------


def test_abstract_declarations_agree() -> None:
    def run(lib: ModuleType) -> Any:
        class Root(lib.Module):
            a: lib.AbstractVar[int]
            c: lib.AbstractClassVar[int]

        class AnnotatedOnly(Root):  # bare annotations provide them in Equinox
            a: ClassVar[int]
            c: ClassVar[int]

        class CFromField(Root):
            c: int  # a field may provide an AbstractClassVar in Equinox

        class AToClassVar(Root):
            a: lib.AbstractClassVar[int]

        class Valued(Root):
            a = 1
            c = 2

        classes = (Root, AnnotatedOnly, CFromField, AToClassVar, Valued)
        sets = [(set(k.__abstractvars__), set(k.__abstractclassvars__)) for k in classes]
        return sets, CFromField.__abstractvars__, Valued().a

    theirs, ours = _both(run)
    assert ours == theirs


@pytest.mark.parametrize("case", ["unsubscripted", "unsubscripted_class", "valued", "string"])
def test_bad_abstract_declarations_raise_the_same_errors(case: str) -> None:
    def run(lib: ModuleType) -> Any:
        if case == "unsubscripted":

            class A(lib.Module):
                x: lib.AbstractVar

        elif case == "unsubscripted_class":

            class B(lib.Module):
                x: lib.AbstractClassVar

        elif case == "valued":

            class C(lib.Module):
                x: lib.AbstractVar[int] = 3

        else:

            class D(lib.Module):
                x: "AbstractVar[int]"  # noqa: F821

        return "created"

    theirs, ours = _both(run)
    assert ours == theirs
    assert ours in (TypeError, NotImplementedError)


@LIBS
def test_instantiating_abstract_names_the_kind(lib: ModuleType) -> None:
    class Codec(lib.Module):
        ext: lib.AbstractClassVar[str]

    class Shape(lib.Module):
        sides: lib.AbstractVar[int]

    with pytest.raises(TypeError, match="abstract class attributes"):
        Codec()
    with pytest.raises(TypeError, match="abstract attributes"):
        Shape()


# --- instances ------------------------------------------------------------------------------------


def test_generic_alias_sets_orig_class() -> None:
    def run(lib: ModuleType) -> Any:
        class Box(lib.Module, Generic[_T]):
            pass

        return Box[int]().__orig_class__ == Box[int]

    assert _both(run) == (True, True)


def test_bound_method_is_a_module_and_a_pytree() -> None:
    def run(lib: ModuleType) -> Any:
        class Adder(lib.Module):
            a: int

            def add(self, b: int) -> int:
                return self.a + b

        method = Adder(13).add
        leaves, treedef = jtu.tree_flatten(method)
        return isinstance(method, lib.Module), leaves, jtu.tree_unflatten(treedef, [20])(2)

    assert _both(run) == ((True, [13], 22), (True, [13], 22))


def test_repr_is_equinox_tree_pformat():
    # `print(model)` of a model as Equinox's MNIST example builds it: a list of layers and
    # jax.nn functions (relu is a custom_jvp, which Equinox prints as the function it wraps),
    # lines broken at 80 columns.
    def build(ns):
        class CNN(ns.Module):
            layers: list
            scale: float = 0.5

        keys = jax.random.split(jax.random.key(0), 2)
        return CNN(
            [
                ns.nn.Linear(512, 64, key=keys[0]),
                jax.nn.relu,
                jnp.ravel,
                ns.nn.Linear(64, 10, use_bias=False, key=keys[1]),
                jax.nn.log_softmax,
            ]
        )

    assert repr(build(teqx)) == repr(build(eqx))
    assert "<PjitFunction of <function relu" in repr(build(teqx))
