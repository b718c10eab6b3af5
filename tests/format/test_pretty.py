"""tree_pformat / repr and tree_summary."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm


class Linear(tm.Module):
    weight: jax.Array
    bias: jax.Array
    activation: object = tm.field(static=True, default=None)


class Block(tm.Module):
    linear: Linear
    scales: list


class Net(tm.Module):
    blocks: list
    head: Linear
    table: dict


def _double(x: jax.Array) -> jax.Array:
    return 2 * x


def _net(n_blocks: int = 3) -> Net:
    blocks = [
        Block(Linear(jnp.zeros((4, 4)), jnp.zeros(4)), [jnp.ones(4), jnp.ones(4)])
        for _ in range(n_blocks)
    ]
    head = Linear(jnp.zeros((1, 4), jnp.bfloat16), jnp.zeros(1, jnp.bfloat16))
    return Net(blocks, head, {"ids": jnp.zeros(3, jnp.int8), "tag": "x"})


# --- repr / tree_pformat --------------------------------------------------------------------------


def test_repr_shows_arrays_as_dtype_and_shape() -> None:
    lin = Linear(jnp.zeros((64, 32)), jnp.zeros(64, jnp.int32))
    assert repr(lin) == "Linear(weight=f32[64,32], bias=i32[64])"
    assert repr(Linear(np.zeros((2,)), jnp.zeros((), jnp.bool_))) == (
        "Linear(weight=f64[2], bias=bool[])"
    )
    assert tm.tree_pformat(jax.ShapeDtypeStruct((3, 1), jnp.float16)) == "f16[3,1]"


def test_repr_shows_non_default_static_fields_and_hides_defaults() -> None:
    assert "activation" not in repr(Linear(jnp.zeros(1), jnp.zeros(1)))
    assert "activation=<function _double>" in repr(Linear(jnp.zeros(1), jnp.zeros(1), _double))


def test_nesting_is_indented() -> None:
    text = repr(_net(2))
    assert text == (
        "Net(\n"
        "  blocks=[\n"
        "    Block(linear=Linear(weight=f32[4,4], bias=f32[4]), scales=[f32[4], f32[4]]),\n"
        "    Block(linear=Linear(weight=f32[4,4], bias=f32[4]), scales=[f32[4], f32[4]])\n"
        "  ],\n"
        "  head=Linear(weight=bf16[1,4], bias=bf16[1]),\n"
        "  table={'ids': i8[3], 'tag': 'x'}\n"
        ")"
    )
    assert tm.tree_pformat(_net(2), width=400).count("\n") == 0
    assert "\n    blocks=" in tm.tree_pformat(_net(2), indent=4)


def test_long_containers_stay_bounded() -> None:
    many = Net([Linear(jnp.zeros(2), jnp.zeros(2)) for _ in range(1000)], Linear(1, 2), {})
    text = repr(many)
    assert "... 990 more ..." in text
    assert text.count("Linear(") == 11  # 10 shown + the head
    assert len(text.splitlines()) < 20
    big_dict = {f"k{i}": i for i in range(500)}
    text = tm.tree_pformat(big_dict, max_items=5)
    assert text == "{'k0': 0, 'k1': 1, 'k2': 2, ... 497 more ...}"
    assert tm.tree_pformat(tuple(range(20)), max_items=4) == "(0, 1, ... 18 more ...)"
    assert tm.tree_pformat(list(range(12))) == repr(list(range(12)))  # at the limit: all shown


def test_tree_pformat_long_arrays() -> None:
    text = tm.tree_pformat({"a": jnp.arange(3)}, short_arrays=False)
    assert text == "{'a': Array([0, 1, 2], dtype=int32)}"
    assert tm.tree_pformat(jax.ShapeDtypeStruct((2,), jnp.float32), short_arrays=False) == "f32[2]"


def test_tree_pformat_rejects_tiny_max_items() -> None:
    with pytest.raises(ValueError, match="max_items must be at least 3, got 2"):
        tm.tree_pformat([1], max_items=2)


def test_repr_of_traced_module() -> None:
    seen = []
    jax.jit(lambda m: seen.append(repr(m)))(Linear(jnp.zeros((2, 3)), jnp.zeros(2)))
    assert seen == ["Linear(weight=f32[2,3], bias=f32[2])"]


# --- tree_summary ---------------------------------------------------------------------------------


def _table(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_summary_groups_by_top_level_field_and_list_items() -> None:
    net = _net()
    rows = _table(tm.tree_summary(net))
    assert rows[0] == ["path", "type", "params", "bytes"]
    # by hand: a block is 4*4 + 4 + 4 + 4 float32 = 28 params, 112 bytes
    assert rows[1:4] == [[f".blocks[{i}]", "Block", "28", "112"] for i in range(3)]
    assert rows[4] == [".head", "Linear", "5", "10"]  # bfloat16: 2 bytes each
    assert rows[5] == [".table", "dict[2]", "3", "3"]
    assert rows[6] == ["total", str(3 * 28 + 5 + 3), str(3 * 112 + 10 + 3)]


def test_summary_totals_match_a_numpy_count() -> None:
    net = _net()
    leaves = [x for x in jax.tree_util.tree_leaves(net) if tm.is_array(x)]
    n = sum(int(np.prod(x.shape)) for x in leaves)
    b = sum(np.asarray(x).nbytes for x in leaves)
    for depth in (0, 1, 2, 3, None):
        assert _table(tm.tree_summary(net, depth=depth))[-1] == ["total", str(n), str(b)]


def test_summary_depths() -> None:
    net = _net(1)
    assert _table(tm.tree_summary(net, depth=0))[1] == ["(root)", "Net", "36", "125"]
    rows = _table(tm.tree_summary(net, depth=2))
    assert [r[0] for r in rows[1:-1]] == [
        ".blocks[0].linear",
        ".blocks[0].scales",
        ".head.weight",
        ".head.bias",
        ".table['ids']",
    ]
    rows = _table(tm.tree_summary(net, depth=None))
    assert [r[0] for r in rows[1:4]] == [
        ".blocks[0].linear.weight",
        ".blocks[0].linear.bias",
        ".blocks[0].scales[0]",
    ]
    assert rows[1][1] == "f32[4,4]"
    with pytest.raises(ValueError, match="depth must be >= 0 or None, got -1"):
        tm.tree_summary(net, depth=-1)


def test_summary_of_a_list_of_layers_plain_arrays_and_shapes() -> None:
    layers = [Linear(jnp.zeros((3, 2)), jnp.zeros(3)), Linear(jnp.zeros((1, 3)), jnp.zeros(1))]
    rows = _table(tm.tree_summary(layers))
    assert rows[1:] == [
        ["[0]", "Linear", "9", "36"],
        ["[1]", "Linear", "4", "16"],
        ["total", "13", "52"],
    ]
    assert _table(tm.tree_summary(jnp.zeros(3)))[1] == ["(root)", "f32[3]", "3", "12"]
    shapes = jax.eval_shape(lambda: layers)
    assert tm.tree_summary(shapes) == tm.tree_summary(layers)


def test_summary_lists_modules_without_parameters() -> None:
    class Activation(tm.Module):
        fn: object = tm.field(static=True, default=None)

    class Seq(tm.Module):
        layers: list

    rows = _table(tm.tree_summary(Seq([Linear(jnp.zeros(2), jnp.zeros(2)), Activation()])))
    assert rows[1:3] == [
        [".layers[0]", "Linear", "4", "16"],
        [".layers[1]", "Activation", "0", "0"],
    ]


def test_summary_shows_parameters_and_state_apart() -> None:
    # BatchNorm(16): weight and bias are parameters; the running mean and variance are State.
    model = tm.nn.Sequential([tm.nn.Linear(3, 16, key=jax.random.key(0)), tm.nn.BatchNorm(16)])
    rows = _table(tm.tree_summary(model))
    assert rows[0] == ["path", "type", "params", "state", "bytes"]
    assert rows[1] == [".layers[0]", "Linear", "64", "0", "256"]
    assert rows[2] == [".layers[1]", "BatchNorm", "32", "32", "256"]
    # The reference: tm.is_param's leaves, and the leaves under tm.State nodes.
    params = jax.tree_util.tree_leaves(tm.filter(model, tm.is_param))
    states = jax.tree_util.tree_leaves(
        [x for x in jax.tree_util.tree_leaves(model, is_leaf=tm.is_state) if tm.is_state(x)]
    )
    n_params, n_state = sum(x.size for x in params), sum(x.size for x in states)
    assert rows[-1] == ["total", str(n_params), str(n_state), str(4 * (n_params + n_state))]
    # One row per array: the statistics' rows stay in the state column.
    rows = _table(tm.tree_summary(model, depth=None))
    assert [".layers[1].running_var.value", "f32[16]", "0", "16", "64"] in rows
    assert [".layers[1].weight", "f32[16]", "16", "0", "64"] in rows
    # A State at the root, and an abstract model, count the same way.
    assert _table(tm.tree_summary(tm.State(jnp.zeros(3))))[1] == [
        ".value",
        "f32[3]",
        "0",
        "3",
        "12",
    ]
    assert tm.tree_summary(jax.eval_shape(lambda: model)) == tm.tree_summary(model)


def test_tree_pprint_prints_tree_pformat(capsys) -> None:
    tree = {"layers": [jnp.zeros((2, 3))] * 20, "act": "relu"}
    tm.tree_pprint(tree, max_items=4, width=40)
    assert capsys.readouterr().out == tm.tree_pformat(tree, max_items=4, width=40) + "\n"
