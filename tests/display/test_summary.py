"""`tm.summary`: counts against hand arithmetic, FLOPs against XLA's analysis of plain JAX."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import treemod as tm
import treemod.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from digits_cnn import CNN  # noqa: E402


def _xla_flops(fn, *args, compiled: bool = False) -> float:  # type: ignore[no-untyped-def]
    lowered = jax.jit(fn).lower(*args)
    analysis = lowered.compile().cost_analysis() if compiled else lowered.cost_analysis()
    return float(analysis["flops"])


@pytest.mark.parametrize("flops", ["lowered", "compiled"])
def test_mlp_counts_shapes_and_flops_match_plain_jax(flops: str) -> None:
    mlp = nn.MLP(4, 2, 8, 1, key=jax.random.key(0))
    x = jnp.ones((3, 4))
    s = tm.summary(mlp, x, flops=flops)  # type: ignore[arg-type]
    compiled = flops == "compiled"
    rows = {r.path: r for r in s.rows}
    assert list(rows) == ["(root)", ".layers[0]", ".layers[1]"]
    assert (rows[".layers[0]"].params, rows[".layers[1]"].params) == (4 * 8 + 8, 8 * 2 + 2)
    assert rows["(root)"].params == 58 and rows["(root)"].bytes == 58 * 4
    assert rows[".layers[0]"].outputs == "f32[3,8]" and rows["(root)"].outputs == "f32[3,2]"
    w0, b0 = mlp.layers[0].weight, mlp.layers[0].bias
    w1, b1 = mlp.layers[1].weight, mlp.layers[1].bias

    def plain(x, w0, b0, w1, b1):  # type: ignore[no-untyped-def]
        return jax.nn.relu(x @ w0.T + b0[None]) @ w1.T + b1[None]

    assert s.flops == _xla_flops(plain, x, w0, b0, w1, b1, compiled=compiled)
    first = _xla_flops(lambda x, w, b: x @ w.T + b[None], x, w0, b0, compiled=compiled)
    assert rows[".layers[0]"].flops == first


def test_flops_none_leaves_them_out_and_a_bad_value_is_named() -> None:
    mlp = nn.MLP(4, 2, 8, 1, key=jax.random.key(0))
    s = tm.summary(mlp, jnp.ones((3, 4)), flops=None)
    assert s.flops is None and all(r.flops is None for r in s.rows)
    assert str(s).splitlines()[-1].rstrip().endswith("-")
    with pytest.raises(ValueError, match="summary: flops must be 'lowered', 'compiled' or None"):
        tm.summary(mlp, jnp.ones((3, 4)), flops="fast")  # type: ignore[arg-type]


def test_digits_cnn_counts_match_the_demo_table() -> None:
    model = CNN(key=jax.random.key(0), width=8)
    s = tm.summary(model, jax.ShapeDtypeStruct((2, 1, 8, 8), jnp.float32), key=jax.random.key(1))
    rows = {r.path: r for r in s.rows}
    conv1, conv2, head = 1 * 8 * 9 + 8, 8 * 16 * 9 + 16, 16 * 16 * 10 + 10
    assert rows[".conv1"].params == conv1 and rows[".conv2"].params == conv2
    assert rows[".head"].params == head
    assert (rows[".norm1"].params, rows[".norm1"].state) == (16, 16)  # scale+bias, mean+var
    assert rows["(root)"].params == conv1 + conv2 + head + 16 + 32
    assert rows["(root)"].state == 16 + 32
    assert rows[".conv2"].outputs == "f32[2,16,4,4]" and rows["(root)"].outputs == "f32[2,10]"
    assert not any(p.endswith("running_mean") for p in rows)  # State boxes are not modules rows
    # The demo prints tm.tree_summary(model): the same numbers per top-level module.
    demo = {line.split()[0]: line.split()[2:] for line in tm.tree_summary(model).splitlines()[1:-1]}
    for path, (params, state, nbytes) in demo.items():
        assert (rows[path].params, rows[path].state, rows[path].bytes) == (
            int(params),
            int(state),
            int(nbytes),
        )


def test_text_and_html_tables_and_model_unchanged() -> None:
    mlp = nn.MLP(4, 2, 8, 1, key=jax.random.key(0))
    before = dict(nn.Linear.__dict__), dict(nn.MLP.__dict__)
    s = tm.summary(mlp, jnp.ones((3, 4)))
    assert (dict(nn.Linear.__dict__), dict(nn.MLP.__dict__)) == before
    text = str(s)
    assert text.splitlines()[0].split() == [
        "path",
        "type",
        "outputs",
        "params",
        "state",
        "bytes",
        "FLOPs",
    ]
    assert text.splitlines()[-1].split()[:4] == ["total", "58", "0", "232"]
    page = s._repr_html_()
    assert page.startswith("<table>") and "<td>.layers[0]</td>" in page and "<td>58</td>" in page


def test_stack_row_and_uncalled_layers() -> None:
    stack = nn.Stack(lambda k: nn.Linear(4, 4, key=k), 3, key=jax.random.key(0))
    s = tm.summary(stack, jnp.ones((2, 4)))
    rows = {r.path: r for r in s.rows}
    assert rows["(root)"].params == 3 * (16 + 4) and rows["(root)"].outputs == "f32[2,4]"
    assert rows[".layers"].flops is None and rows[".layers"].outputs == "-"  # run inside scan


def test_not_a_module_is_an_error_naming_the_type() -> None:
    with pytest.raises(TypeError, match="summary: expected a treemod Module, got function"):
        tm.summary(lambda x: x, jnp.ones(2))


def test_a_failing_call_leaves_the_classes_unchanged() -> None:
    mlp = nn.MLP(4, 2, 8, 1, key=jax.random.key(0))
    before = dict(nn.Linear.__dict__), dict(nn.MLP.__dict__)
    with pytest.raises(ValueError, match="Linear"):
        tm.summary(mlp, jnp.ones((3, 5)))  # 5 features where the first layer takes 4
    assert (dict(nn.Linear.__dict__), dict(nn.MLP.__dict__)) == before
