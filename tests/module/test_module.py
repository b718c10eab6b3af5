"""The Module core: pytree registration, fields, construction protocol, equality, copying."""

import abc
import copy
import dataclasses
import functools
import pickle
from typing import ClassVar

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

import treemod as tm

# --- classes at module level so that pickle can find them -------------------------------------


class Linear(tm.Module):
    weight: jax.Array
    bias: jax.Array
    activation: object = tm.field(static=True, default=jax.nn.relu)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.activation(self.weight @ x + self.bias)


class Net(tm.Module):
    layers: list
    config: dict = tm.field(static=True, default_factory=dict)
    extra: object = None


class Counted(tm.Module):
    x: jax.Array
    inits = 0

    def __init__(self, x: jax.Array) -> None:
        type(self).inits += 1
        self.x = x


def _linear(n_in: int = 2, n_out: int = 3, seed: int = 0) -> Linear:
    weight = np.arange(n_out * n_in, dtype=np.float32).reshape(n_out, n_in) / 7 + seed
    return Linear(jnp.asarray(weight), jnp.arange(n_out, dtype=jnp.float32) - seed)


# --- 1. pytree with key paths; unflatten never calls __init__ -------------------------------------


def test_module_is_a_pytree_with_key_paths() -> None:
    net = Net([_linear(), _linear(seed=1)], {"depth": 2})
    paths = [jtu.keystr(p) for p, _ in jtu.tree_flatten_with_path(net)[0]]
    assert paths == [
        ".layers[0].weight",
        ".layers[0].bias",
        ".layers[1].weight",
        ".layers[1].bias",
    ]
    leaves, treedef = jtu.tree_flatten(net)
    rebuilt = jtu.tree_unflatten(treedef, leaves)
    assert type(rebuilt) is Net and rebuilt.config == {"depth": 2}
    assert all(a is b for a, b in zip(jtu.tree_leaves(rebuilt), leaves, strict=True))
    # flatten order is field order; the flatten fast path agrees with the keyed one
    assert jtu.tree_leaves(net) == [v for _, v in jtu.tree_leaves_with_path(net)]


def test_unflatten_never_calls_init() -> None:
    class Strict(tm.Module):
        x: jax.Array
        calls = 0

        def __init__(self, x: jax.Array) -> None:
            type(self).calls += 1
            if not isinstance(x, jax.Array):
                raise TypeError("x must be an array")
            self.x = x

        def __check_init__(self) -> None:
            type(self).checks = getattr(type(self), "checks", 0) + 1

    m = Strict(jnp.ones(2))
    assert Strict.calls == 1
    # tree_map puts non-arrays in the leaves; __init__ would raise if it ran
    strings = jtu.tree_map(lambda _: "not an array", m)
    assert strings.x == "not an array"
    jax.jit(lambda m: m)(m)
    jax.vmap(lambda m: m)(Strict(jnp.ones((3, 2))))
    assert jtu.tree_unflatten(jtu.tree_structure(m), [None]).x is None
    assert Strict.calls == 2 and Strict.checks == 2  # the two explicit constructions only


def test_unflattened_module_reads_like_a_constructed_one() -> None:
    lin = _linear()
    rebuilt = jtu.tree_map(lambda x: x, lin)
    assert vars(rebuilt).keys() == vars(lin).keys() == {"weight", "bias", "activation"}
    assert rebuilt.activation is jax.nn.relu
    assert type(lin).__getattribute__ is object.__getattribute__  # no attribute-read override


def test_field_names_that_shadow_generated_locals() -> None:
    class Odd(tm.Module):
        o: int
        children: int
        aux: int = tm.field(static=True)
        _c0: int = 4

    odd = Odd(1, 2, 3)
    back = jtu.tree_map(lambda x: x * 10, odd)
    assert (back.o, back.children, back.aux, back._c0) == (10, 20, 3, 40)


def test_empty_and_all_static_modules() -> None:
    class Empty(tm.Module):
        pass

    class OnlyStatic(tm.Module):
        n: int = tm.field(static=True)

    assert jtu.tree_leaves(Empty()) == [] and jtu.tree_map(lambda x: x, Empty()) == Empty()
    s = OnlyStatic(3)
    assert jtu.tree_leaves(s) == [] and jtu.tree_map(lambda x: x, s).n == 3


# --- 2. static fields ---------------------------------------------------------------------------


