"""`treemod.debug.compile_report` against independent references: paths from the arguments'
structure, equation counts from `jax.make_jaxpr` of each module alone, reuse from the number of
identical layers, HLO characters from JAX's own lowering."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import treemod as tm
from treemod._compile_report.api import ONCE_MARKER


def count_eqns(jaxpr: Any) -> int:
    """Equations of a jaxpr, every nested jaxpr's included (the reference count)."""
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for value in eqn.params.values():
            for item in value if isinstance(value, tuple | list) else (value,):
                if hasattr(item, "eqns"):
                    n += count_eqns(item)
                elif hasattr(getattr(item, "jaxpr", None), "eqns"):
                    n += count_eqns(item.jaxpr)
    return n


def eqns_of(fn: Any, *args: Any) -> int:
    return count_eqns(jax.make_jaxpr(fn)(*args).jaxpr)


class Sine(tm.Module):
    scale: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.sin(x) * self.scale


class Block(tm.Module):
    lin: tm.nn.Linear
    act: Sine

    def __init__(self, key: jax.Array) -> None:
        self.lin = tm.nn.Linear(4, 4, key=key)
        self.act = Sine(jnp.ones(4))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.act(self.lin(x))

    def encode(self, x: jax.Array) -> jax.Array:
        return self.lin(x) * 2


class Net(tm.Module):
    blocks: list[Block]
    heads: dict[str, tm.nn.Linear]

    def __init__(self, key: jax.Array) -> None:
        keys = jax.random.split(key, 5)
        self.blocks = [Block(k) for k in keys[:3]]
        self.heads = {"a": tm.nn.Linear(4, 2, key=keys[3]), "b": tm.nn.Linear(4, 1, key=keys[4])}

    def __call__(self, x: jax.Array) -> jax.Array:
        for block in self.blocks:
            x = block(x)
        return self.heads["a"](x).sum() + self.heads["b"](x).sum()


@pytest.fixture(scope="module")
def net() -> Net:
    return Net(jax.random.key(0))


X = jnp.linspace(0.0, 1.0, 4)


def loss(model: Net, x: jax.Array) -> jax.Array:
    return model(x)


@pytest.fixture(scope="module")
def report(net: Net) -> tm.debug.CompileReport:
    return tm.debug.compile_report(loss, net, X)


def test_paths_are_the_key_paths_of_the_modules_under_their_parameter_names(
    report: tm.debug.CompileReport,
) -> None:
    expected = ["loss", "model"]
    for i in range(3):
        expected += [f"model.blocks[{i}]", f"model.blocks[{i}].lin", f"model.blocks[{i}].act"]
    expected += ["model.heads['a']", "model.heads['b']"]
    assert sorted(r.path for r in report.rows) == sorted(expected)
    assert report.rows[0].path == "loss" and report.rows[0].type_name == "function"
    assert report.row("model.blocks[1].act").type_name == "Sine"
    assert all(r.calls == 1 for r in report.rows)


def test_equations_per_path_equal_those_of_the_module_traced_alone(
    net: Net, report: tm.debug.CompileReport
) -> None:
    assert report.eqns == report.rows[0].eqns == eqns_of(loss, net, X)
    assert report.row("model").eqns == eqns_of(net, X)
    h = net.blocks[0](X)
    assert report.row("model.blocks[1]").eqns == eqns_of(net.blocks[1], h)
    assert report.row("model.blocks[1].lin").eqns == eqns_of(net.blocks[1].lin, h)
    assert report.row("model.blocks[1].act").eqns == eqns_of(net.blocks[1].act, h)
    assert report.row("model.heads['b']").eqns == eqns_of(net.heads["b"], h)
    # Exclusive counts partition the program: each equation counts toward one path.
    assert sum(r.self_eqns for r in report.rows) == report.eqns
    block = report.row("model.blocks[2]")
    assert block.self_eqns == block.eqns - eqns_of(net.blocks[2].lin, h) - eqns_of(
        net.blocks[2].act, h
    )


def test_identical_layers_share_one_traced_core(net: Net, report: tm.debug.CompileReport) -> None:
    cores = [p for p in report.programs if p.name == "Linear._flat"]
    # Three identical 4 -> 4 Linears share one program; the heads (4 -> 2, 4 -> 1) have their own.
    assert sorted(p.uses for p in cores) == [1, 1, 3]
    shared = next(p for p in cores if p.uses == 3)
    assert dict(shared.callers) == {f"model.blocks[{i}].lin": 1 for i in range(3)}
    assert shared.inputs == "f32[4,4] f32[4] f32[1,4]"
    core = jax.make_jaxpr(lambda x: net.blocks[0].lin(x))(X).jaxpr.eqns
    nested = next(e for e in core if "jaxpr" in e.params)
    assert shared.eqns == count_eqns(nested.params["jaxpr"].jaxpr)
    assert not shared.compiled_once


