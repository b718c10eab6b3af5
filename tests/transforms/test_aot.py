"""save_compiled / load_compiled: a compiled step run in a new process without tracing, and
every refusal naming what differs."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm

# The step lives in an importable module (static values and classes are saved by name).
_STEP_MODULE = """
import jax, jax.numpy as jnp
import treemod as tm

TRACES = []


class Affine(tm.Module):
    weight: jax.Array
    bias: jax.Array
    activation: str = tm.field(static=True, default="tanh")

    def __call__(self, x):
        return getattr(jnp, self.activation)(x @ self.weight.T + self.bias[None, :])


def step(model, x, y, lr):
    TRACES.append(1)

    def loss(m):
        return jnp.mean((m(x) - y) ** 2)

    value, grads = tm.filter_value_and_grad(loss)(model)
    model = jax.tree_util.tree_map(lambda p, g: p - lr * g, model, grads)
    return model, value, "done"
"""


@pytest.fixture
def step_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    (tmp_path / "aot_step_module.py").write_text(_STEP_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("aot_step_module", None)
    import aot_step_module

    yield aot_step_module
    sys.modules.pop("aot_step_module", None)


def _inputs(module: Any) -> tuple[Any, ...]:
    kw, kb, kx, ky = jax.random.split(jax.random.key(0), 4)
    model = module.Affine(jax.random.normal(kw, (3, 4)), jax.random.normal(kb, (3,)))
    return model, jax.random.normal(kx, (5, 4)), jax.random.normal(ky, (5, 3)), 0.1


def _reference(model: Any, x: Any, y: Any, lr: float) -> tuple[np.ndarray, np.ndarray, float]:
    """The same SGD step in plain JAX on arrays (independent of treemod)."""
    w, b = jnp.asarray(model.weight), jnp.asarray(model.bias)

    def loss(w: Any, b: Any) -> Any:
        return jnp.mean((jnp.tanh(x @ w.T + b[None, :]) - y) ** 2)

    value, (gw, gb) = jax.value_and_grad(loss, argnums=(0, 1))(w, b)
    return np.asarray(w - lr * gw), np.asarray(b - lr * gb), float(value)


def _save(module: Any, path: Path, *args: Any, compile: bool = True) -> Path:
    lowered = tm.filter_jit(module.step).lower(*args)
    return tm.save_compiled(path, lowered.compile() if compile else lowered)


@pytest.mark.heavy
def test_round_trip_in_a_new_process_without_tracing(step_module: Any, tmp_path: Path) -> None:
    args = _inputs(step_module)
    path = _save(step_module, tmp_path / "step.jaxexe", *args, compile=False)
    child = textwrap.dedent(
        """
        import json, sys
        import jax, treemod as tm
        sys.path.insert(0, sys.argv[2])
        import aot_step_module as m
        kw, kb, kx, ky = jax.random.split(jax.random.key(0), 4)
        model = m.Affine(jax.random.normal(kw, (3, 4)), jax.random.normal(kb, (3,)))
        x, y = jax.random.normal(kx, (5, 4)), jax.random.normal(ky, (5, 3))
        step = tm.load_compiled(sys.argv[1])
        new, value, tag = step(model, x, y, 0.1)
        print(json.dumps({"traces": len(m.TRACES), "w": new.weight.tolist(),
                          "b": new.bias.tolist(), "value": float(value), "tag": tag,
                          "type": type(new).__name__}))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", child, str(path), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ},
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    w, b, value = _reference(*args)
    assert result["traces"] == 0  # the step ran without being traced
    assert result["tag"] == "done" and result["type"] == "Affine"
    np.testing.assert_allclose(result["w"], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result["b"], b, rtol=1e-5, atol=1e-6)
    assert result["value"] == pytest.approx(value, rel=1e-5)


def test_loaded_step_in_process(step_module: Any, tmp_path: Path) -> None:
    args = _inputs(step_module)
    step = tm.load_compiled(_save(step_module, tmp_path / "s.jaxexe", *args))
    traces = len(step_module.TRACES)
    new, value, _ = step(*args)
    assert len(step_module.TRACES) == traces
    w, b, expected = _reference(*args)
    np.testing.assert_allclose(np.asarray(new.weight), w, rtol=1e-5, atol=1e-6)
    assert float(value) == pytest.approx(expected, rel=1e-5)