def test_equal_static_values_give_equal_treedefs() -> None:
    a = Net([], {"depth": 2, "width": [8, 8]})
    b = Net([], {"width": [8, 8], "depth": 2})  # equal by ==, different objects
    c = Net([], {"depth": 3})
    assert jtu.tree_structure(a) == jtu.tree_structure(b)
    assert jtu.tree_structure(a) != jtu.tree_structure(c)
    assert jtu.tree_structure(_linear()) != jtu.tree_structure(
        Linear(jnp.ones((3, 2)), jnp.ones(3), jax.nn.tanh)
    )


def test_plain_jit_accepts_modules_with_function_and_dict_static_fields() -> None:
    traces = []

    @jax.jit
    def apply(net: Net, x: jax.Array) -> jax.Array:
        traces.append(1)
        for layer in net.layers:
            x = layer(x) * net.config["scale"]
        return x

    lin = Linear(jnp.eye(2), jnp.zeros(2), jax.nn.relu)
    x = jnp.array([1.0, -2.0])
    out = apply(Net([lin], {"scale": 2.0}), x)
    np.testing.assert_allclose(out, np.array([2.0, 0.0]))
    apply(Net([lin], {"scale": 2.0}), x)  # equal (not identical) dict: cache hit
    assert len(traces) == 1
    out = apply(Net([lin], {"scale": 3.0}), x)  # different static value: retrace
    assert len(traces) == 2
    np.testing.assert_allclose(out, np.array([3.0, 0.0]))
    out = apply(Net([Linear(jnp.eye(2), jnp.zeros(2), jnp.abs)], {"scale": 1.0}), x)
    np.testing.assert_allclose(out, np.array([1.0, 2.0]))


def test_array_in_static_field_warns_naming_the_field() -> None:
    class Bad(tm.Module):
        table: object = tm.field(static=True)

    with pytest.warns(UserWarning, match=r"Bad\.table is a static field holding an array") as rec:
        Bad(jnp.zeros(3))
    assert rec[0].filename == __file__  # points at the construction site
    with pytest.warns(UserWarning, match=r"Bad\.table"):
        Bad(np.zeros(3))


def test_static_field_is_not_a_leaf_and_keeps_identity() -> None:
    fn = functools.partial(jnp.sum, axis=0)
    lin = Linear(jnp.ones((3, 2)), jnp.ones(3), fn)
    assert len(jtu.tree_leaves(lin)) == 2
    assert jtu.tree_map(lambda x: x + 1, lin).activation is fn


# --- 3. construction protocol -------------------------------------------------------------------


def test_converter_runs_after_generated_init_and_on_defaults() -> None:
    class Conv(tm.Module):
        x: jax.Array = tm.field(converter=jnp.asarray)
        y: jax.Array = tm.field(converter=jnp.asarray, default=2.0)

    c = Conv(1.0)
    assert isinstance(c.x, jax.Array) and isinstance(c.y, jax.Array)
    assert float(c.y) == 2.0


def test_converter_runs_after_custom_init() -> None:
    seen = []

    class Conv(tm.Module):
        x: tuple = tm.field(converter=tuple)

        def __init__(self, n: int) -> None:
            self.x = [n] * 2
            seen.append(type(self.x))  # inside __init__ the value is not converted yet

    assert Conv(3).x == (3, 3) and seen == [list]
    # unflatten does not convert (Equinox behaviour): leaves go in as they are
    assert jtu.tree_map(lambda v: str(v), Conv(1)).x == ("1", "1")


def test_check_init_runs_for_every_class_in_the_mro_once_in_mro_order() -> None:
    calls: list[str] = []

    class Base(tm.Module):
        x: int

        def __check_init__(self) -> None:
            calls.append("Base")

    class Mixin(tm.Module):
        def __check_init__(self) -> None:
            calls.append("Mixin")

    class Middle(Base):
        pass  # defines none: nothing to run, Base's is not run twice

    class Child(Middle, Mixin):
        def __check_init__(self) -> None:
            assert self.x == 1  # runs after init, with fields set
            calls.append("Child")

    Child(1)
    assert calls == ["Child", "Base", "Mixin"]
    calls.clear()
    Base(1)
    assert calls == ["Base"]


def test_check_init_errors_propagate() -> None:
    class Positive(tm.Module):
        x: int

        def __check_init__(self) -> None:
            if self.x <= 0:
                raise ValueError(f"Positive.x must be > 0, got {self.x}")

    with pytest.raises(ValueError, match=r"Positive\.x must be > 0, got -1"):
        Positive(-1)