def test_stablehlo_characters_follow_the_locations(report: tm.debug.CompileReport) -> None:
    # Sine's one `sine` and one `multiply` line, as JAX lowers them for the module alone.
    sine = Sine(jnp.ones(4))
    alone = jax.jit(lambda x: sine(x)).lower(X).as_text()
    lines = [line for line in alone.splitlines() if "stablehlo.sine" in line or "multiply" in line]
    assert len(lines) == 2
    act = report.row("model.blocks[0].act")
    expected = sum(len(line) + 1 for line in lines)
    assert abs(act.self_hlo_chars - expected) <= 4  # value numbers (%0 / %12) differ in width
    assert sum(r.self_hlo_chars for r in report.rows) == report.rows[0].hlo_chars
    assert abs(report.rows[0].hlo_chars - report.hlo_chars) <= 0.02 * report.hlo_chars
    # The shared core is lowered once: its function counts toward the first Linear only.
    first, second = report.row("model.blocks[0].lin"), report.row("model.blocks[1].lin")
    assert first.hlo_chars > second.hlo_chars > 0
    assert report.hlo_functions == 1 + 3  # main and the three distinct Linear cores


def test_a_module_called_twice_and_a_method_other_than_call(net: Net) -> None:
    def twice(model: Net, x: jax.Array) -> jax.Array:
        b = model.blocks[0]
        return b(b(x)).sum() + model.blocks[1].encode(x).sum()

    report = tm.debug.compile_report(twice, net, X)
    assert report.row("model.blocks[0]").calls == 2
    assert report.row("model.blocks[0].lin").calls == 2
    assert report.row("model.blocks[0]").eqns == 2 * eqns_of(net.blocks[0], X)
    assert report.row("model.blocks[1]").calls == 1
    assert report.row("model.blocks[1]").eqns == eqns_of(net.blocks[1].encode, X)
    assert "model.blocks[2]" not in {r.path for r in report.rows}  # never called


def test_modules_in_lists_kwargs_and_built_inside_the_function(net: Net) -> None:
    def fn(layers: list[Any], x: jax.Array, *, head: tm.nn.Linear) -> jax.Array:
        inner = Sine(jnp.full(4, 2.0))  # built here: no path, counts toward the function
        return head(inner(layers[1](x))).sum()

    report = tm.debug.compile_report(fn, net.blocks, X, head=net.heads["a"])
    paths = {r.path for r in report.rows}
    assert paths == {"fn", "layers[1]", "layers[1].lin", "layers[1].act", "head"}
    root = report.rows[0]
    assert root.self_eqns == root.eqns - report.row("layers[1]").eqns - report.row("head").eqns
    assert root.self_eqns >= eqns_of(Sine(jnp.ones(4)), X)


def test_filter_jit_functions_modules_and_bound_methods_are_traced_alike(
    net: Net, report: tm.debug.CompileReport
) -> None:
    jitted = tm.debug.compile_report(tm.filter_jit(loss), net, X)
    assert [(r.path, r.eqns) for r in jitted.rows] == [(r.path, r.eqns) for r in report.rows]
    as_module = tm.debug.compile_report(net, X)
    assert as_module.row("self.blocks[2].act").eqns == report.row("model.blocks[2].act").eqns
    method = tm.debug.compile_report(net.blocks[0].encode, X)
    assert {r.path for r in method.rows} == {"Block.encode", "self.lin"}


def test_modules_rebuilt_by_grad_keep_their_paths(net: Net) -> None:
    def step(model: Net, x: jax.Array) -> Any:
        return tm.filter_grad(loss)(model, x)

    report = tm.debug.compile_report(step, net, X)
    assert report.row("model").calls == 1
    assert report.row("model.blocks[2].lin").calls == 1
    assert report.eqns == eqns_of(step, net, X)
    assert sum(r.self_eqns for r in report.rows) == report.eqns


def test_loops_compile_and_the_compile_once_marker() -> None:
    def once(x: jax.Array) -> jax.Array:
        return jnp.cos(x) * 3

    once.__name__ = once.__qualname__ = f"block_{ONCE_MARKER}"
    once_jit = jax.jit(once)

    class Looped(tm.Module):
        w: jax.Array

        def __call__(self, x: jax.Array) -> jax.Array:
            y, _ = jax.lax.scan(lambda c, _: (once_jit(c) * self.w, None), x, None, length=3)
            return once_jit(y)

    report = tm.debug.compile_report(lambda m, x: m(x).sum(), Looped(jnp.ones(4)), X, compile=True)
    assert report.scan_loops == 1
    assert report.compile_s is not None and isinstance(report.fusions, int)
    (program,) = report.programs
    assert program.compiled_once and program.uses == 2
    assert report.row("m").once_uses == 2
    assert "compiled once" in str(report)


