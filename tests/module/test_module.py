"""The Module core: pytree registration, static fields, the construction protocol, bound methods."""

import dataclasses
import functools

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