def test_custom_init_is_inherited_by_subclasses() -> None:
    class Parent(tm.Module):
        x: int
        y: int

        def __init__(self, x: int) -> None:
            self.x = x
            self.y = 2 * x

    class Child(Parent):
        def double(self) -> int:
            return 2 * self.x

    class ChildWithField(Parent):
        z: int = 0

    assert (Child(3).x, Child(3).y, Child(3).double()) == (3, 6, 6)
    # also by a subclass that adds fields: they take their defaults (as in Equinox)
    c = ChildWithField(1)
    assert (c.x, c.y, c.z) == (1, 2, 0)

    class ChildWithRequiredField(Parent):
        z: int

    with pytest.raises(
        TypeError,
        match=r"'z' was not initialized: .*Parent\.__init__ did not set it on .*Required",
    ):
        ChildWithRequiredField(1)


def test_missing_field_error_names_class_and_field() -> None:
    class Half(tm.Module):
        a: int
        b: int

        def __init__(self) -> None:
            self.a = 1

    # A TypeError, as for a missing argument of a generated __init__ (and as in Equinox).
    with pytest.raises(TypeError, match=r"Field 'b' was not initialized: .*Half\.__init__"):
        Half()
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'bias'"):
        Linear(jnp.ones((2, 2)))  # type: ignore[call-arg]


def test_setting_after_init_raises_pointing_to_tree_at() -> None:
    lin = _linear()
    with pytest.raises(tm.FrozenModuleError, match=r"Cannot set Linear\.bias.*tree_at") as e:
        lin.bias = jnp.zeros(3)
    assert isinstance(e.value, dataclasses.FrozenInstanceError)
    assert isinstance(e.value, AttributeError)
    with pytest.raises(tm.FrozenModuleError, match=r"Linear has no field 'new_thing'"):
        lin.new_thing = 1
    with pytest.raises(tm.FrozenModuleError, match=r"Cannot delete Linear\.bias.*tree_at"):
        del lin.bias
    # also on a module rebuilt by unflatten
    with pytest.raises(tm.FrozenModuleError, match=r"Linear\.weight"):
        jtu.tree_map(lambda x: x, lin).weight = 0


def test_setting_an_undeclared_attribute_in_init_names_it() -> None:
    class Sloppy(tm.Module):
        x: int

        def __init__(self) -> None:
            self.x = 1
            self.y = 2

    with pytest.raises(AttributeError, match=r"Sloppy has no field 'y'.*Declare it"):
        Sloppy()


def test_failed_init_leaves_no_writable_object() -> None:
    escaped = []

    class Fails(tm.Module):
        x: int

        def __init__(self) -> None:
            escaped.append(self)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        Fails()
    with pytest.raises(tm.FrozenModuleError):
        escaped[0].x = 1


def test_dataclass_tools_work() -> None:
    lin = _linear()
    assert [f.name for f in dataclasses.fields(lin)] == ["weight", "bias", "activation"]
    assert dataclasses.is_dataclass(lin)
    lin2 = dataclasses.replace(lin, bias=jnp.zeros(3))
    assert lin2.weight is lin.weight and float(lin2.bias.sum()) == 0.0


def test_signature_of_a_module_class_is_its_init() -> None:
    import inspect

    assert list(inspect.signature(Counted).parameters) == ["x"]
    params = inspect.signature(Linear).parameters
    assert list(params) == ["weight", "bias", "activation"]
    assert params["activation"].default is jax.nn.relu
    # an instance reports its own __call__, as for any callable
    assert list(inspect.signature(_linear()).parameters) == ["x"]


# --- 4. attribute reads and bound methods -------------------------------------------------------


def test_bound_methods_work_and_see_the_instance() -> None:
    lin = Linear(jnp.eye(2), jnp.ones(2), jnp.negative)
    method = lin.__call__
    assert method.__self__ is lin
    np.testing.assert_allclose(method(jnp.ones(2)), -np.full(2, 2.0))


# --- 5. abstract modules ------------------------------------------------------------------------


class Shape(tm.Module):
    sides: tm.AbstractVar[int]
    name: "tm.AbstractVar[str]"  # a string, as with `from __future__ import annotations`

    @abc.abstractmethod
    def area(self) -> float: ...


def test_abstract_module_cannot_be_built_and_error_names_what_is_missing() -> None:
    with pytest.raises(TypeError, match=r"abstract module Shape.*name, sides.*area"):
        Shape()

    class NoName(Shape):
        sides: int = 3

        def area(self) -> float:
            return 1.0

    with pytest.raises(
        TypeError, match=r"NoName: it does not provide abstract attributes \(AbstractVar\) name\."
    ):
        NoName()