def test_the_table_and_the_advice_for_repeated_layers(report: tm.debug.CompileReport) -> None:
    text = str(report)
    assert text.startswith("compile report of loss: trace ")
    for r in report.rows:
        assert r.path in text
    assert "Linear._flat" in text
    assert report.table(top=2).count("\nmodel") <= 2
    assert "... 11 more paths" in report.table(top=2)
    # The three identical blocks are the one repeat: advice names their pattern.
    assert any(a.startswith("model.blocks[*]: 3 Blocks") for a in report.advice)
    assert not any("heads" in a for a in report.advice)  # two heads of different shapes


def test_cold_traces_the_cores_again(net: Net, report: tm.debug.CompileReport) -> None:
    cold = tm.debug.compile_report(loss, net, X, cold=True)
    assert [(r.path, r.eqns) for r in cold.rows] == [(r.path, r.eqns) for r in report.rows]


def test_methods_are_restored_even_when_the_function_raises(net: Net) -> None:
    before = (Block.__call__, Block.encode, tm.nn.Linear.__call__)

    def bad(model: Net, x: jax.Array) -> jax.Array:
        model.blocks[0](x)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        tm.debug.compile_report(bad, net, X)
    assert (Block.__call__, Block.encode, tm.nn.Linear.__call__) == before
    assert "_flat" not in {k for k, v in vars(Block).items() if hasattr(v, "__wrapped__")}


def test_errors_name_what_is_wrong(report: tm.debug.CompileReport) -> None:
    with pytest.raises(TypeError, match=r"compile_report: `fn` must be callable.*int"):
        tm.debug.compile_report(3, X)  # type: ignore[arg-type]
    with pytest.raises(KeyError, match=r"compile report of loss: no row for 'model\.nope'"):
        report.row("model.nope")


def test_a_keyword_named_compile_goes_through_partial(net: Net) -> None:
    def fn(x: jax.Array, compile: int) -> jax.Array:
        return x * compile

    report = tm.debug.compile_report(functools.partial(fn, compile=2), X)
    assert report.eqns == 1 and report.compile_s is None


class _Twin(tm.Module):
    w: jax.Array

    @tm.compile_once
    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.tanh(x * self.w)


def test_rolled_compile_once_calls_count_as_the_loops_filter_jit_lowers() -> None:
    twins = [_Twin(jnp.full(3, float(i))) for i in range(4)]

    def f(ts: list[_Twin], x: jax.Array) -> jax.Array:
        return sum(t(x) for t in ts) + ts[0](ts[1](x))  # 5 side by side (ts[1](x) too), then 1

    x = jnp.ones(3)
    report = tm.debug.compile_report(f, twins, x)
    want = tm.filter_jit(f).lower(twins, x).as_text().count("stablehlo.while")
    assert report.scan_loops == want == 1  # the five side by side; the last call on its own
    (program,) = [p for p in report.programs if p.compiled_once]
    assert program.uses == 6


class Parallel(tm.Module):
    blocks: list[Block]

    def __init__(self, key: jax.Array) -> None:
        self.blocks = [Block(k) for k in jax.random.split(key, 4)]

    def __call__(self, x: jax.Array) -> jax.Array:
        return sum(block(x) for block in self.blocks)  # every block reads x: side by side


class Chain(Parallel):
    def __call__(self, x: jax.Array) -> jax.Array:
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize("differentiate", [False, True])
def test_compile_once_is_advised_for_blocks_side_by_side_not_for_a_chain(
    differentiate: bool,
) -> None:
    def step(model: Any, x: jax.Array) -> Any:
        if differentiate:
            return tm.filter_grad(lambda m, y: jnp.sum(m(y) ** 2))(model, x)
        return model(x)

    side = tm.debug.compile_report(step, Parallel(jax.random.key(1)), X).advice
    assert any("blocks[*]: 4 Blocks" in a and "tm.compile_once" in a for a in side), side
    assert not any("in a chain" in a for a in side)
    chain = tm.debug.compile_report(step, Chain(jax.random.key(1)), X).advice
    hint = next(a for a in chain if "blocks[*]: 4 Blocks" in a)
    assert "in a chain" in hint and "nn.Stack" in hint and "would not help" in hint