def test_a_lowered_step_is_compiled_to_load_fast() -> None:
    """Given `.lower(...)`, save_compiled compiles without YNNPACK fusions on the CPU, which
    plain `jax.jit` uses by default for a dot of this size; `.compile()` is saved as it is."""
    if jax.devices()[0].platform != "cpu":
        pytest.skip("YNNPACK fusions are XLA:CPU's")

    def layer(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w.T)

    w, x = jax.random.normal(jax.random.key(0), (64, 64)), jnp.ones((8, 64))
    assert "__ynn_fusion" in jax.jit(layer).lower(w, x).compile().as_text()
    with tempfile.TemporaryDirectory() as tmp:
        lowered = tm.filter_jit(layer).lower(w, x)
        fast = tm.load_compiled(tm.save_compiled(Path(tmp) / "fast.jaxexe", lowered))
        as_is = tm.load_compiled(tm.save_compiled(Path(tmp) / "as_is", lowered.compile()))
        assert "__ynn_fusion" not in fast._executable.as_text()
        assert "__ynn_fusion" in as_is._executable.as_text()
        expected = np.tanh(np.asarray(x) @ np.asarray(w).T)
        np.testing.assert_allclose(fast(w, x), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m, x, y, lr: (m, x[:4], y, lr), r"args\[1\]: f32\[5,4\] -> f32\[4,4\]"),
        (
            lambda m, x, y, lr: (m, x.astype(jnp.float16), y, lr),
            r"args\[1\]: f32\[5,4\] -> f16\[5,4\]",
        ),
        (lambda m, x, y, lr: (m, x, y, 0.2), r"args\[3\]: static value 0.1 -> 0.2"),
        (lambda m, x, y, lr: (m, x, y, -0.0), r"args\[3\]: static value 0.1 -> -0.0"),
        (
            lambda m, x, y, lr: (type(m)(m.weight, m.bias, "sin"), x, y, lr),
            r"args\[0\]\.activation: static field Affine\.activation 'tanh' -> 'sin'",
        ),
        (lambda m, x, y, lr: (m, [x], y, lr), r"tree structure changed: args\[1\]"),
    ],
)
def test_refuses_other_arguments_naming_the_path(
    step_module: Any, tmp_path: Path, change: Any, message: str
) -> None:
    args = _inputs(step_module)
    step = tm.load_compiled(_save(step_module, tmp_path / "s.jaxexe", *args))
    with pytest.raises(TypeError, match=r"s\.jaxexe.*step.*compiled for other arguments") as e:
        step(*change(*args))
    assert e.match(message)


def test_refuses_another_sharding(step_module: Any, tmp_path: Path) -> None:
    args = _inputs(step_module)
    step = tm.load_compiled(_save(step_module, tmp_path / "s.jaxexe", *args))
    model, x, y, lr = args
    elsewhere = jax.device_put(x, jax.devices()[1])
    with pytest.raises(ValueError, match=r"args\[1\] has sharding .*compiled for"):
        step(model, elsewhere, y, lr)


def _tampered(path: Path, **changes: Any) -> Path:
    record = pickle.loads(path.read_bytes())
    record.update(changes)
    out = path.with_name("tampered.jaxexe")
    out.write_bytes(pickle.dumps(record))
    return out


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"jax": "0.0.1"}, r"compiled for jax '0.0.1', but this process has"),
        ({"jaxlib": "0.0.1"}, r"compiled for jaxlib '0.0.1'"),
        ({"platform": "tpu"}, r"compiled for platform 'tpu', but this process has 'cpu'"),
        ({"device_kind": "H100"}, r"compiled for device_kind 'H100'"),
        ({"devices": [4096]}, r"no device with id \[4096\]"),
    ],
)
def test_refuses_another_environment(
    step_module: Any, tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    path = _save(step_module, tmp_path / "s.jaxexe", *_inputs(step_module))
    with pytest.raises(RuntimeError, match=message):
        tm.load_compiled(_tampered(path, **changes))


def test_refuses_other_files_and_versions(step_module: Any, tmp_path: Path) -> None:
    path = _save(step_module, tmp_path / "s.jaxexe", *_inputs(step_module))
    with pytest.raises(ValueError, match=r"tampered.jaxexe has format version 99"):
        tm.load_compiled(_tampered(path, version=99))
    junk = tmp_path / "junk.jaxexe"
    junk.write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=r"junk.jaxexe is not a step saved by"):
        tm.load_compiled(junk)
    other = tmp_path / "other.jaxexe"
    other.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(ValueError, match=r"other.jaxexe is not a step saved by"):
        tm.load_compiled(other)


def test_save_refuses_what_it_cannot_save(step_module: Any, tmp_path: Path) -> None:
    model, x, y, lr = _inputs(step_module)
    bound = tm.filter_jit(model).lower(x).compile()
    with pytest.raises(TypeError, match=r"holds arrays of its own"):
        tm.save_compiled(tmp_path / "m.jaxexe", bound)
    with pytest.raises(TypeError, match=r"Affine.*holds arrays of its own"):
        tm.save_compiled(tmp_path / "m.jaxexe", tm.filter_jit(model).lower(x))
    local = tm.filter_jit(lambda x, f: f(x)).lower(x, lambda v: v * 2).compile()
    with pytest.raises(TypeError, match=r"static value .* at args\[1\] cannot be saved"):
        tm.save_compiled(tmp_path / "l.jaxexe", local)
    with pytest.raises(TypeError, match=r"save_compiled expects"):
        tm.save_compiled(tmp_path / "x.jaxexe", tm.filter_jit(step_module.step))
    assert not list(tmp_path.glob("*.jaxexe")) and not list(tmp_path.glob(".*tmp*"))