def test_abstract_vars_provided_as_field_class_attribute_or_property() -> None:
    class AsField(Shape):
        sides: int
        name: str = "field"

        def area(self) -> float:
            return 1.0

    class AsClassAttribute(Shape):
        sides = 4
        name = "attr"

        def area(self) -> float:
            return 2.0

    class AsProperty(Shape):
        n: int

        @property
        def sides(self) -> int:  # type: ignore[override]
            return self.n

        @property
        def name(self) -> str:  # type: ignore[override]
            return "prop"

        def area(self) -> float:
            return 3.0

    assert AsField(3).sides == 3 and AsField(3).name == "field"
    assert jtu.tree_leaves(AsField(3)) == [3, "field"]  # a field provided later is a leaf
    assert AsClassAttribute().sides == 4 and jtu.tree_leaves(AsClassAttribute()) == []
    assert AsProperty(5).sides == 5 and AsProperty(5).name == "prop"


def test_abstract_var_is_not_a_field_of_the_abstract_class() -> None:
    assert dataclasses.fields(Shape) == ()


def test_abstract_var_diamond_resolves_like_attribute_lookup() -> None:
    class Provider(tm.Module):
        sides: int = 6

    class Both(Provider, Shape):
        name: str = "both"

        def area(self) -> float:
            return 0.0

    assert Both().sides == 6


def test_abstract_var_under_future_annotations() -> None:
    namespace: dict = {}
    exec(
        "from __future__ import annotations\n"
        "import treemod as tm\n"
        "from treemod import AbstractVar\n"
        "class A(tm.Module):\n"
        "    x: AbstractVar[int]\n"
        "    y: tm.AbstractVar[list[int]]\n"
        "class B(A):\n"
        "    x: int\n"
        "    y: list = ()\n",
        namespace,
    )
    with pytest.raises(TypeError, match=r"A: it does not provide abstract attributes .* x, y"):
        namespace["A"]()
    assert namespace["B"](1).x == 1


class Codec(tm.Module):
    extension: tm.AbstractClassVar[str]


def test_abstract_class_var() -> None:
    class Json(Codec):
        extension: ClassVar[str] = ".json"

    class Plain(Codec):
        extension = ".txt"

    assert Json().extension == ".json" and Plain().extension == ".txt"
    assert jtu.tree_leaves(Json()) == [] and dataclasses.fields(Json) == ()
    with pytest.raises(TypeError, match=r"Codec: .*\(AbstractClassVar\) extension\."):
        Codec()

    class StillAbstract(Codec):
        pass

    with pytest.raises(TypeError, match=r"StillAbstract: .*\(AbstractClassVar\) extension"):
        StillAbstract()
    with pytest.raises(TypeError, match=r"AsField\.extension is declared as an AbstractClassVar"):

        class AsField(Codec):
            extension: str = ".bin"

    namespace: dict = {"__name__": __name__}  # dataclasses resolves "ClassVar" in this module
    exec(
        "from __future__ import annotations\n"
        "from typing import ClassVar\n"
        "import treemod as tm\n"
        "class A(tm.Module):\n"
        "    x: tm.AbstractClassVar[int]\n"
        "class B(A):\n"
        "    x: ClassVar[int] = 2\n",
        namespace,
    )
    assert namespace["B"]().x == 2
    with pytest.raises(TypeError, match=r"\(AbstractClassVar\) x"):
        namespace["A"]()


# --- 6. equality and hashing --------------------------------------------------------------------


def test_eq_is_tree_equal() -> None:
    a, b = _linear(), _linear()
    assert a == b and (a == b) is True
    assert a != _linear(seed=1)
    assert a != Linear(a.weight, a.bias, jax.nn.tanh)  # static functions compared by ==
    assert a != "not a module"
    assert Net([a], {"k": 1}) == Net([b], {"k": 1})
    assert Net([a], {"k": 1}) != Net([b], {"k": 2})
    c = Linear(a.weight.astype(jnp.float16), a.bias)
    assert a != c  # dtypes differ
    # inside jit the comparison of traced leaves is a traced boolean
    assert bool(jax.jit(lambda x, y: x == y)(a, b)) is True
    assert bool(jax.jit(lambda x, y: x == y)(a, _linear(seed=1))) is False


def test_static_functions_compare_by_equality() -> None:
    same = functools.partial(jnp.sum, axis=0)
    a = Linear(jnp.ones(1), jnp.ones(1), same)
    assert a == Linear(jnp.ones(1), jnp.ones(1), same)
    # partial objects are compared by identity, so an equal-looking new partial differs
    assert a != Linear(jnp.ones(1), jnp.ones(1), functools.partial(jnp.sum, axis=0))
    assert a != Linear(jnp.ones(1), jnp.ones(1), lambda x: x)


def test_hash_for_hashable_leaves() -> None:
    class Key(tm.Module):
        a: int
        b: tuple
        name: str = tm.field(static=True, default="k")
        cfg: dict = tm.field(static=True, default_factory=dict)

    k1, k2 = Key(1, (2, 3)), Key(1, (2, 3))
    assert hash(k1) == hash(k2)
    table = {k1: "value"}
    assert table[k2] == "value"
    assert Key(1, (2, 4)) not in table
    assert len({k1, k2, Key(1, (2, 3), "other")}) == 2
    assert hash(Key(1, (), cfg={"a": [1]})) == hash(Key(1, (), cfg={"a": [1]}))


def test_hash_error_names_the_leaf_path() -> None:
    net = Net([Linear(jnp.ones(1), jnp.ones(1))])
    with pytest.raises(
        TypeError, match=r"Net is not hashable: the leaf at Net\.layers\[0\]\.weight"
    ):
        hash(net)
    with pytest.raises(TypeError, match=r"leaf at Net\.extra is an unhashable builtins\.set"):
        hash(Net([], extra={1, 2}))


# --- 8. pickle and copy --------------------------------------------------------------------------


def test_pickle_round_trip() -> None:
    net = Net([_linear(), _linear(seed=1)], {"depth": 2}, extra=(1, "a"))
    back = pickle.loads(pickle.dumps(net))
    assert back == net and type(back) is Net
    assert back.layers[0].activation is jax.nn.relu
    with pytest.raises(tm.FrozenModuleError):
        back.extra = 0
    c = Counted(jnp.ones(1))
    before = Counted.inits
    pickle.loads(pickle.dumps(c))
    assert Counted.inits == before


def test_pickle_jax_wrapped_functions_in_fields() -> None:
    # jax.nn.relu (custom_jvp) and jnp.tanh (jitted) cannot be pickled on their own
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(jax.nn.relu)
    lin = Linear(jnp.eye(2), jnp.ones(2), jnp.tanh)
    back = pickle.loads(pickle.dumps(_linear()))
    assert back.activation is jax.nn.relu and back == _linear()
    back = pickle.loads(pickle.dumps(lin))
    assert back.activation is jnp.tanh and back == lin
    np.testing.assert_allclose(back(jnp.ones(2)), lin(jnp.ones(2)))


def test_copy_and_deepcopy() -> None:
    net = Net([_linear()], {"depth": 1})
    shallow = copy.copy(net)
    assert shallow == net and shallow is not net and shallow.layers is net.layers
    deep = copy.deepcopy(net)
    assert deep == net and deep.layers is not net.layers
    assert deep.layers[0].weight is not net.layers[0].weight
    assert deep.config is net.config  # static configuration is shared, not copied
    with pytest.raises(tm.FrozenModuleError):
        deep.config = {}
    c = Counted(jnp.ones(1))
    before = Counted.inits
    copy.copy(c), copy.deepcopy(c)
    assert Counted.inits == before


# --- 9. building modules inside transforms -------------------------------------------------------


def test_build_inside_jit_vmap_and_scan() -> None:
    def make(key: jax.Array) -> Linear:
        return Linear(jnp.full((3, 2), key), jnp.zeros(3))

    key = jnp.float32(0.5)
    jitted = jax.jit(make)(key)
    assert jitted == make(key)

    keys = jnp.arange(4, dtype=jnp.float32)
    batched = jax.vmap(make)(keys)
    assert batched.weight.shape == (4, 3, 2)
    np.testing.assert_allclose(batched.weight[2], make(keys[2]).weight, rtol=1e-6)

    def step(carry: Linear, k: jax.Array) -> tuple[Linear, Linear]:
        new = make(k)
        return Linear(carry.weight + new.weight, carry.bias), new

    init = Linear(jnp.zeros((3, 2)), jnp.zeros(3))
    total, stacked = jax.lax.scan(step, init, keys)
    assert stacked.weight.shape == (4, 3, 2)
    np.testing.assert_allclose(total.weight, stacked.weight.sum(0), rtol=1e-5)


def test_converter_and_check_init_run_under_jit() -> None:
    class Pos(tm.Module):
        x: jax.Array = tm.field(converter=jnp.abs)

        def __check_init__(self) -> None:
            assert self.x.shape == (2,)

    out = jax.jit(lambda v: Pos(v))(jnp.array([-1.0, 2.0]))
    np.testing.assert_allclose(out.x, np.array([1.0, 2.0]))
